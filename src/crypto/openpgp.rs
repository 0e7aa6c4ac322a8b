//! OpenPGP detached signatures over manifests, checked against a keyring given on the command
//! line (sequoia-openpgp).

use openpgp::cert::prelude::*;
use openpgp::parse::stream::{
    DetachedVerifierBuilder, MessageLayer, MessageStructure, VerificationHelper,
};
use openpgp::parse::Parse;
use openpgp::policy::StandardPolicy;
use openpgp::{Cert, KeyHandle};
use sequoia_openpgp as openpgp;

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

#[cfg(test)]
mod gnupg_interop {
    use super::*;

    const KEYRING: &[u8] = include_bytes!("../../tests/fixtures/gnupg/keyring.asc");
    const MANIFEST: &[u8] = include_bytes!("../../tests/fixtures/gnupg/manifest.json");
    const SIG: &[u8] = include_bytes!("../../tests/fixtures/gnupg/manifest.json.asc");
    const SIG_SHA1: &[u8] = include_bytes!("../../tests/fixtures/gnupg/manifest.json.sha1.asc");

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
