//! The crypto floor: digests, OpenPGP signature checks, random spreads, certificate pins. Imports nothing of
//! ours but the ground.

pub mod digest;
pub mod openpgp;
pub mod random;
pub mod x509;
