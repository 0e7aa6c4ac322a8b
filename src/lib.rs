//! nodestrap: prepares a machine to join a Kubernetes cluster before anything else runs.
//!
//! A library as well as the binary so the fuzz targets (fuzz/) can call the parsers; the
//! binary (src/main.rs) only dispatches.

pub mod activate;
pub mod bootstrap;
pub mod cli;
pub mod config;
pub mod dbus;
pub mod envfile;
pub mod error;
pub mod fetch;
pub mod hook;
pub mod initcluster;
pub mod initsecret;
pub mod joinservice;
pub mod kube;
pub mod kubeadm;
pub mod logger;
pub mod mappings;
pub mod mco;
pub mod mtls;
pub mod nodelock;
pub mod output;
pub mod payload;
pub mod progress;
pub mod reboot;
pub mod reprovision;
pub mod root;
pub mod runscript;
pub mod stop;
pub mod torcx;
pub mod verify;
pub mod wire;
pub mod yaml;
