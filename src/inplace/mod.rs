//! In-place re-bootstrap of RHCOS and RHEL nodes: `preflight` checks, `reprovision` fetches a
//! verified payload, applies it through the machine-config daemon or the payload's own script,
//! and reboots once. Contract: docs/reprovision.md.

pub(crate) mod mco;
pub mod payload;
pub(crate) mod progress;
pub mod reprovision;
