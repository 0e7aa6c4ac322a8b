//! The network floor: TLS, the HTTPS fetcher (retries, deadlines, verify-while-streaming) and the
//! Kubernetes API client (kubeconfig as kubectl reads it, node-name rules). Uses `node` and
//! `crypto`.

pub(crate) mod boot_check;
pub mod cluster;
pub(crate) mod events;
pub mod fetch;
pub mod handover;
pub mod join_config;
pub(crate) mod kube;
pub mod kubeconfig;
pub(crate) mod mirrors;
pub(crate) mod names;
pub(crate) mod node_report;
pub(crate) mod nodeinfo;
pub(crate) mod oci;
pub mod retry;
pub(crate) mod tls;
pub(crate) mod toml;
