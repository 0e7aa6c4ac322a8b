//! Verification: OpenPGP detached signatures over manifests, and `sha512-<hex>` digests over
//! images computed while they stream (coreos-installer's verify-while-reading shape).

use std::io::{self, Read};

use openpgp::cert::prelude::*;
use openpgp::parse::stream::{
    DetachedVerifierBuilder, MessageLayer, MessageStructure, VerificationHelper,
};
use openpgp::parse::Parse;
use openpgp::policy::StandardPolicy;
use openpgp::{Cert, KeyHandle};
use sequoia_openpgp as openpgp;
use sha2::Digest as _;

use crate::error::{Error, Result};

/// The trust anchor: every certificate of an armored (or binary) keyring.
pub struct Keyring {
    certs: Vec<Cert>,
    name: String,
}

impl Keyring {
    /// `name` is how messages name the keyring (its path).
    pub fn parse(data: &[u8], name: &str) -> Result<Keyring> {
        let mut certs = Vec::new();
        let parser = CertParser::from_bytes(data)
            .map_err(|e| Error::config(format!("keyring {name}: {e}")))?;
        for c in parser {
            certs.push(c.map_err(|e| Error::config(format!("keyring {name}: {e}")))?);
        }
        if certs.is_empty() {
            return Err(Error::config(format!(
                "keyring {name}: holds no OpenPGP certificate"
            )));
        }
        Ok(Keyring {
            certs,
            name: name.to_string(),
        })
    }

    pub fn fingerprints(&self) -> Vec<String> {
        self.certs
            .iter()
            .map(|c| c.fingerprint().to_hex())
            .collect()
    }

    /// Check a detached signature (`sig`, armored or binary) over `data`. Returns the
    /// fingerprint of the signing key. `what` names the signed input in errors.
    pub fn verify_detached(&self, data: &[u8], sig: &[u8], what: &str) -> Result<String> {
        let policy = StandardPolicy::new();
        let helper = Helper {
            certs: &self.certs,
            good: None,
        };
        let mut v = DetachedVerifierBuilder::from_bytes(sig)
            .and_then(|b| b.with_policy(&policy, None, helper))
            .map_err(|e| self.fail(what, e))?;
        v.verify_bytes(data).map_err(|e| self.fail(what, e))?;
        Ok(v.helper_ref()
            .good
            .clone()
            .expect("check() accepted a good signature"))
    }

    fn fail(&self, what: &str, e: openpgp::anyhow::Error) -> Error {
        Error::failed(format!(
            "{what}: signature check against keyring {} failed: {e}",
            self.name
        ))
    }
}

struct Helper<'a> {
    certs: &'a [Cert],
    good: Option<String>,
}

impl VerificationHelper for Helper<'_> {
    fn get_certs(&mut self, _ids: &[KeyHandle]) -> openpgp::Result<Vec<Cert>> {
        Ok(self.certs.to_vec())
    }

    /// Exactly one layer, a signature group, with at least one good signature by a key of the
    /// keyring. Any bad signature alongside a good one is tolerated (key rotation), a layer of
    /// any other kind is not.
    fn check(&mut self, structure: MessageStructure) -> openpgp::Result<()> {
        let mut errors = Vec::new();
        for layer in structure.into_iter() {
            match layer {
                MessageLayer::SignatureGroup { results } => {
                    for r in results {
                        match r {
                            Ok(good) => {
                                self.good = Some(good.ka.key().fingerprint().to_hex());
                                return Ok(());
                            }
                            Err(e) => errors.push(e.to_string()),
                        }
                    }
                }
                _ => return Err(openpgp::anyhow::anyhow!("unexpected message layer")),
            }
        }
        if errors.is_empty() {
            Err(openpgp::anyhow::anyhow!("no signature found"))
        } else {
            Err(openpgp::anyhow::anyhow!("{}", errors.join("; ")))
        }
    }
}

/// A digest in Ignition/torcx notation: `sha512-<hex>` (also `sha256-`, `sha384-`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Digest {
    pub algo: Algo,
    /// Lowercase hex.
    pub hex: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algo {
    Sha256,
    Sha384,
    Sha512,
}

impl Digest {
    pub fn parse(s: &str) -> Option<Digest> {
        let (a, hex) = s.split_once('-')?;
        let (algo, len) = match a {
            "sha256" => (Algo::Sha256, 64),
            "sha384" => (Algo::Sha384, 96),
            "sha512" => (Algo::Sha512, 128),
            _ => return None,
        };
        if hex.len() != len || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        // torcx formatted lowercase and so never matched an uppercase manifest; we normalise.
        Some(Digest {
            algo,
            hex: hex.to_ascii_lowercase(),
        })
    }

    pub fn hasher(&self) -> Hasher {
        match self.algo {
            Algo::Sha256 => Hasher::Sha256(sha2::Sha256::new()),
            Algo::Sha384 => Hasher::Sha384(sha2::Sha384::new()),
            Algo::Sha512 => Hasher::Sha512(sha2::Sha512::new()),
        }
    }

    /// Hash a whole reader.
    pub fn matches(&self, mut r: impl Read) -> io::Result<bool> {
        let mut h = self.hasher();
        match crate::fetch::copy_hashing(&mut r, &mut h, &mut io::sink()) {
            Ok(_) => Ok(h.finish_hex() == self.hex),
            Err(crate::fetch::CopyError::Read(e) | crate::fetch::CopyError::Write(e)) => Err(e),
        }
    }
}

impl Digest {
    pub fn algo_name(&self) -> &'static str {
        match self.algo {
            Algo::Sha256 => "sha256",
            Algo::Sha384 => "sha384",
            Algo::Sha512 => "sha512",
        }
    }
}

impl std::fmt::Display for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.algo_name(), self.hex)
    }
}

pub enum Hasher {
    Sha256(sha2::Sha256),
    Sha384(sha2::Sha384),
    Sha512(sha2::Sha512),
}

impl Hasher {
    pub fn update(&mut self, b: &[u8]) {
        match self {
            Hasher::Sha256(h) => h.update(b),
            Hasher::Sha384(h) => h.update(b),
            Hasher::Sha512(h) => h.update(b),
        }
    }
    pub fn finish_hex(self) -> String {
        match self {
            Hasher::Sha256(h) => crate::root::hex(&h.finalize()),
            Hasher::Sha384(h) => crate::root::hex(&h.finalize()),
            Hasher::Sha512(h) => crate::root::hex(&h.finalize()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_parsing() {
        // sha512("test\n"), the value torcx's own tests use.
        let d = Digest::parse("sha512-0e3e75234abc68f4378a86b3f4b32a198ba301845b0cd6e50106e874345700cc6663a86c1ea125dc5e92be17c98f9a0f85ca9d5f595db2012f7cc3571945c123").unwrap();
        assert!(d.matches(&b"test\n"[..]).unwrap());
        assert!(!d.matches(&b"test"[..]).unwrap());
        assert!(Digest::parse("sha512-abc").is_none());
        assert!(Digest::parse("md5-d41d8cd98f00b204e9800998ecf8427e").is_none());
        assert!(Digest::parse(&format!("sha256-{}", "g".repeat(64))).is_none());
        let up = Digest::parse(&format!("sha256-{}", "AB".repeat(32))).unwrap();
        assert_eq!(up.hex, "ab".repeat(32));
    }
}

#[cfg(test)]
mod gnupg_interop {
    use super::*;

    const KEYRING: &[u8] = include_bytes!("../tests/fixtures/gnupg/keyring.asc");
    const MANIFEST: &[u8] = include_bytes!("../tests/fixtures/gnupg/manifest.json");
    const SIG: &[u8] = include_bytes!("../tests/fixtures/gnupg/manifest.json.asc");
    const SIG_SHA1: &[u8] = include_bytes!("../tests/fixtures/gnupg/manifest.json.sha1.asc");

    #[test]
    fn gnupg_signature_verifies_with_its_signing_subkey() {
        let k = Keyring::parse(KEYRING, "fixture").unwrap();
        let by = k.verify_detached(MANIFEST, SIG, "manifest.json").unwrap();
        // The primary key is certify-only: the signing subkey made the signature.
        assert!(!k.fingerprints().contains(&by), "{by}");
    }

    #[test]
    fn tampering_and_sha1_are_refused() {
        let k = Keyring::parse(KEYRING, "fixture").unwrap();
        let mut bad = MANIFEST.to_vec();
        bad[10] ^= 1;
        let e = k
            .verify_detached(&bad, SIG, "manifest.json")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("manifest.json: signature check against keyring fixture failed"),
            "{e}"
        );
        assert!(k
            .verify_detached(MANIFEST, SIG_SHA1, "manifest.json")
            .is_err());
        assert!(k
            .verify_detached(MANIFEST, b"not a signature", "manifest.json")
            .is_err());
        assert!(Keyring::parse(b"garbage", "k").is_err());
    }
}
