//! TLS for every connection nodestrap makes: the trust anchors it chooses (the system bundle,
//! or only the CAs an operator names), client certificates, and rustls on ring with the suites
//! and signature algorithms it offers, chosen for the size budget.

use std::path::Path;
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use ureq::tls::{Certificate, ClientCert, PemItem};

use crate::error::{Error, Kind, Result};
use crate::node::root::{read_host_file, Root};

/// CA bundles of the distributions we run on; the first that exists is the system trust store.
const SYSTEM_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

/// Trust anchors and an optional client identity for one endpoint family.
#[derive(Default, Clone)]
pub(crate) struct Tls {
    pub(crate) roots: Vec<Certificate<'static>>,
    pub(crate) client: Option<ClientCert>,
    /// Where the roots came from, for the log line.
    pub(crate) sources: Vec<String>,
    /// The setting that adds a trust anchor for this client, named when a server's certificate
    /// is not signed by one (`--ca-file`, a kubeconfig's `certificate-authority`).
    pub(crate) fix: Option<String>,
    pub(crate) check: Check,
}

/// Whether a server's certificate is checked against the roots.
#[derive(Default, Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Check {
    #[default]
    Roots,
    /// Not on this connection: only kubeadm's token discovery reads cluster-info so, and then
    /// trusts no byte of it but a CA whose key matches the join configuration's pins
    /// (net/join_config.rs), as kubeadm does.
    PinnedAfter,
}

impl Tls {
    /// The system trust store: the bundle `SSL_CERT_FILE` names, else the first distribution
    /// bundle found on the node `root` (where the bundle the node's admin curates lives; in the
    /// initramfs that is `/sysroot`), else on the system we run on.
    pub(crate) fn system(root: &Root) -> Result<Tls> {
        let mut tls = Tls::default();
        if let Some(b) = std::env::var_os("SSL_CERT_FILE") {
            let b = std::path::PathBuf::from(b);
            match std::fs::read(&b) {
                Ok(pem) => tls
                    .add_pem(&pem, &b.display().to_string())
                    .map_err(|e| e.with_kind(Kind::Config))?,
                Err(e) => crate::warn!("SSL_CERT_FILE {}: {e}", b.display()),
            }
            return Ok(tls);
        }
        for p in SYSTEM_BUNDLES {
            if let Some(pem) = root.read(p, 64 << 20)? {
                tls.add_pem(&pem, &root.show(p))?;
                return Ok(tls);
            }
        }
        if !root.is_host() {
            if let Some(p) = SYSTEM_BUNDLES.iter().map(Path::new).find(|p| p.exists()) {
                let pem = read_host_file(p, 64 << 20, "system CA bundle")?;
                tls.add_pem(&pem, &p.display().to_string())?;
            }
        }
        Ok(tls)
    }

    /// Add the PEM file given on the command line (`--ca-file`).
    pub(crate) fn add_file(&mut self, p: &Path, flag: &str) -> Result<()> {
        let pem = read_host_file(p, 16 << 20, flag)?;
        self.add_pem(&pem, &format!("{flag} {}", p.display()))
            .map_err(|e| e.with_kind(Kind::Config))
    }

    /// Add every certificate of a PEM bundle; it must hold at least one.
    pub(crate) fn add_pem(&mut self, pem: &[u8], name: &str) -> Result<()> {
        let before = self.roots.len();
        for item in ureq::tls::parse_pem(pem) {
            match item {
                Ok(PemItem::Certificate(c)) => self.roots.push(c),
                Ok(_) => {}
                Err(e) => return Err(Error::failed(format!("{name}: bad PEM: {e}"))),
            }
        }
        if self.roots.len() == before {
            return Err(Error::failed(format!("{name}: no PEM certificate in it")));
        }
        self.sources.push(format!(
            "{name} ({} certificates)",
            self.roots.len() - before
        ));
        Ok(())
    }
}

/// rustls on ring, every connection's: the default provider's key exchange groups, signature
/// algorithms and AES-GCM suites (TLS 1.3 and 1.2), without ChaCha20-Poly1305. Every TLS server
/// offers AES-GCM, and the ChaCha20 code (for CPUs without AES instructions) costs about 30 KB of
/// the 4 MiB budget; built field by field so the default suite list is never linked.
pub(crate) fn tls_provider() -> Arc<CryptoProvider> {
    use rustls::crypto::ring::cipher_suite as cs;
    Arc::new(CryptoProvider {
        cipher_suites: vec![
            cs::TLS13_AES_256_GCM_SHA384,
            cs::TLS13_AES_128_GCM_SHA256,
            cs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
            cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
            cs::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
            cs::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
        ],
        kx_groups: rustls::crypto::ring::ALL_KX_GROUPS.to_vec(),
        signature_verification_algorithms: SIG_ALGS,
        secure_random: &RingRandom,
        key_provider: &RingKeys,
    })
}

#[derive(Debug)]
struct RingRandom;

impl rustls::crypto::SecureRandom for RingRandom {
    fn fill(&self, buf: &mut [u8]) -> std::result::Result<(), rustls::crypto::GetRandomFailed> {
        use ring::rand::SecureRandom as _;
        ring::rand::SystemRandom::new()
            .fill(buf)
            .map_err(|_| rustls::crypto::GetRandomFailed)
    }
}

#[derive(Debug)]
struct RingKeys;

impl rustls::crypto::KeyProvider for RingKeys {
    fn load_private_key(
        &self,
        key: rustls::pki_types::PrivateKeyDer<'static>,
    ) -> std::result::Result<Arc<dyn rustls::sign::SigningKey>, rustls::Error> {
        rustls::crypto::ring::sign::any_supported_type(&key)
    }
}

/// The certificate signature algorithms webpki has on ring, by TLS signature scheme (the same
/// table rustls's ring provider uses).
static SIG_ALGS: rustls::crypto::WebPkiSupportedAlgorithms = {
    use rustls::SignatureScheme as S;
    use webpki::ring as w;
    rustls::crypto::WebPkiSupportedAlgorithms {
        all: &[
            w::ECDSA_P256_SHA256,
            w::ECDSA_P256_SHA384,
            w::ECDSA_P384_SHA256,
            w::ECDSA_P384_SHA384,
            w::ED25519,
            w::RSA_PSS_2048_8192_SHA256_LEGACY_KEY,
            w::RSA_PSS_2048_8192_SHA384_LEGACY_KEY,
            w::RSA_PSS_2048_8192_SHA512_LEGACY_KEY,
            w::RSA_PKCS1_2048_8192_SHA256,
            w::RSA_PKCS1_2048_8192_SHA384,
            w::RSA_PKCS1_2048_8192_SHA512,
            w::RSA_PKCS1_2048_8192_SHA256_ABSENT_PARAMS,
            w::RSA_PKCS1_2048_8192_SHA384_ABSENT_PARAMS,
            w::RSA_PKCS1_2048_8192_SHA512_ABSENT_PARAMS,
        ],
        mapping: &[
            // TLS 1.2 does not tie the curve to the scheme; TLS 1.3 does.
            (
                S::ECDSA_NISTP384_SHA384,
                &[w::ECDSA_P384_SHA384, w::ECDSA_P256_SHA384],
            ),
            (
                S::ECDSA_NISTP256_SHA256,
                &[w::ECDSA_P256_SHA256, w::ECDSA_P384_SHA256],
            ),
            (S::ED25519, &[w::ED25519]),
            (S::RSA_PSS_SHA512, &[w::RSA_PSS_2048_8192_SHA512_LEGACY_KEY]),
            (S::RSA_PSS_SHA384, &[w::RSA_PSS_2048_8192_SHA384_LEGACY_KEY]),
            (S::RSA_PSS_SHA256, &[w::RSA_PSS_2048_8192_SHA256_LEGACY_KEY]),
            (S::RSA_PKCS1_SHA512, &[w::RSA_PKCS1_2048_8192_SHA512]),
            (S::RSA_PKCS1_SHA384, &[w::RSA_PKCS1_2048_8192_SHA384]),
            (S::RSA_PKCS1_SHA256, &[w::RSA_PKCS1_2048_8192_SHA256]),
        ],
    }
};
