//! What nodestrap needs of an X.509 certificate beyond TLS: the pin of its public key.

use crate::crypto::digest::{hex, sha256};

/// `sha256:<hex>` of the certificate's DER SubjectPublicKeyInfo: the form of kubeadm's
/// `--discovery-token-ca-cert-hash` (and `caCertHashes`), an identity that a certificate
/// re-issued for the same key keeps. `None` when the DER is not a certificate webpki parses.
pub fn spki_sha256(cert_der: &[u8]) -> Option<String> {
    let der = rustls::pki_types::CertificateDer::from(cert_der);
    let cert = webpki::EndEntityCert::try_from(&der).ok()?;
    Some(format!(
        "sha256:{}",
        hex(&sha256(cert.subject_public_key_info().as_ref()))
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_has_no_pin() {
        assert!(spki_sha256(&[0x30, 0x03, 0x30, 0x01, 0x00]).is_none());
        assert!(spki_sha256(b"").is_none());
    }
}
