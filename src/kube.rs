//! A small Kubernetes API client: a kubeconfig or the pod's service account, `GET /version`,
//! ConfigMaps and merge-`PATCH` of a Node. Credentials never reach a log line.

use std::time::Duration;

use base64::Engine as _;
use ureq::tls::{ClientCert, PemItem};

use crate::error::{Error, Result};
use crate::fetch::{Backoff, Http, Request, Retry, Tls};
use crate::root::Root;
use crate::yaml;

const SA_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// Test hook: the integration tests put a service account directory elsewhere.
const SA_DIR_ENV: &str = "NODESTRAP_SA_DIR";
/// Conflict retries of a patch: CLUO's 4 steps from 10 ms, factor 5.
const CONFLICT_TRIES: u32 = 4;
const CONFLICT_FIRST_DELAY: Duration = Duration::from_millis(10);

pub struct Kube {
    http: Http,
    server: String,
    token: Option<String>,
    /// Where the credentials came from, for messages.
    pub source: String,
}

/// How many tries and how far apart (tectonic-torcx: 3 tries, 10 s).
#[derive(Clone, Copy)]
pub struct ApiRetry {
    pub tries: u32,
    pub delay: Duration,
}

impl Kube {
    /// Client from a kubeconfig that lives on the node (`node_path` under `root`); files it
    /// names (CA, certificate, key, token) are node paths too, relative ones next to it.
    /// `Ok(None)` when the kubeconfig does not exist.
    pub fn from_kubeconfig(root: &Root, node_path: &str, retry: ApiRetry) -> Result<Option<Kube>> {
        let name = root.show(node_path);
        let Some(text) = root.read_text(node_path)? else {
            return Ok(None);
        };
        let base = node_path.rsplit_once('/').map(|(d, _)| d).unwrap_or("");
        let read = |p: &str| -> Result<Vec<u8>> {
            let np = if p.starts_with('/') {
                p.to_string()
            } else {
                format!("{base}/{p}")
            };
            root.read(&np, crate::root::CONFIG_CAP)?.ok_or_else(|| {
                Error::failed(format!(
                    "{name}: names {}, which does not exist",
                    root.show(&np)
                ))
            })
        };
        let kc = Kubeconfig::parse(&text, &name)?;
        let mut tls = Tls::default();
        match (&kc.ca_data, &kc.ca_file) {
            (Some(d), _) => tls.add_pem(
                &b64(d, &name, "certificate-authority-data")?,
                &format!("{name} certificate-authority-data"),
            )?,
            (None, Some(f)) => {
                tls.add_pem(&read(f)?, &format!("{name} certificate-authority {f}"))?
            }
            // kubectl trusts the system roots when the kubeconfig names no CA.
            (None, None) => tls = Tls::system(root)?,
        }
        let cert = match (&kc.cert_data, &kc.cert_file) {
            (Some(d), _) => Some(b64(d, &name, "client-certificate-data")?),
            (None, Some(f)) => Some(read(f)?),
            _ => None,
        };
        let key = match (&kc.key_data, &kc.key_file) {
            (Some(d), _) => Some(b64(d, &name, "client-key-data")?),
            (None, Some(f)) => Some(read(f)?),
            _ => None,
        };
        match (cert, key) {
            (Some(c), Some(k)) => tls.client = Some(client_cert(&c, &k, &name)?),
            (None, None) => {}
            _ => {
                return Err(Error::failed(format!(
                    "{name}: a client certificate needs both a certificate and a key"
                )))
            }
        }
        let token = match (&kc.token, &kc.token_file) {
            (Some(t), _) => Some(t.clone()),
            (None, Some(f)) => Some(String::from_utf8_lossy(&read(f)?).trim().to_string()),
            _ => None,
        };
        Ok(Some(Kube::new(&kc.server, tls, token, name, retry)?))
    }

    /// Client from the pod's service account, as client-go's in-cluster config does.
    pub fn in_cluster(retry: ApiRetry) -> Result<Kube> {
        let host = std::env::var("KUBERNETES_SERVICE_HOST")
            .ok()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| {
                Error::config(
                    "no --kubeconfig and KUBERNETES_SERVICE_HOST is not set (not in a pod?)",
                )
            })?;
        let port = std::env::var("KUBERNETES_SERVICE_PORT")
            .ok()
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| "443".into());
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host
        };
        let dir = std::env::var(SA_DIR_ENV).unwrap_or_else(|_| SA_DIR.into());
        let read = |name: &str| -> Result<Vec<u8>> {
            let p = format!("{dir}/{name}");
            crate::root::read_host_file(
                std::path::Path::new(&p),
                crate::root::CONFIG_CAP,
                "service account",
            )
            .map_err(|e| e.with_kind(crate::error::Kind::Failed))
        };
        let token = String::from_utf8_lossy(&read("token")?).trim().to_string();
        if token.is_empty() {
            return Err(Error::failed(format!(
                "service account {dir}/token is empty"
            )));
        }
        let mut tls = Tls::default();
        tls.add_pem(&read("ca.crt")?, &format!("{dir}/ca.crt"))?;
        Kube::new(
            &format!("https://{host}:{port}"),
            tls,
            Some(token),
            format!("the service account in {dir}"),
            retry,
        )
    }

    fn new(
        server: &str,
        tls: Tls,
        token: Option<String>,
        source: String,
        retry: ApiRetry,
    ) -> Result<Kube> {
        if !(server.starts_with("https://") || server.starts_with("http://")) {
            return Err(Error::failed(format!(
                "{source}: server {server:?} is not an http(s) URL"
            )));
        }
        let http = Http::new(
            &tls,
            Retry {
                attempts: retry.tries.max(1),
                backoff: Backoff::Fixed(retry.delay),
                budget: Duration::MAX,
            },
        );
        Ok(Kube {
            http,
            server: server.trim_end_matches('/').to_string(),
            token,
            source,
        })
    }

    fn request<'a>(
        &self,
        method: &'static str,
        url: &'a str,
        body: Option<(&'static str, Vec<u8>)>,
    ) -> Request<'a> {
        let mut headers = vec![("Accept", "application/json".to_string())];
        if let Some(t) = &self.token {
            headers.push(("Authorization", format!("Bearer {t}")));
        }
        Request {
            method,
            url,
            headers,
            body,
        }
    }

    fn get_json(&self, path: &str) -> Result<serde_json::Value> {
        let url = format!("{}{path}", self.server);
        let body = self.http.fetch(&self.request("GET", &url, None), 8 << 20)?;
        serde_json::from_slice(&body)
            .map_err(|e| Error::failed(format!("GET {url}: invalid JSON: {e}")))
    }

    /// `GET /version` → `gitVersion`.
    pub fn server_version(&self) -> Result<String> {
        let v = self.get_json("/version")?;
        v.get("gitVersion")
            .and_then(|g| g.as_str())
            .filter(|g| !g.is_empty())
            .map(str::to_string)
            .ok_or_else(|| {
                Error::failed(format!(
                    "GET {}/version: no gitVersion in the answer",
                    self.server
                ))
            })
    }

    /// A Node object.
    pub fn get_node(&self, name: &str) -> Result<serde_json::Value> {
        self.get_json(&format!("/api/v1/nodes/{name}"))
    }

    /// One key of a ConfigMap; a missing or empty key is an error.
    pub fn configmap_key(&self, ns: &str, name: &str, key: &str) -> Result<String> {
        let path = format!("/api/v1/namespaces/{ns}/configmaps/{name}");
        let cm = self.get_json(&path)?;
        match cm
            .get("data")
            .and_then(|d| d.get(key))
            .and_then(|v| v.as_str())
        {
            Some(v) if !v.trim().is_empty() => Ok(v.to_string()),
            _ => Err(Error::failed(format!(
                "ConfigMap {ns}/{name}: key {key:?} is missing or empty"
            ))),
        }
    }

    /// JSON merge patch of a Node. A 409 Conflict is tried again a few times at short
    /// intervals; transport errors and 5xx follow the `ApiRetry` rule.
    pub fn patch_node(&self, name: &str, patch: &serde_json::Value) -> Result<serde_json::Value> {
        let url = format!("{}/api/v1/nodes/{name}", self.server);
        let body = patch.to_string().into_bytes();
        let req = self.request("PATCH", &url, Some(("application/merge-patch+json", body)));
        let mut delay = CONFLICT_FIRST_DELAY;
        let mut n = 0;
        loop {
            n += 1;
            match self.http.fetch_passing(&req, 8 << 20, &[409])? {
                Ok(b) => {
                    return serde_json::from_slice(&b)
                        .map_err(|e| Error::failed(format!("PATCH {url}: invalid JSON: {e}")))
                }
                Err(e) if n < CONFLICT_TRIES => {
                    log::warn!("{e}; trying again in {}ms", delay.as_millis());
                    std::thread::sleep(delay);
                    delay *= 5;
                }
                Err(e) => {
                    return Err(e.context(format!("still a conflict after {CONFLICT_TRIES} tries")))
                }
            }
        }
    }
}

fn b64(s: &str, name: &str, field: &str) -> Result<Vec<u8>> {
    let clean: String = s.split_whitespace().collect();
    base64::engine::general_purpose::STANDARD
        .decode(clean)
        .map_err(|e| Error::failed(format!("{name}: {field}: invalid base64: {e}")))
}

fn client_cert(cert_pem: &[u8], key_pem: &[u8], name: &str) -> Result<ClientCert> {
    let mut certs = Vec::new();
    for item in ureq::tls::parse_pem(cert_pem) {
        if let Ok(PemItem::Certificate(c)) = item {
            certs.push(c);
        }
    }
    if certs.is_empty() {
        return Err(Error::failed(format!(
            "{name}: client certificate holds no PEM certificate"
        )));
    }
    let key = ureq::tls::parse_pem(key_pem)
        .find_map(|i| match i {
            Ok(PemItem::PrivateKey(k)) => Some(k),
            _ => None,
        })
        .ok_or_else(|| Error::failed(format!("{name}: client key holds no PEM private key")))?;
    Ok(ClientCert::new_with_certs(&certs, key))
}

/// The fields of a kubeconfig that matter for one connection. Not `Debug`: it holds secrets.
#[derive(Default, PartialEq)]
pub struct Kubeconfig {
    pub server: String,
    pub ca_data: Option<String>,
    pub ca_file: Option<String>,
    pub cert_data: Option<String>,
    pub cert_file: Option<String>,
    pub key_data: Option<String>,
    pub key_file: Option<String>,
    pub token: Option<String>,
    pub token_file: Option<String>,
}

impl std::fmt::Debug for Kubeconfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let redacted = |o: &Option<String>| o.as_ref().map(|_| "<redacted>");
        f.debug_struct("Kubeconfig")
            .field("server", &self.server)
            .field("ca_file", &self.ca_file)
            .field("cert_file", &self.cert_file)
            .field("key_data", &redacted(&self.key_data))
            .field("token", &redacted(&self.token))
            .finish_non_exhaustive()
    }
}

impl Kubeconfig {
    pub fn parse(text: &str, name: &str) -> Result<Kubeconfig> {
        let doc = yaml::parse(text, name)?;
        let named = |list: &str| -> Result<Vec<(String, &yaml_rust2::Yaml)>> {
            yaml::items(&doc[list], name, list)?
                .iter()
                .map(|e| Ok((yaml::opt_str(e, "name", name)?.unwrap_or_default(), e)))
                .collect()
        };
        let contexts = named("contexts")?;
        let clusters = named("clusters")?;
        let users = named("users")?;
        let current = yaml::opt_str(&doc, "current-context", name)?.filter(|c| !c.is_empty());
        // Tectonic's kubeconfig has one unnamed context and no current-context: take the only one.
        let (cluster_name, user_name) = match (&current, contexts.len()) {
            (Some(c), _) => {
                let ctx = contexts.iter().find(|(n, _)| n == c).ok_or_else(|| {
                    Error::failed(format!(
                        "{name}: current-context {c:?} is not among the contexts"
                    ))
                })?;
                context_refs(ctx.1, name)?
            }
            (None, 1) => context_refs(contexts[0].1, name)?,
            (None, 0) if clusters.len() == 1 && users.len() <= 1 => (
                clusters[0].0.clone(),
                users.first().map(|u| u.0.clone()).unwrap_or_default(),
            ),
            (None, n) => {
                return Err(Error::failed(format!(
                    "{name}: no current-context and {n} contexts to choose from"
                )))
            }
        };
        let cluster = clusters
            .iter()
            .find(|(n, _)| *n == cluster_name)
            .ok_or_else(|| Error::failed(format!("{name}: cluster {cluster_name:?} not found")))?
            .1;
        let c = &cluster["cluster"];
        let server = yaml::opt_str(c, "server", name)?
            .filter(|s| !s.is_empty())
            .ok_or_else(|| {
                Error::failed(format!("{name}: cluster {cluster_name:?} has no server"))
            })?;
        if matches!(
            yaml::opt_str(c, "insecure-skip-tls-verify", name)?.as_deref(),
            Some("true")
        ) {
            return Err(Error::failed(format!(
                "{name}: insecure-skip-tls-verify is refused: name a certificate-authority"
            )));
        }
        let mut kc = Kubeconfig {
            server,
            ca_data: yaml::opt_str(c, "certificate-authority-data", name)?,
            ca_file: yaml::opt_str(c, "certificate-authority", name)?,
            ..Default::default()
        };
        if !user_name.is_empty() || !users.is_empty() {
            let user = users
                .iter()
                .find(|(n, _)| *n == user_name)
                .ok_or_else(|| Error::failed(format!("{name}: user {user_name:?} not found")))?
                .1;
            let u = &user["user"];
            kc.cert_data = yaml::opt_str(u, "client-certificate-data", name)?;
            kc.cert_file = yaml::opt_str(u, "client-certificate", name)?;
            kc.key_data = yaml::opt_str(u, "client-key-data", name)?;
            kc.key_file = yaml::opt_str(u, "client-key", name)?;
            kc.token = yaml::opt_str(u, "token", name)?;
            kc.token_file = yaml::opt_str(u, "tokenFile", name)?;
        }
        Ok(kc)
    }
}

fn context_refs(ctx: &yaml_rust2::Yaml, name: &str) -> Result<(String, String)> {
    let c = &ctx["context"];
    let cluster = yaml::opt_str(c, "cluster", name)?.unwrap_or_default();
    let user = yaml::opt_str(c, "user", name)?.unwrap_or_default();
    Ok((cluster, user))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tectonic_unnamed_context() {
        let t = "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    server: https://10.0.0.1:443\n    certificate-authority-data: Zm9v\nusers:\n- name: kubelet\n  user:\n    client-certificate-data: YQ==\n    client-key-data: Yg==\ncontexts:\n- context:\n    cluster: local\n    user: kubelet\n";
        let kc = Kubeconfig::parse(t, "kc").unwrap();
        assert_eq!(kc.server, "https://10.0.0.1:443");
        assert_eq!(kc.ca_data.as_deref(), Some("Zm9v"));
        assert_eq!(kc.key_data.as_deref(), Some("Yg=="));
    }

    #[test]
    fn current_context_and_errors() {
        let t = "clusters:\n- name: a\n  cluster: {server: 'https://a'}\n- name: b\n  cluster: {server: 'https://b', certificate-authority: ca.pem}\nusers:\n- name: u\n  user: {token: s3cret}\ncontexts:\n- name: x\n  context: {cluster: a, user: u}\n- name: y\n  context: {cluster: b, user: u}\ncurrent-context: y\n";
        let kc = Kubeconfig::parse(t, "kc").unwrap();
        assert_eq!(kc.server, "https://b");
        assert_eq!(kc.ca_file.as_deref(), Some("ca.pem"));
        assert_eq!(kc.token.as_deref(), Some("s3cret"));
        let no_current = t.replace("current-context: y\n", "");
        assert!(Kubeconfig::parse(&no_current, "kc")
            .unwrap_err()
            .to_string()
            .contains("no current-context and 2 contexts"));
        assert!(Kubeconfig::parse("clusters: 5\n", "kc").is_err());
        assert!(Kubeconfig::parse("{", "kc")
            .unwrap_err()
            .to_string()
            .contains("kc: invalid YAML"));
    }
}
