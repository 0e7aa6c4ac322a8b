//! The systemd-sysext era (today's Flatcar): `bootstrap --payload sysext` picks the Kubernetes
//! extension image by the cluster's version and a container runtime image by the runtime
//! mappings, verifies them by a signed SHA256SUMS, checks them as systemd-sysext will, stages
//! them in Flatcar's layout, and merges them live or leaves them for the boot to merge.
//! Contract: docs/bootstrap.md ("sysext").

pub(crate) mod apply;
pub(crate) mod boot_merge;
pub mod bootstrap;
pub(crate) mod choose;
pub mod ddi;
pub(crate) mod host;
pub(crate) mod image;
pub(crate) mod itself;
pub mod known_good;
pub(crate) mod lists;
pub(crate) mod merge;
pub(crate) mod plan;
pub(crate) mod report;
pub(crate) mod rollout;
pub(crate) mod source;
pub(crate) mod stage;
pub mod sums;
pub(crate) mod trust;
pub mod verify;
