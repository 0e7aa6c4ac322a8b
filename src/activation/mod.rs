//! A fresh node initializes or joins a cluster: `activate` runs the init/join race under a
//! one-way node lock, `join-service` hands join tickets to nodes that authenticate, and
//! `init-cluster` asks a waiting node to initialize. Contracts: docs/activate.md,
//! docs/join-service.md, docs/init-cluster.md.

pub mod activate;
pub mod appointments;
pub mod exchange;
pub(crate) mod images;
pub mod init_cluster;
pub(crate) mod init_secret;
mod init_server;
pub mod join_client;
pub mod join_service;
pub(crate) mod kubeadm;
pub(crate) mod ledger;
pub mod mtls;
pub(crate) mod nodelock;
mod racers;
pub mod wire;
