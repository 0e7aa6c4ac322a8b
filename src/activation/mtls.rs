//! Mutual TLS for the activation exchanges (init request, join ticket): rustls server and
//! client configurations from PEM files, and who a verified peer is. The small HTTP/1.1 spoken
//! over it: `exchange.rs`.
//!
//! Servers verify clients against one configured CA (`WebPkiClientVerifier`); clients trust
//! only the pinned CA they are given, never a system store. TLS 1.3 only: both ends are ours.

use std::sync::Arc;

use rustls::pki_types::pem::{PemObject, SectionKind};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use crate::crypto::der::Der;

use crate::crypto::x509::spki_sha256;
use crate::error::{Error, Result};
use crate::node::root::{Root, CONFIG_CAP};

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    crate::net::tls::tls_provider()
}

/// A PEM file named on the command line (`flag`), read as a node path under `root`.
pub(crate) fn read_pem(root: &Root, flag: &str, node_path: &str) -> Result<Vec<u8>> {
    if !node_path.starts_with('/') {
        return Err(Error::config(format!(
            "{flag} {node_path}: expected an absolute path"
        )));
    }
    root.read(node_path, CONFIG_CAP)
        .map_err(|e| e.context(flag))?
        .ok_or_else(|| Error::config(format!("{flag} {}: does not exist", root.show(node_path))))
}

/// The items of a PEM file, through the same reader ureq uses (one copy in the binary).
fn pem_items(pem: &[u8], name: &str) -> Result<Vec<(SectionKind, Vec<u8>)>> {
    let mut items = Vec::new();
    for item in <(SectionKind, Vec<u8>)>::pem_slice_iter(pem) {
        items.push(item.map_err(|e| Error::config(format!("{name}: bad PEM: {e}")))?);
    }
    Ok(items)
}

/// Every certificate of a PEM bundle (at least one).
pub(crate) fn certs(pem: &[u8], name: &str) -> Result<Vec<CertificateDer<'static>>> {
    let mut certs = Vec::new();
    for (kind, der) in pem_items(pem, name)? {
        if kind == SectionKind::Certificate {
            certs.push(CertificateDer::from(der));
        }
    }
    if certs.is_empty() {
        return Err(Error::config(format!("{name}: no PEM certificate in it")));
    }
    Ok(certs)
}

/// The first private key of a PEM file.
pub(crate) fn key(pem: &[u8], name: &str) -> Result<PrivateKeyDer<'static>> {
    for (kind, der) in pem_items(pem, name)? {
        match kind {
            SectionKind::RsaPrivateKey => return Ok(PrivateKeyDer::Pkcs1(der.into())),
            SectionKind::EcPrivateKey => return Ok(PrivateKeyDer::Sec1(der.into())),
            SectionKind::PrivateKey => return Ok(PrivateKeyDer::Pkcs8(der.into())),
            _ => {}
        }
    }
    Err(Error::config(format!("{name}: no PEM private key in it")))
}

/// Our identity: a certificate chain and its key.
pub(crate) struct Identity {
    pub(crate) chain: Vec<CertificateDer<'static>>,
    pub(crate) key: PrivateKeyDer<'static>,
}

/// Certificates named by `flag`, a node path under `root`.
pub(crate) fn load_certs(
    root: &Root,
    flag: &str,
    node_path: &str,
) -> Result<Vec<CertificateDer<'static>>> {
    certs(&read_pem(root, flag, node_path)?, &root.show(node_path))
}

/// A certificate chain and its key, named by `--<flag>-cert`-style flags.
pub(crate) fn load_identity(
    root: &Root,
    cert: (&str, &str),
    key: (&str, &str),
) -> Result<Identity> {
    Ok(Identity {
        chain: load_certs(root, cert.0, cert.1)?,
        key: self::key(&read_pem(root, key.0, key.1)?, &root.show(key.1))?,
    })
}

fn roots(cas: &[CertificateDer<'static>], name: &str) -> Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for c in cas {
        roots
            .add(c.clone())
            .map_err(|e| Error::config(format!("{name}: not a usable CA certificate: {e}")))?;
    }
    Ok(roots)
}

fn mismatch(name: &str) -> impl FnOnce(rustls::Error) -> Error + '_ {
    move |e| {
        Error::config(format!(
            "{name}: certificate and key do not go together: {e}"
        ))
    }
}

/// Serve with `id`; clients must present a certificate issued by one of `client_cas`.
pub(crate) fn server_config(
    id: &Identity,
    client_cas: &[CertificateDer<'static>],
    name: &str,
) -> Result<Arc<ServerConfig>> {
    let verifier =
        WebPkiClientVerifier::builder_with_provider(Arc::new(roots(client_cas, name)?), provider())
            .build()
            .map_err(|e| Error::config(format!("{name}: {e}")))?;
    let mut cfg = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| Error::failed(format!("TLS: {e}")))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(id.chain.clone(), id.key.clone_key())
        .map_err(mismatch(name))?;
    // One request per connection: nothing to resume, so no session cache and no tickets.
    cfg.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    cfg.send_tls13_tickets = 0;
    Ok(Arc::new(cfg))
}

/// Trust only `pinned` for the server; present `id`.
pub(crate) fn client_config(
    pinned: &[CertificateDer<'static>],
    id: &Identity,
    name: &str,
) -> Result<Arc<ClientConfig>> {
    let cfg = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| Error::failed(format!("TLS: {e}")))?
        .with_root_certificates(roots(pinned, name)?)
        .with_client_auth_cert(id.chain.clone(), id.key.clone_key())
        .map_err(mismatch(name))?;
    Ok(Arc::new(cfg))
}

// ---------------------------------------------------------------------------------------------
// Who the peer is, from its (already verified) certificate.

#[derive(Debug, Clone, PartialEq)]
pub struct Peer {
    /// Subject common name ("" when there is none).
    pub(crate) cn: String,
    /// Subject organisations.
    pub(crate) orgs: Vec<String>,
    /// `sha256:<hex>` of the DER SubjectPublicKeyInfo: the identity that cannot be re-issued
    /// under the same name by mistake, and the form kubeadm's discovery hash takes.
    pub spki: String,
}

pub fn peer(cert_der: &[u8]) -> Option<Peer> {
    const CN: &[u8] = &[0x55, 0x04, 0x03];
    const O: &[u8] = &[0x55, 0x04, 0x0a];
    let der = CertificateDer::from(cert_der);
    let cert = webpki::EndEntityCert::try_from(&der).ok()?;
    let mut p = Peer {
        cn: String::new(),
        orgs: Vec::new(),
        spki: spki_sha256(cert_der)?,
    };
    let mut rdns = Der(cert.subject());
    while !rdns.is_empty() {
        let mut atvs = Der(rdns.expect(0x31)?);
        while !atvs.is_empty() {
            let mut atv = Der(atvs.expect(0x30)?);
            let oid = atv.expect(0x06)?;
            let (_, value, _) = atv.tlv()?;
            let value = String::from_utf8_lossy(value).into_owned();
            match oid {
                CN => p.cn = value,
                O => p.orgs.push(value),
                _ => {}
            }
        }
    }
    Some(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn der_walk_rejects_garbage() {
        assert!(peer(b"").is_none());
        assert!(peer(&[0x30, 0x82, 0xff, 0xff, 0]).is_none());
        assert!(spki_sha256(&[0x30, 0x03, 0x30, 0x01, 0x00]).is_none());
    }
}
