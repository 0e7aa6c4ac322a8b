//! nodestrap: prepares a machine to join a Kubernetes cluster before anything else runs.
//!
//! A library as well as the binary so the fuzz targets (fuzz/) can call the parsers; the
//! binary (src/main.rs) only dispatches. The layout and its import rule are in README.md
//! ("Layout") and checked by `.ci/check-layout`:
//!
//! - families, one folder each: `torcx`, `inplace`, `activation`, `sysext`. A family
//!   never imports another family.
//! - floors under them: `net` may use `node` and `crypto`; `node` only `crypto`; `crypto`
//!   nothing of ours above the ground.
//! - the ground, usable by all: `error`, `logger`, `output`, `yaml`; it imports only itself.
//! - `cli` (every command's options) sits over the floors; families read their options from it.
//! - `fuzz`: the fuzz crate's one way in, over everything (like this file and main.rs).
//!
//! A module no other crate reaches (main.rs, tests, fuzz, bench) is `pub(crate)`, and so is
//! everything in it; the lint below keeps it so.
#![warn(unreachable_pub)]

/// This build's version: Cargo.toml's, or `NODESTRAP_VERSION` at build time (build.rs).
pub(crate) const VERSION: &str = env!("NODESTRAP_VERSION");

// Families.
pub mod activation;
pub mod inplace;
pub mod sysext;
pub mod torcx;

// Floors.
pub mod crypto;
pub mod net;
pub mod node;

// The command line.
pub mod cli;

// The fuzz crate's way in to parsers private to their modules.
#[doc(hidden)]
pub mod fuzz;

// The ground.
pub mod error;
pub(crate) mod logger;
pub(crate) mod output;
pub mod yaml;
