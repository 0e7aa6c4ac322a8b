//! The torcx era (CoreOS Container Linux, Tectonic): `bootstrap` stages the Docker torcx image
//! the cluster wants before the first boot's units run; `hook` is the update operator's
//! pre-reboot hook that stages it for the next OS version. Contracts: docs/bootstrap.md and
//! docs/hook.md.

pub mod bootstrap;
pub mod floor;
pub mod hook;
pub mod layout;
pub(crate) mod runtime;
pub mod store;
pub mod verify;
