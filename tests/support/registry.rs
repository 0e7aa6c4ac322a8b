//! Debian's real OCI registry (`docker-registry`, distribution 2.8) on 127.0.0.1, with TLS from
//! the test CA and Basic auth from an htpasswd file `htpasswd -B` makes, or Bearer tokens a
//! test's own token endpoint issues (distribution only consumes tokens: it checks their
//! signature against a certificate bundle). Its redirect middleware can send blob downloads to
//! another server, as a registry in front of object storage does. Files reach it through
//! deploy/publish-oci, the script operators use.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::cluster::free_port;
use super::pki::Ca;

pub enum RegistryAuth {
    /// Anyone may pull (a fleet's pull-through mirror on its own network).
    Open,
    Basic {
        user: String,
        password: String,
    },
    /// Tokens from `realm`, signed by a key whose certificate is in `bundle`.
    Token {
        realm: String,
        service: String,
        issuer: String,
        bundle: PathBuf,
    },
}

pub struct Registry {
    pub port: u16,
    /// The filesystem driver's root: blobs at docker/registry/v2/blobs/sha256/<2>/<hex>/data.
    pub storage: PathBuf,
    pub dir: PathBuf,
    child: Child,
}

impl Registry {
    pub fn start(ca: &Ca, auth: RegistryAuth, redirect_to: Option<&str>) -> Registry {
        Registry::start_with(ca, auth, redirect_to, None)
    }

    /// A pull-through cache of `origin` (distribution's `proxy.remoteurl`), as fleets run one in
    /// front of their registry: open itself, it trusts `ca` for the origin and keeps what it
    /// pulled in its own storage. (distribution 2.8 sends its `proxy` credentials to a token
    /// realm only, so the origin is open too.)
    pub fn pull_through(ca: &Ca, origin: &Registry) -> Registry {
        let proxy = format!("proxy:\n  remoteurl: https://{}\n", origin.host());
        Registry::start_with(ca, RegistryAuth::Open, None, Some(proxy))
    }

    fn start_with(
        ca: &Ca,
        auth: RegistryAuth,
        redirect_to: Option<&str>,
        proxy: Option<String>,
    ) -> Registry {
        let dir = super::unique_dir("registry");
        let leaf = ca.server();
        std::fs::write(dir.join("cert.pem"), &leaf.cert_pem).unwrap();
        std::fs::write(dir.join("key.pem"), &leaf.key_pem).unwrap();
        let storage = dir.join("data");
        let port = free_port();
        let auth_yaml = match &auth {
            RegistryAuth::Open => String::new(),
            RegistryAuth::Basic { user, password } => {
                let out = Command::new("htpasswd")
                    .args(["-nbB", user, password])
                    .output()
                    .expect("htpasswd (Debian package apache2-utils) must be installed");
                assert!(out.status.success());
                std::fs::write(dir.join("htpasswd"), &out.stdout).unwrap();
                format!(
                    "auth:\n  htpasswd:\n    realm: nodestrap-test\n    path: {}\n",
                    dir.join("htpasswd").display()
                )
            }
            RegistryAuth::Token {
                realm,
                service,
                issuer,
                bundle,
            } => format!(
                "auth:\n  token:\n    realm: {realm}\n    service: {service}\n    issuer: {issuer}\n    rootcertbundle: {}\n",
                bundle.display()
            ),
        };
        let middleware = match redirect_to {
            Some(base) => format!(
                "middleware:\n  storage:\n    - name: redirect\n      options:\n        baseurl: {base}\n"
            ),
            None => String::new(),
        };
        let config = format!(
            "version: 0.1\nlog:\n  level: info\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n  tls:\n    certificate: {}\n    key: {}\n{auth_yaml}{middleware}{}",
            storage.display(),
            dir.join("cert.pem").display(),
            dir.join("key.pem").display(),
            proxy.unwrap_or_default(),
        );
        std::fs::write(dir.join("ca.pem"), &ca.pem).unwrap();
        std::fs::write(dir.join("config.yml"), config).unwrap();
        let log = std::fs::File::create(dir.join("registry.log")).unwrap();
        let child = Command::new("docker-registry")
            // A pull-through cache reaches its origin with Go's TLS: the test CA.
            .env("SSL_CERT_FILE", dir.join("ca.pem"))
            .arg("serve")
            .arg(dir.join("config.yml"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .expect("docker-registry (Debian package docker-registry) must be installed");
        let r = Registry {
            port,
            storage,
            dir,
            child,
        };
        let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                std::time::Instant::now() < until,
                "docker-registry did not listen: {}",
                r.log()
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        r
    }

    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("registry.log")).unwrap_or_default()
    }

    /// Where the registry keeps blob `sha256:<hex>`.
    pub fn blob(&self, hex: &str) -> PathBuf {
        self.storage
            .join("docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    /// A Docker config.json with `user:password` for this registry.
    pub fn auth_json(&self, user: &str, password: &str) -> PathBuf {
        use base64::Engine as _;
        let b = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        let p = self.dir.join(format!("auth-{user}.json"));
        std::fs::write(
            &p,
            format!(r#"{{"auths": {{"{}": {{"auth": "{b}"}}}}}}"#, self.host()),
        )
        .unwrap();
        p
    }

    /// deploy/publish-oci sysext SOURCE oci://HOST/PREFIX: its output.
    pub fn publish(
        &self,
        source: &Path,
        prefix: &str,
        auth: Option<&Path>,
        ca_file: &Path,
    ) -> String {
        self.publish_as("sysext", &[source], prefix, auth, ca_file)
    }

    /// deploy/publish-oci KIND SOURCES... oci://HOST/PREFIX: its output.
    pub fn publish_as(
        &self,
        kind: &str,
        sources: &[&Path],
        prefix: &str,
        auth: Option<&Path>,
        ca_file: &Path,
    ) -> String {
        let mut c = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/publish-oci"));
        c.arg(kind);
        if let Some(a) = auth {
            c.arg("--auth").arg(a);
        }
        let out = c
            .arg("--ca-file")
            .arg(ca_file)
            .args(sources)
            .arg(format!("oci://{}/{prefix}", self.host()))
            .output()
            .unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "publish-oci: {said}\n{}", self.log());
        said
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A token endpoint's signing key: ES256 JWTs whose `x5c` header carries a self-signed
/// certificate the registry trusts through its `rootcertbundle` (`bundle`).
pub struct TokenIssuer {
    key: ring::signature::EcdsaKeyPair,
    cert_der: Vec<u8>,
    pub bundle: PathBuf,
}

impl TokenIssuer {
    pub fn new(dir: &Path) -> TokenIssuer {
        let kp = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name
            .push(rcgen::DnType::CommonName, "nodestrap test token issuer");
        let cert = p.self_signed(&kp).unwrap();
        let bundle = dir.join("token-bundle.pem");
        std::fs::write(&bundle, cert.pem()).unwrap();
        let key = ring::signature::EcdsaKeyPair::from_pkcs8(
            &ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING,
            &kp.serialize_der(),
            &ring::rand::SystemRandom::new(),
        )
        .unwrap();
        TokenIssuer {
            key,
            cert_der: cert.der().to_vec(),
            bundle,
        }
    }

    /// A token of `issuer` for `service`, allowing pull and push on `repos`, valid `secs`.
    pub fn token(&self, issuer: &str, service: &str, repos: &[&str], secs: u64) -> String {
        use base64::Engine as _;
        let b64u = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let header =
            serde_json::json!({"typ": "JWT", "alg": "ES256", "x5c": [b64(&self.cert_der)]});
        let access: Vec<serde_json::Value> = repos
            .iter()
            .map(|r| serde_json::json!({"type": "repository", "name": r, "actions": ["pull", "push"]}))
            .collect();
        let claims = serde_json::json!({
            "iss": issuer, "sub": "node", "aud": service, "exp": now + secs,
            "nbf": now - 60, "iat": now - 60, "jti": format!("{now}-{secs}"), "access": access,
        });
        let signing_input = format!(
            "{}.{}",
            b64u(header.to_string().as_bytes()),
            b64u(claims.to_string().as_bytes())
        );
        let sig = self
            .key
            .sign(&ring::rand::SystemRandom::new(), signing_input.as_bytes())
            .unwrap();
        format!("{signing_input}.{}", b64u(sig.as_ref()))
    }
}
