//! The systemd-sysext era (today's Flatcar): `bootstrap --payload sysext` picks the Kubernetes
//! extension image by the cluster's version and a container runtime image by the runtime
//! mappings, verifies them by a signed SHA256SUMS, checks them as systemd-sysext will, stages
//! them in Flatcar's layout, and merges them live or leaves them for the boot to merge.
//! Contract: docs/bootstrap.md ("sysext").

pub(crate) mod apply;
pub mod boot_merge;
pub mod bootstrap;
pub mod choose;
pub mod ddi;
pub mod host;
pub mod image;
pub mod itself;
pub mod known_good;
pub mod lists;
pub mod merge;
pub(crate) mod plan;
pub mod report;
pub mod rollout;
pub mod source;
pub mod stage;
pub mod sums;
pub mod trust;
pub mod verify;
