//! OpenPGP detached signatures over manifests, checked against a keyring given on the command
//! line (sequoia-openpgp). The signature's packets are read and checked one by one, as
//! sequoia's own detached verifier does, without its message machinery (decryption,
//! decompression), which nodestrap never needs and which cost about 100 KB of the binary.

use std::borrow::Cow;

use openpgp::cert::prelude::*;
use openpgp::packet::Signature;
use openpgp::parse::{PacketParser, PacketParserResult, Parse};
use openpgp::policy::{Policy, StandardPolicy};
use openpgp::types::{RevocationStatus, SignatureType};
use openpgp::{Cert, Packet};
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

    pub(crate) fn fingerprints(&self) -> Vec<String> {
        self.certs
            .iter()
            .map(|c| c.fingerprint().to_hex())
            .collect()
    }

    /// Check a detached signature (`sig`, armored or binary, one or more signature packets and
    /// nothing else) over `data`: at least one good signature by a key of the keyring; a bad
    /// one beside a good one is tolerated (key rotation). Returns the fingerprint of the
    /// signing key. `what` names the signed input in errors.
    pub fn verify_detached(&self, data: &[u8], sig: &[u8], what: &str) -> Result<String> {
        let policy = StandardPolicy::new();
        let sigs = signatures(sig).map_err(|e| self.fail(what, e))?;
        let mut errors = Vec::new();
        for s in &sigs {
            match self.check_one(&policy, s, data) {
                Ok(good) => return Ok(good),
                Err(e) => errors.push(e),
            }
        }
        Err(self.fail(what, errors.join("; ")))
    }

    /// One signature against every key of the keyring it names as its issuer, with the checks
    /// of sequoia's detached verifier, in its order: the key bound under the policy at the
    /// signature's time, certificate and key alive and not revoked, signing-capable, the
    /// signature alive now, then the digest and the policy on the signature.
    fn check_one(
        &self,
        policy: &dyn Policy,
        sig: &Signature,
        data: &[u8],
    ) -> Result<String, String> {
        let Some(at) = sig.signature_creation_time() else {
            return Err("malformed signature: missing a Signature Creation Time subpacket".into());
        };
        let issuers = sig.get_issuers();
        if issuers.is_empty() {
            return Err("signature names no issuer".into());
        }
        let text = text_form(sig, data);
        let mut err = format!(
            "Missing key {}: no key of the keyring made this signature",
            issuers[0]
        );
        for ka in self
            .certs
            .iter()
            .flat_map(|c| c.keys().key_handles(issuers.iter().cloned()))
        {
            let fpr = ka.key().fingerprint();
            let ka = match ka.with_policy(policy, at) {
                Ok(ka) => ka,
                Err(e) => {
                    err = format!("key {fpr} rejected by policy: {e}");
                    continue;
                }
            };
            let bad = if let Err(e) = ka.valid_cert().alive() {
                format!("certificate of key {fpr} not alive: {e}")
            } else if let Err(e) = ka.alive() {
                format!("key {fpr} not alive: {e}")
            } else if let RevocationStatus::Revoked(_) = ka.valid_cert().revocation_status() {
                format!("certificate of key {fpr} is revoked")
            } else if let RevocationStatus::Revoked(_) = ka.revocation_status() {
                format!("signing key {fpr} is revoked")
            } else if !ka.for_signing() {
                format!("key {fpr} is not signing capable")
            } else if let Err(e) = sig.signature_alive(None, None) {
                format!("signature by {fpr} not alive: {e}")
            } else if let Err(e) = sig.verify_message(ka.key(), &text) {
                format!("bad signature by {fpr}: {e}")
            } else if let Err(e) = policy.signature(sig, Default::default()) {
                format!("signature by {fpr} rejected by policy: {e}")
            } else {
                return Ok(fpr.to_hex());
            };
            err = bad;
        }
        Err(err)
    }

    fn fail(&self, what: &str, e: impl std::fmt::Display) -> Error {
        Error::failed(format!(
            "{what}: signature check against keyring {} failed: {e}",
            self.name
        ))
    }
}

/// The signature packets of a detached signature, as sequoia's verifier takes them: a marker
/// packet is ignored (RFC 9580, 5.8), a signature it cannot read (another version, an unknown
/// algorithm) is passed over when a readable one stands beside it, any other packet refuses it.
fn signatures(sig: &[u8]) -> openpgp::Result<Vec<Signature>> {
    let mut out = Vec::new();
    let mut unreadable = Vec::new();
    let mut ppr = PacketParser::from_bytes(sig)?;
    while let PacketParserResult::Some(pp) = ppr {
        let (packet, next) = pp.next()?;
        match packet {
            Packet::Signature(s) => out.push(s),
            Packet::Marker(_) => {}
            Packet::Unknown(u) if u.tag() == openpgp::packet::Tag::Signature => {
                unreadable.push(u.error().to_string())
            }
            p => {
                return Err(openpgp::anyhow::anyhow!(
                    "a detached signature holds a {} packet",
                    p.tag()
                ))
            }
        }
        ppr = next;
    }
    if out.is_empty() {
        return Err(match unreadable.is_empty() {
            true => openpgp::anyhow::anyhow!("no signature found"),
            false => {
                openpgp::anyhow::anyhow!("no signature it can read: {}", unreadable.join("; "))
            }
        });
    }
    Ok(out)
}

/// A text signature is made over the document with CR LF line ends (RFC 9580, 5.2.1.2).
fn text_form<'a>(sig: &Signature, data: &'a [u8]) -> Cow<'a, [u8]> {
    if sig.typ() != SignatureType::Text || !data.contains(&b'\n') {
        return Cow::Borrowed(data);
    }
    let mut out = Vec::with_capacity(data.len() + data.len() / 32);
    let mut prev = 0u8;
    for &b in data {
        if b == b'\n' && prev != b'\r' {
            out.push(b'\r');
        }
        out.push(b);
        prev = b;
    }
    Cow::Owned(out)
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
    fn a_marker_is_ignored_and_an_unreadable_signature_passed_over() {
        let k = Keyring::parse(KEYRING, "fixture").unwrap();
        let binary = include_bytes!("../../fuzz/corpus/openpgp_signature/gnupg-binary.sig");
        // An old-format marker packet ("PGP"), and a signature packet of version 99.
        let marker = [0xA8, 0x03, b'P', b'G', b'P'];
        let v99 = [0xC2, 0x06, 99, 0x00, 0x01, 0x08, 0x00, 0x00];
        let mut sig = marker.to_vec();
        sig.extend_from_slice(&v99);
        sig.extend_from_slice(binary);
        k.verify_detached(MANIFEST, &sig, "manifest.json").unwrap();
        let only_v99 = [&marker[..], &v99[..]].concat();
        let e = k
            .verify_detached(MANIFEST, &only_v99, "manifest.json")
            .unwrap_err()
            .to_string();
        assert!(e.contains("no signature it can read"), "{e}");
        // A packet of another kind is refused, whatever stands beside it.
        let mut literal = vec![0xCB, 0x06, b'b', 0x00, 0x00, 0x00, 0x00, 0x00];
        literal.extend_from_slice(binary);
        let e = k
            .verify_detached(MANIFEST, &literal, "manifest.json")
            .unwrap_err()
            .to_string();
        assert!(e.contains("a detached signature holds a"), "{e}");
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
