//! A small Kubernetes API client: a kubeconfig or the pod's service account, `GET /version`,
//! ConfigMaps, merge-`PATCH` of a Node, and JSON calls whose status the caller decides on
//! (`Kube::call`). Credentials never reach a log line. The kubeconfig it reads:
//! `net/kubeconfig.rs`; the names it puts in paths: `net/names.rs`.

use std::path::Path;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::net::fetch::{Failure, FetchError, Http, Request};
use crate::net::kubeconfig::{b64, client_cert, run_exec, ExecCredential, Kubeconfig};
use crate::net::retry::Retry;
use crate::net::tls::Tls;
use crate::node::root::Root;

/// Conflict retries of a patch: CLUO's 4 steps from 10 ms, factor 5.
const CONFLICT_TRIES: u32 = 4;
const CONFLICT_FIRST_DELAY: Duration = Duration::from_millis(10);

pub(crate) struct Kube {
    http: Http,
    server: String,
    /// With `tls-server-name`: requests go to that name (resolved as the server's host), and
    /// carry the server's own host here, as kubectl's do.
    host_header: Option<String>,
    token: Option<Token>,
    /// Where the credentials came from, for messages.
    pub(crate) source: String,
}

/// A bearer token: given once, or the pod's projected service account token, which the
/// kubelet rotates in place; re-read at most once a minute, as client-go does, so a service
/// that runs for days keeps a valid one.
enum Token {
    Fixed(String),
    File {
        path: std::path::PathBuf,
        read: std::sync::Mutex<(String, std::time::Instant)>,
    },
}

/// How long a service account token read from its file is used before it is read again.
const TOKEN_REREAD: Duration = Duration::from_secs(60);

impl Token {
    fn value(&self) -> String {
        match self {
            Token::Fixed(t) => t.clone(),
            Token::File { path, read } => {
                let mut g = read.lock().unwrap_or_else(|e| e.into_inner());
                if g.1.elapsed() >= TOKEN_REREAD {
                    match read_token(path) {
                        Ok(t) => *g = (t, std::time::Instant::now()),
                        // The one read before stays in use; the API server says if it expired.
                        Err(e) => crate::warn!("{e}; using the token read before"),
                    }
                }
                g.0.clone()
            }
        }
    }
}

fn read_token(path: &Path) -> Result<String> {
    let t =
        crate::node::root::read_host_file(path, crate::node::root::CONFIG_CAP, "service account")
            .map_err(|e| e.with_kind(crate::error::Kind::Failed))?;
    let t = String::from_utf8_lossy(&t).trim().to_string();
    if t.is_empty() {
        return Err(Error::failed(format!(
            "service account {} is empty",
            path.display()
        )));
    }
    Ok(t)
}

/// What the API server answered a `Kube::call`: 2xx with its JSON, or one of the statuses the
/// caller asked to see (404 Not Found, 409 Conflict), with the server's message.
pub(crate) enum Reply {
    Ok(serde_json::Value),
    Status(u16, Error),
}

impl Kube {
    /// Client from a kubeconfig that lives on the node (`node_path` under `root`); files it
    /// names (CA, certificate, key, token) are node paths too, relative ones next to it.
    /// `Ok(None)` when the kubeconfig does not exist.
    pub(crate) fn from_kubeconfig(
        root: &Root,
        node_path: &str,
        retry: Retry,
    ) -> Result<Option<Kube>> {
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
            root.read(&np, crate::node::root::CONFIG_CAP)?
                .ok_or_else(|| {
                    Error::failed(format!(
                        "{name}: names {}, which does not exist",
                        root.show(&np)
                    ))
                })
        };
        let kc = Kubeconfig::parse(&text, &name)?;
        let mut tls = trust(&kc, root, &name, &read)?;
        if let Some(c) = client_pair(&kc, &name, &read)? {
            tls.client = Some(c);
        }
        let token = credential(&kc, (root, base), &name, &read, &mut tls)?;
        let mut k = Kube::new(&kc.server, tls, token, name, retry)?;
        if let Some(t) = &kc.tls_server_name {
            k = k.checked_as(t)?;
        }
        if let Some(p) = &kc.proxy {
            k.http = k
                .http
                .via_proxy(p)
                .map_err(|e| e.context(format!("{}: proxy-url", k.source)))?;
            crate::info!("{}: API server reached through proxy-url {p}", k.source);
        }
        Ok(Some(k))
    }

    /// The server reached at its address, its certificate checked as `t` (tls-server-name):
    /// https://HOST:PORT/... → https://NAME:PORT/..., NAME resolved as HOST.
    fn checked_as(self, t: &str) -> Result<Kube> {
        let mut k = self;
        let rest = k.server.strip_prefix("https://").ok_or_else(|| {
            Error::failed(format!(
                "{}: tls-server-name needs an https server",
                k.source
            ))
        })?;
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (host, port) = match authority.find(']') {
            // [v6] or [v6]:port
            Some(i) => (
                &authority[..=i],
                authority[i + 1..].strip_prefix(':').unwrap_or("443"),
            ),
            None => authority.split_once(':').unwrap_or((authority, "443")),
        };
        k.http = k.http.with_server_name(t, host);
        k.host_header = Some(authority.to_string());
        k.server = format!(
            "https://{t}:{port}{}",
            if path.is_empty() {
                String::new()
            } else {
                format!("/{path}")
            }
        );
        crate::info!(
            "{}: TLS checks the API server as {t} (tls-server-name)",
            k.source
        );
        Ok(k)
    }

    /// Client from the pod's service account, as client-go's in-cluster config does.
    pub(crate) fn in_cluster(retry: Retry) -> Result<Kube> {
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
        let dir = crate::node::seams::Seam::ServiceAccount.path();
        let token_path = dir.join("token");
        let token = read_token(&token_path)?;
        let ca = dir.join("ca.crt");
        let mut tls = Tls::default();
        tls.add_pem(
            &crate::node::root::read_host_file(
                &ca,
                crate::node::root::CONFIG_CAP,
                "service account",
            )
            .map_err(|e| e.with_kind(crate::error::Kind::Failed))?,
            &ca.display().to_string(),
        )?;
        let mut k = Kube::new(
            &format!("https://{host}:{port}"),
            tls,
            None,
            format!("the service account in {}", dir.display()),
            retry,
        )?;
        k.token = Some(Token::File {
            path: token_path,
            read: std::sync::Mutex::new((token, std::time::Instant::now())),
        });
        Ok(k)
    }

    /// An API server asked without credentials (`--api-server`): what anyone may read.
    pub(crate) fn anonymous(server: &str, tls: Tls, retry: Retry) -> Result<Kube> {
        let mut tls = tls;
        tls.fix = Some("--ca-file (a PEM file)".into());
        Kube::new(
            server,
            tls,
            None,
            format!("none (--api-server {server}; /version is public)"),
            retry,
        )
    }

    /// A client that sends a bearer `token` and trusts `tls` (kubeadm's token discovery).
    pub(crate) fn with_token(
        server: &str,
        tls: Tls,
        token: String,
        source: String,
        retry: Retry,
    ) -> Result<Kube> {
        Kube::new(server, tls, Some(token), source, retry)
    }

    fn new(
        server: &str,
        tls: Tls,
        token: Option<String>,
        source: String,
        retry: Retry,
    ) -> Result<Kube> {
        if !(server.starts_with("https://") || server.starts_with("http://")) {
            return Err(Error::failed(format!(
                "{source}: server {server:?} is not an http(s) URL"
            )));
        }
        let http = Http::new(&tls, retry);
        Ok(Kube {
            http,
            server: server.trim_end_matches('/').to_string(),
            host_header: None,
            token: token.map(Token::Fixed),
            source,
        })
    }

    fn request<'a>(
        &self,
        method: &'static str,
        url: &'a str,
        body: Option<(&'static str, Vec<u8>)>,
    ) -> Request<'a> {
        let mut headers = vec![("Accept".into(), "application/json".to_string())];
        if let Some(t) = &self.token {
            headers.push(("Authorization".into(), format!("Bearer {}", t.value())));
        }
        if let Some(h) = &self.host_header {
            headers.push(("Host".into(), h.clone()));
        }
        Request {
            method,
            url,
            headers,
            body,
        }
    }

    /// A GET's JSON; a failure says whether the server answered (`Failure`).
    fn get_json(&self, path: &str) -> std::result::Result<serde_json::Value, FetchError> {
        let url = format!("{}{path}", self.server);
        let body = self.http.fetch(&self.request("GET", &url, None), 8 << 20)?;
        serde_json::from_slice(&body).map_err(|e| FetchError {
            class: Failure::Final,
            error: Error::failed(format!("GET {url}: invalid JSON: {e}")),
        })
    }

    /// `GET /version` → `gitVersion`; a failure says whether the server answered.
    pub(crate) fn server_version(&self) -> std::result::Result<String, FetchError> {
        let v = self.get_json("/version")?;
        v.get("gitVersion")
            .and_then(|g| g.as_str())
            .filter(|g| !g.is_empty())
            .map(str::to_string)
            .ok_or_else(|| FetchError {
                class: Failure::Final,
                error: Error::failed(format!(
                    "GET {}/version: no gitVersion in the answer",
                    self.server
                )),
            })
    }

    /// A Node object.
    pub(crate) fn get_node(&self, name: &str) -> Result<serde_json::Value> {
        Ok(self.get_json(&format!("/api/v1/nodes/{name}"))?)
    }

    /// A ConfigMap's `data`, `None` when the API server says it does not exist (404).
    pub(crate) fn configmap(
        &self,
        ns: &str,
        name: &str,
    ) -> std::result::Result<Option<serde_json::Map<String, serde_json::Value>>, FetchError> {
        match self.get_json(&format!("/api/v1/namespaces/{ns}/configmaps/{name}")) {
            Ok(cm) => Ok(Some(
                cm.get("data")
                    .and_then(|d| d.as_object())
                    .cloned()
                    .unwrap_or_default(),
            )),
            Err(e) if e.class == Failure::Passed(404) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// One key of a ConfigMap; a missing or empty key is an error (`Failure::Final`), and so
    /// is a missing ConfigMap (its 404 names it).
    pub(crate) fn configmap_key(
        &self,
        ns: &str,
        name: &str,
        key: &str,
    ) -> std::result::Result<String, FetchError> {
        let path = format!("/api/v1/namespaces/{ns}/configmaps/{name}");
        let cm = self.get_json(&path)?;
        match cm
            .get("data")
            .and_then(|d| d.get(key))
            .and_then(|v| v.as_str())
        {
            Some(v) if !v.trim().is_empty() => Ok(v.to_string()),
            _ => Err(FetchError {
                class: Failure::Final,
                error: Error::failed(format!(
                    "ConfigMap {ns}/{name}: key {key:?} is missing or empty"
                )),
            }),
        }
    }

    /// JSON merge patch of a Node. A 409 Conflict is tried again a few times at short
    /// intervals; transport errors and 5xx follow the `Retry` given.
    pub(crate) fn patch_node(
        &self,
        name: &str,
        patch: &serde_json::Value,
    ) -> Result<serde_json::Value> {
        let url = format!("{}/api/v1/nodes/{name}", self.server);
        let body = patch.to_string().into_bytes();
        let req = self.request("PATCH", &url, Some(("application/merge-patch+json", body)));
        let mut delay = CONFLICT_FIRST_DELAY;
        let mut n = 0;
        loop {
            n += 1;
            let conflict = match self.http.fetch_passing(&req, 8 << 20, &[409]) {
                Ok(b) => {
                    return serde_json::from_slice(&b)
                        .map_err(|e| Error::failed(format!("PATCH {url}: invalid JSON: {e}")))
                }
                Err(FetchError {
                    class: Failure::Passed(409),
                    error,
                }) => error,
                Err(e) => return Err(e.into()),
            };
            if n >= CONFLICT_TRIES {
                return Err(
                    conflict.context(format!("still a conflict after {CONFLICT_TRIES} tries"))
                );
            }
            crate::warn!("{conflict}; trying again in {}ms", delay.as_millis());
            std::thread::sleep(delay);
            delay *= 5;
        }
    }
}

/// The trust anchors a kubeconfig names for its cluster.
fn trust(
    kc: &Kubeconfig,
    root: &Root,
    name: &str,
    read: &dyn Fn(&str) -> Result<Vec<u8>>,
) -> Result<Tls> {
    let mut tls = Tls::default();
    match (&kc.ca_data, &kc.ca_file) {
        (Some(d), _) => tls.add_pem(
            &b64(d, name, "certificate-authority-data")?,
            &format!("{name} certificate-authority-data"),
        )?,
        (None, Some(f)) => tls.add_pem(&read(f)?, &format!("{name} certificate-authority {f}"))?,
        // kubectl trusts the system roots when the kubeconfig names no CA.
        (None, None) => tls = Tls::system(root)?,
    }
    tls.fix = Some(format!(
        "certificate-authority-data (or certificate-authority) of the cluster in {name}"
    ));
    Ok(tls)
}

/// The client certificate and key a kubeconfig names, both or neither.
fn client_pair(
    kc: &Kubeconfig,
    name: &str,
    read: &dyn Fn(&str) -> Result<Vec<u8>>,
) -> Result<Option<ureq::tls::ClientCert>> {
    let cert = match (&kc.cert_data, &kc.cert_file) {
        (Some(d), _) => Some(b64(d, name, "client-certificate-data")?),
        (None, Some(f)) => Some(read(f)?),
        _ => None,
    };
    let key = match (&kc.key_data, &kc.key_file) {
        (Some(d), _) => Some(b64(d, name, "client-key-data")?),
        (None, Some(f)) => Some(read(f)?),
        _ => None,
    };
    match (cert, key) {
        (Some(c), Some(k)) => Ok(Some(client_cert(&c, &k, name)?)),
        (None, None) => Ok(None),
        _ => Err(Error::failed(format!(
            "{name}: a client certificate needs both a certificate and a key"
        ))),
    }
}

/// The kubeconfig's token, or its exec plugin's credential where it names none (a
/// certificate goes into `tls`); `base` is the kubeconfig's folder.
fn credential(
    kc: &Kubeconfig,
    (root, base): (&Root, &str),
    name: &str,
    read: &dyn Fn(&str) -> Result<Vec<u8>>,
    tls: &mut Tls,
) -> Result<Option<String>> {
    // client-go reads tokenFile and lets it win over token.
    let mut token = match (&kc.token_file, &kc.token) {
        (Some(f), _) => Some(String::from_utf8_lossy(&read(f)?).trim().to_string()),
        (None, Some(t)) => Some(t.clone()),
        _ => None,
    };
    if let Some(exec) = &kc.exec {
        // kubectl uses the plugin's credential where the kubeconfig gives none.
        // A relative command with a slash is relative to the kubeconfig's folder.
        let mut exec = exec.clone();
        if exec.command.contains('/') && !exec.command.starts_with('/') {
            exec.command = format!("{}/{}", root.show(base), exec.command);
        }
        match run_exec(&exec, kc, name)? {
            ExecCredential::Token(t) if token.is_none() => token = Some(t),
            ExecCredential::Cert(c, k) if tls.client.is_none() => {
                tls.client = Some(client_cert(&c, &k, &format!("{name} exec plugin"))?)
            }
            _ => {
                crate::debug!("{name}: exec plugin's credential not used: the kubeconfig names one")
            }
        }
    }
    Ok(token)
}

impl Kube {
    /// `method path` with an optional JSON body; 2xx is `Reply::Ok` with the answer's JSON, a
    /// status in `pass` is `Reply::Status`, anything else fails, saying why (`Failure`). Busy
    /// answers and broken connections follow this client's `Retry`.
    pub(crate) fn call(
        &self,
        method: &'static str,
        path: &str,
        body: Option<&serde_json::Value>,
        pass: &[u16],
    ) -> std::result::Result<Reply, FetchError> {
        self.call_as(method, path, "application/json", body, pass)
    }

    /// `call` with the body's media type given (a patch's: `application/merge-patch+json`,
    /// `application/strategic-merge-patch+json`).
    pub(crate) fn call_as(
        &self,
        method: &'static str,
        path: &str,
        content_type: &'static str,
        body: Option<&serde_json::Value>,
        pass: &[u16],
    ) -> std::result::Result<Reply, FetchError> {
        let url = format!("{}{path}", self.server);
        let body = body.map(|b| (content_type, b.to_string().into_bytes()));
        match self
            .http
            .fetch_passing(&self.request(method, &url, body), 8 << 20, pass)
        {
            Ok(b) => serde_json::from_slice(&b)
                .map(Reply::Ok)
                .map_err(|e| FetchError {
                    class: Failure::Final,
                    error: Error::failed(format!("{method} {url}: invalid JSON: {e}")),
                }),
            Err(FetchError {
                class: Failure::Passed(status),
                error,
            }) => Ok(Reply::Status(status, error)),
            Err(e) => Err(e),
        }
    }
}

/// The API client: `--kubeconfig` (a pod path), else the pod's service account.
pub(crate) fn api_client(kubeconfig: Option<&Path>, pod: &Root, retry: Retry) -> Result<Kube> {
    match kubeconfig {
        Some(p) => {
            let p = p.to_string_lossy();
            Kube::from_kubeconfig(pod, &p, retry)?
                .ok_or_else(|| Error::config(format!("--kubeconfig {p}: does not exist")))
        }
        None => Kube::in_cluster(retry),
    }
}
