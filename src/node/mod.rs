//! The node floor: the real root's handle and its directories (dirfd-relative, atomic
//! replace), env files and os-release, D-Bus, reboots through one executor, one command runner,
//! one signal module, the clock's floor, the run's status record, the undo log that puts the
//! node back after a failure, and the one verified write of a payload. Uses only `crypto`.

pub mod clock;
pub mod cmdline;
pub mod dbus;
pub(crate) mod dir;
pub mod envfile;
pub mod events;
pub mod exec;
pub mod floor;
pub mod mappings;
pub mod marker;
pub mod metrics;
pub mod privilege;
pub mod reboot;
pub mod root;
pub mod run;
pub mod seams;
pub mod signals;
pub mod state_file;
pub mod status;
pub mod temps;
pub mod undo;
pub mod verified;
