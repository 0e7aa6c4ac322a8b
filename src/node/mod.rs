//! The node floor: the real root's handle and its directories (dirfd-relative, atomic
//! replace), env files and os-release, D-Bus, reboots through one executor, one command runner,
//! one signal module, the clock's floor, the run's status record, the undo log that puts the
//! node back after a failure, and the one verified write of a payload. Uses only `crypto`.

pub(crate) mod clock;
pub(crate) mod cmdline;
pub(crate) mod dbus;
pub(crate) mod dir;
pub mod envfile;
pub mod events;
pub(crate) mod exec;
pub mod floor;
pub mod mappings;
pub(crate) mod marker;
pub(crate) mod metrics;
pub(crate) mod privilege;
pub(crate) mod reboot;
pub mod root;
pub(crate) mod run;
pub(crate) mod seams;
pub(crate) mod signals;
pub mod state_file;
pub mod status;
pub mod temps;
pub(crate) mod undo;
pub(crate) mod verified;
