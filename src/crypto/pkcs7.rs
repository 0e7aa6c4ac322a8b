//! A detached PKCS#7 (CMS SignedData, DER) signature checked the way systemd checks a verity
//! root hash's signature in userspace: the signer must be one of the given certificates, found
//! by the issuer and serial number the signature names (certificates carried inside the
//! signature are ignored), with no chain or expiry check; the signature over the content (or
//! over its signed attributes, whose message digest must be the content's) must verify with
//! that certificate's key. The signature algorithms are webpki's (RSA PKCS#1 2048-8192 bits,
//! ECDSA P-256/P-384, Ed25519), already in the binary for TLS.

use rustls::pki_types::CertificateDer;

use crate::crypto::der::Der;
use webpki::ring as alg;

/// Largest signature taken: a few kilobytes in practice.
pub(crate) const MAX_SIGNATURE: usize = 64 << 10;
/// Signer infos looked at: systemd-repart writes one.
const MAX_SIGNERS: usize = 8;

const OID_SIGNED_DATA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x07, 0x02];
const OID_MESSAGE_DIGEST: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x09, 0x04];
const OID_SHA256: &[u8] = &[0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x01];
const OID_SHA384: &[u8] = &[0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x02];
const OID_SHA512: &[u8] = &[0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x03];
/// rsaEncryption and sha{256,384,512}WithRSAEncryption: 1.2.840.113549.1.1.{1,11,12,13}.
const OID_RSA_PREFIX: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01];
/// ecdsa-with-SHA{256,384}: 1.2.840.10045.4.3.{2,3}; id-ecPublicKey 1.2.840.10045.2.1.
const OID_ECDSA_PREFIX: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d];
const OID_ED25519: &[u8] = &[0x2b, 0x65, 0x70];

/// A trusted certificate: its DER and how logs name it.
pub struct Cert {
    pub(crate) der: Vec<u8>,
    pub(crate) name: String,
}

impl Cert {
    /// Every certificate of a PEM file (`name` names it in errors); none is an error.
    pub fn from_pem(pem: &[u8], name: &str) -> Result<Vec<Cert>, String> {
        use rustls::pki_types::pem::PemObject;
        let mut out = Vec::new();
        for (i, c) in CertificateDer::pem_slice_iter(pem).enumerate() {
            let c = c.map_err(|e| format!("{name}: not a PEM certificate file: {e:?}"))?;
            let der = c.as_ref().to_vec();
            issuer_serial(&der)
                .ok_or_else(|| format!("{name}: certificate {} is not X.509", i + 1))?;
            out.push(Cert {
                der,
                name: if i == 0 {
                    name.to_string()
                } else {
                    format!("{name} #{}", i + 1)
                },
            });
        }
        if out.is_empty() {
            return Err(format!("{name}: no CERTIFICATE in it"));
        }
        Ok(out)
    }
}

/// Checks `signature` (DER) over `content` against `certs`: the index of the certificate that
/// signed it, or why not.
pub fn verify_detached(signature: &[u8], content: &[u8], certs: &[Cert]) -> Result<usize, String> {
    if signature.len() > MAX_SIGNATURE {
        return Err(format!("signature of {} bytes: too large", signature.len()));
    }
    let signers = parse(signature).ok_or("not a DER PKCS#7 SignedData")?;
    let mut why = String::from("no signer info");
    for s in signers.iter().take(MAX_SIGNERS) {
        let Some(i) = certs.iter().position(|c| {
            issuer_serial(&c.der).is_some_and(|(issuer, serial)| {
                issuer == s.issuer && strip_zeros(serial) == strip_zeros(s.serial)
            })
        }) else {
            why = "signer certificate not found among the trusted certificates".into();
            continue;
        };
        match check_signer(s, content, &certs[i]) {
            Ok(()) => return Ok(i),
            Err(e) => why = format!("{}: {e}", certs[i].name),
        }
    }
    Err(why)
}

/// What one signer info says.
struct SignerInfo<'a> {
    issuer: &'a [u8],
    serial: &'a [u8],
    digest: &'a [u8],
    /// The `[0]` signed attributes, tag and length included.
    attrs: Option<&'a [u8]>,
    sig_alg: &'a [u8],
    signature: &'a [u8],
}

fn check_signer(s: &SignerInfo, content: &[u8], cert: &Cert) -> Result<(), String> {
    let hash = |data: &[u8]| -> Option<Vec<u8>> {
        let a = match s.digest {
            OID_SHA256 => &ring::digest::SHA256,
            OID_SHA384 => &ring::digest::SHA384,
            OID_SHA512 => &ring::digest::SHA512,
            _ => return None,
        };
        Some(ring::digest::digest(a, data).as_ref().to_vec())
    };
    // With signed attributes, what is signed is their SET, whose message digest is the content's.
    let signed: std::borrow::Cow<[u8]> = match s.attrs {
        None => content.into(),
        Some(attrs) => {
            let want = hash(content).ok_or("digest algorithm not SHA-2")?;
            let (_, inner, _) = Der(attrs).tlv().ok_or("signed attributes unreadable")?;
            let mut found = None;
            let mut a = Der(inner);
            while let Some((0x30, attr, _)) = a.tlv() {
                let mut f = Der(attr);
                let oid = f.expect(0x06).ok_or("attribute without a type")?;
                if oid == OID_MESSAGE_DIGEST {
                    let mut set = Der(f.expect(0x31).ok_or("message digest without a value")?);
                    found = set.expect(0x04);
                }
            }
            if found != Some(want.as_slice()) {
                return Err("the signed message digest is not the content's".into());
            }
            let mut v = attrs.to_vec();
            v[0] = 0x31;
            v.into()
        }
    };
    let der = CertificateDer::from(cert.der.as_slice());
    let ee = webpki::EndEntityCert::try_from(&der).map_err(|e| format!("certificate: {e:?}"))?;
    let algs: &[&dyn rustls::pki_types::SignatureVerificationAlgorithm] =
        if s.sig_alg.starts_with(OID_RSA_PREFIX) {
            match s.digest {
                OID_SHA256 => &[alg::RSA_PKCS1_2048_8192_SHA256],
                OID_SHA384 => &[alg::RSA_PKCS1_2048_8192_SHA384],
                OID_SHA512 => &[alg::RSA_PKCS1_2048_8192_SHA512],
                _ => &[],
            }
        } else if s.sig_alg.starts_with(OID_ECDSA_PREFIX) {
            match s.digest {
                OID_SHA256 => &[alg::ECDSA_P256_SHA256, alg::ECDSA_P384_SHA256],
                OID_SHA384 => &[alg::ECDSA_P256_SHA384, alg::ECDSA_P384_SHA384],
                _ => &[],
            }
        } else if s.sig_alg == OID_ED25519 {
            &[alg::ED25519]
        } else {
            &[]
        };
    if algs.is_empty() {
        return Err("signature or digest algorithm not supported".into());
    }
    if algs
        .iter()
        .any(|a| ee.verify_signature(*a, &signed, s.signature).is_ok())
    {
        Ok(())
    } else {
        Err("the signature does not verify with its key".into())
    }
}

/// ContentInfo { signedData, [0] SignedData { version, digests, content, [0] certs, [1] crls,
/// signerInfos } }: its signer infos.
fn parse(der: &[u8]) -> Option<Vec<SignerInfo<'_>>> {
    let mut top = Der(der);
    let mut ci = Der(top.expect(0x30)?);
    if !top.0.is_empty() || ci.expect(0x06)? != OID_SIGNED_DATA {
        return None;
    }
    let mut sd = Der(Der(ci.expect(0xa0)?).expect(0x30)?);
    sd.expect(0x02)?;
    sd.expect(0x31)?;
    sd.expect(0x30)?;
    let mut rest = sd.tlv()?;
    // Optional certificates [0] and CRLs [1]: ignored, as systemd ignores embedded ones.
    while matches!(rest.0, 0xa0 | 0xa1) {
        rest = sd.tlv()?;
    }
    if rest.0 != 0x31 || !sd.0.is_empty() {
        return None;
    }
    let mut set = Der(rest.1);
    let mut out = Vec::new();
    while !set.0.is_empty() && out.len() < MAX_SIGNERS {
        let mut si = Der(set.expect(0x30)?);
        si.expect(0x02)?;
        // issuerAndSerialNumber; a subjectKeyIdentifier ([0]) is not what systemd-repart writes.
        let mut ias = Der(si.expect(0x30)?);
        let (_, _, issuer) = ias.tlv()?;
        let serial = ias.expect(0x02)?;
        let mut dalg = Der(si.expect(0x30)?);
        let digest = dalg.expect(0x06)?;
        let mut next = si.tlv()?;
        let attrs = if next.0 == 0xa0 {
            let a = next.2;
            next = si.tlv()?;
            Some(a)
        } else {
            None
        };
        if next.0 != 0x30 {
            return None;
        }
        let sig_alg = Der(next.1).expect(0x06)?;
        let signature = si.expect(0x04)?;
        out.push(SignerInfo {
            issuer,
            serial,
            digest,
            attrs,
            sig_alg,
            signature,
        });
    }
    Some(out)
}

/// The issuer Name (DER, tag and length included) and the serial number's content bytes of a
/// certificate.
fn issuer_serial(der: &[u8]) -> Option<(&[u8], &[u8])> {
    let mut c = Der(Der(der).expect(0x30)?);
    let mut tbs = Der(c.expect(0x30)?);
    let mut first = tbs.tlv()?;
    if first.0 == 0xa0 {
        first = tbs.tlv()?;
    }
    if first.0 != 0x02 {
        return None;
    }
    tbs.expect(0x30)?;
    let (tag, _, issuer) = tbs.tlv()?;
    (tag == 0x30).then_some((issuer, first.1))
}

fn strip_zeros(b: &[u8]) -> &[u8] {
    let n = b.iter().take_while(|x| **x == 0).count();
    &b[n.min(b.len().saturating_sub(1))..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_is_no_signature() {
        assert!(parse(b"garbage").is_none());
        assert_eq!(strip_zeros(&[0, 0, 5]), &[5]);
        assert_eq!(strip_zeros(&[0]), &[0]);
    }

    /// Signatures made by the real openssl (as systemd-repart makes them, with and without
    /// signed attributes; RSA and ECDSA) verify against their certificate only.
    #[test]
    fn openssl_signatures_verify_against_their_certificate_only() {
        let d = std::env::temp_dir().join(format!("nodestrap-pkcs7-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let sh = |script: &str| {
            let o = std::process::Command::new("sh")
                .arg("-ec")
                .arg(script)
                .current_dir(&d)
                .output()
                .unwrap();
            assert!(
                o.status.success(),
                "{script}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        };
        let content = "4b1d1e5c0ffee0ddba11";
        std::fs::write(d.join("content"), content).unwrap();
        for (key, newkey) in [
            ("rsa", "rsa:2048"),
            ("ec", "ec -pkeyopt ec_paramgen_curve:P-256"),
        ] {
            sh(&format!(
                "openssl req -x509 -newkey {newkey} -nodes -keyout {key}.key -out {key}.crt -days 30 -subj /CN={key} 2>/dev/null
                 openssl smime -sign -binary -noattr -nocerts -in content -signer {key}.crt -inkey {key}.key -outform DER -out {key}.noattr
                 openssl smime -sign -binary -in content -signer {key}.crt -inkey {key}.key -outform DER -out {key}.attr"
            ));
        }
        let load = |n: &str| Cert::from_pem(&std::fs::read(d.join(n)).unwrap(), n).unwrap();
        let (rsa, ec) = (load("rsa.crt"), load("ec.crt"));
        let both: Vec<Cert> = load("ec.crt").into_iter().chain(load("rsa.crt")).collect();
        for key in ["rsa", "ec"] {
            for kind in ["noattr", "attr"] {
                let sig = std::fs::read(d.join(format!("{key}.{kind}"))).unwrap();
                let own = if key == "rsa" { &rsa } else { &ec };
                let other = if key == "rsa" { &ec } else { &rsa };
                assert_eq!(
                    verify_detached(&sig, content.as_bytes(), own),
                    Ok(0),
                    "{key} {kind}"
                );
                assert_eq!(
                    verify_detached(&sig, content.as_bytes(), &both),
                    Ok(if key == "ec" { 0 } else { 1 })
                );
                assert_eq!(
                    verify_detached(&sig, content.as_bytes(), other),
                    Err("signer certificate not found among the trusted certificates".into()),
                    "{key} {kind}"
                );
                let e = verify_detached(&sig, b"another root hash", own).unwrap_err();
                assert!(
                    e.contains("does not verify") || e.contains("message digest"),
                    "{e}"
                );
            }
        }
        assert!(Cert::from_pem(b"no pem here", "x").is_err());
        let _ = std::fs::remove_dir_all(&d);
    }
}
