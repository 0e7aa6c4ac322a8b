//! The network floor: TLS, the HTTPS fetcher (retries, deadlines, verify-while-streaming) and the
//! Kubernetes API client (kubeconfig as kubectl reads it, node-name rules). Uses `node` and
//! `crypto`.

pub(crate) mod boot_check;
pub mod cluster;
pub mod events;
pub mod fetch;
pub mod handover;
pub mod join_config;
pub mod kube;
pub mod kubeconfig;
pub mod mirrors;
pub mod names;
pub mod node_report;
pub mod nodeinfo;
pub mod oci;
pub mod retry;
pub mod tls;
pub mod toml;
