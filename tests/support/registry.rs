//! Debian's real OCI registry (`docker-registry`, distribution 2.8) on 127.0.0.1, with TLS from
//! the test CA and Basic auth from an htpasswd file `htpasswd -B` makes, or Bearer tokens a
//! test's own token endpoint issues (distribution only consumes tokens: it checks their
//! signature against a certificate bundle). Its redirect middleware can send blob downloads to
//! another server, as a registry in front of object storage does. Files reach it through
//! deploy/publish-sysext-oci, the script operators use.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::cluster::free_port;
use super::pki::Ca;

pub enum RegistryAuth {
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
        let dir = super::unique_dir("registry");
        let leaf = ca.server();
        std::fs::write(dir.join("cert.pem"), &leaf.cert_pem).unwrap();
        std::fs::write(dir.join("key.pem"), &leaf.key_pem).unwrap();
        let storage = dir.join("data");
        let port = free_port();
        let auth_yaml = match &auth {
            RegistryAuth::Basic { user, password } => {
                let out = Command::new("htpasswd")
                    .args(["-nbB", user, password])
                    .output()
                    .expect("htpasswd (Debian package apache2-utils) must be installed");
                assert!(out.status.success());
                std::fs::write(dir.join("htpasswd"), &out.stdout).unwrap();
                format!(
                    "  htpasswd:\n    realm: nodestrap-test\n    path: {}\n",
                    dir.join("htpasswd").display()
                )
            }
            RegistryAuth::Token {
                realm,
                service,
                issuer,
                bundle,
            } => format!(
                "  token:\n    realm: {realm}\n    service: {service}\n    issuer: {issuer}\n    rootcertbundle: {}\n",
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
            "version: 0.1\nlog:\n  level: info\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n  tls:\n    certificate: {}\n    key: {}\nauth:\n{auth_yaml}{middleware}",
            storage.display(),
            dir.join("cert.pem").display(),
            dir.join("key.pem").display(),
        );
        std::fs::write(dir.join("config.yml"), config).unwrap();
        let log = std::fs::File::create(dir.join("registry.log")).unwrap();
        let child = Command::new("docker-registry")
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

    /// deploy/publish-sysext-oci SOURCE oci://HOST/PREFIX: its output.
    pub fn publish(
        &self,
        source: &Path,
        prefix: &str,
        auth: Option<&Path>,
        ca_file: &Path,
    ) -> String {
        let mut c = Command::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/deploy/publish-sysext-oci"
        ));
        if let Some(a) = auth {
            c.arg("--auth").arg(a);
        }
        let out = c
            .arg("--ca-file")
            .arg(ca_file)
            .arg(source)
            .arg(format!("oci://{}/{prefix}", self.host()))
            .output()
            .unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success(),
            "publish-sysext-oci: {said}\n{}",
            self.log()
        );
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
