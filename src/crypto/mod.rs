//! The crypto floor: digests, OpenPGP signature checks, PKCS#7 signatures over verity root
//! hashes, random spreads, certificate pins. Imports nothing of
//! ours but the ground.

pub(crate) mod der;
pub(crate) mod digest;
pub mod openpgp;
pub mod pkcs7;
pub(crate) mod random;
pub mod x509;
