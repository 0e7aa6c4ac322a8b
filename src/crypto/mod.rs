//! The crypto floor: digests and OpenPGP signature checks. Imports nothing of ours but the
//! ground.

pub mod digest;
pub mod openpgp;
