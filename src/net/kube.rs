//! A small Kubernetes API client: a kubeconfig or the pod's service account, `GET /version`,
//! ConfigMaps, merge-`PATCH` of a Node, and JSON calls whose status the caller decides on
//! (`Kube::call`). Credentials never reach a log line.

use std::path::Path;
use std::time::Duration;

use base64::Engine as _;
use ureq::tls::{ClientCert, PemItem};

use crate::error::{Error, Result};
use crate::net::fetch::{Failure, Http, Request};
use crate::net::retry::Retry;
use crate::net::tls::Tls;
use crate::node::exec::{self, Command, Env};
use crate::node::root::Root;
use crate::yaml;

/// Conflict retries of a patch: CLUO's 4 steps from 10 ms, factor 5.
const CONFLICT_TRIES: u32 = 4;
const CONFLICT_FIRST_DELAY: Duration = Duration::from_millis(10);

pub struct Kube {
    http: Http,
    server: String,
    /// With `tls-server-name`: requests go to that name (resolved as the server's host), and
    /// carry the server's own host here, as kubectl's do.
    host_header: Option<String>,
    token: Option<Token>,
    /// Where the credentials came from, for messages.
    pub source: String,
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
                        Err(e) => log::warn!("{e}; using the token read before"),
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
pub enum Reply {
    Ok(serde_json::Value),
    Status(u16, Error),
}

impl Kube {
    /// Client from a kubeconfig that lives on the node (`node_path` under `root`); files it
    /// names (CA, certificate, key, token) are node paths too, relative ones next to it.
    /// `Ok(None)` when the kubeconfig does not exist.
    pub fn from_kubeconfig(root: &Root, node_path: &str, retry: Retry) -> Result<Option<Kube>> {
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
        tls.fix = Some(format!(
            "certificate-authority-data (or certificate-authority) of the cluster in {name}"
        ));
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
            match run_exec(&exec, &kc, &name)? {
                ExecCredential::Token(t) if token.is_none() => token = Some(t),
                ExecCredential::Cert(c, k) if tls.client.is_none() => {
                    tls.client = Some(client_cert(&c, &k, &format!("{name} exec plugin"))?)
                }
                _ => crate::debug!(
                    "{name}: exec plugin's credential not used: the kubeconfig names one"
                ),
            }
        }
        let mut k = Kube::new(&kc.server, tls, token, name, retry)?;
        if let Some(t) = &kc.tls_server_name {
            // https://HOST:PORT/... → https://NAME:PORT/..., NAME resolved as HOST.
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
            log::info!(
                "{}: TLS checks the API server as {t} (tls-server-name)",
                k.source
            );
        }
        if let Some(p) = &kc.proxy {
            k.http = k
                .http
                .via_proxy(p)
                .map_err(|e| e.context(format!("{}: proxy-url", k.source)))?;
            log::info!("{}: API server reached through proxy-url {p}", k.source);
        }
        Ok(Some(k))
    }

    /// Client from the pod's service account, as client-go's in-cluster config does.
    pub fn in_cluster(retry: Retry) -> Result<Kube> {
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
    pub fn anonymous(server: &str, tls: Tls, retry: Retry) -> Result<Kube> {
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
    pub fn with_token(
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
        let mut headers = vec![("Accept", "application/json".to_string())];
        if let Some(t) = &self.token {
            headers.push(("Authorization", format!("Bearer {}", t.value())));
        }
        if let Some(h) = &self.host_header {
            headers.push(("Host", h.clone()));
        }
        Request {
            method,
            url,
            headers,
            body,
        }
    }

    fn get_json(&self, path: &str) -> Result<serde_json::Value> {
        self.get_json_why(path).map_err(|(e, _)| e)
    }

    /// `get_json`, saying whether the server answered (`Failure`).
    fn get_json_why(&self, path: &str) -> std::result::Result<serde_json::Value, (Error, Failure)> {
        let url = format!("{}{path}", self.server);
        let body = self
            .http
            .fetch_why(&self.request("GET", &url, None), 8 << 20)?;
        serde_json::from_slice(&body).map_err(|e| {
            (
                Error::failed(format!("GET {url}: invalid JSON: {e}")),
                Failure::Final,
            )
        })
    }

    /// `GET /version` → `gitVersion`; a failure says whether the server answered.
    pub fn server_version(&self) -> std::result::Result<String, (Error, Failure)> {
        let v = self.get_json_why("/version")?;
        v.get("gitVersion")
            .and_then(|g| g.as_str())
            .filter(|g| !g.is_empty())
            .map(str::to_string)
            .ok_or_else(|| {
                (
                    Error::failed(format!(
                        "GET {}/version: no gitVersion in the answer",
                        self.server
                    )),
                    Failure::Final,
                )
            })
    }

    /// A Node object.
    pub fn get_node(&self, name: &str) -> Result<serde_json::Value> {
        self.get_json(&format!("/api/v1/nodes/{name}"))
    }

    /// One key of a ConfigMap; a missing or empty key is an error (`Failure::Final`), and so
    /// is a missing ConfigMap (its 404 names it).
    pub fn configmap_key(
        &self,
        ns: &str,
        name: &str,
        key: &str,
    ) -> std::result::Result<String, (Error, Failure)> {
        let path = format!("/api/v1/namespaces/{ns}/configmaps/{name}");
        let cm = self.get_json_why(&path)?;
        match cm
            .get("data")
            .and_then(|d| d.get(key))
            .and_then(|v| v.as_str())
        {
            Some(v) if !v.trim().is_empty() => Ok(v.to_string()),
            _ => Err((
                Error::failed(format!(
                    "ConfigMap {ns}/{name}: key {key:?} is missing or empty"
                )),
                Failure::Final,
            )),
        }
    }

    /// JSON merge patch of a Node. A 409 Conflict is tried again a few times at short
    /// intervals; transport errors and 5xx follow the `Retry` given.
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

impl Kube {
    /// `method path` with an optional JSON body; 2xx is `Reply::Ok` with the answer's JSON, a
    /// status in `pass` is `Reply::Status`, anything else fails, saying why (`Failure`). Busy
    /// answers and broken connections follow this client's `Retry`.
    pub fn call(
        &self,
        method: &'static str,
        path: &str,
        body: Option<&serde_json::Value>,
        pass: &[u16],
    ) -> std::result::Result<Reply, (Error, Failure)> {
        let url = format!("{}{path}", self.server);
        let body = body.map(|b| ("application/json", b.to_string().into_bytes()));
        match self
            .http
            .fetch_status(&self.request(method, &url, body), 8 << 20, pass)?
        {
            Ok(b) => serde_json::from_slice(&b).map(Reply::Ok).map_err(|e| {
                (
                    Error::failed(format!("{method} {url}: invalid JSON: {e}")),
                    Failure::Final,
                )
            }),
            Err((status, e)) => Ok(Reply::Status(status, e)),
        }
    }
}

pub(crate) fn b64(s: &str, name: &str, field: &str) -> Result<Vec<u8>> {
    let clean: String = s.split_whitespace().collect();
    base64::engine::general_purpose::STANDARD
        .decode(clean)
        .map_err(|e| Error::failed(format!("{name}: {field}: invalid base64: {e}")))
}

pub fn client_cert(cert_pem: &[u8], key_pem: &[u8], name: &str) -> Result<ClientCert> {
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
    /// `proxy-url` of the cluster: http or https.
    pub proxy: Option<String>,
    /// `tls-server-name`: the name TLS sends and checks instead of the server URL's host.
    pub tls_server_name: Option<String>,
    pub exec: Option<Exec>,
}

/// A `client.authentication.k8s.io` credential plugin (`users[].user.exec`).
#[derive(Debug, Default, PartialEq, Clone)]
pub struct Exec {
    pub api_version: String,
    pub command: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub install_hint: Option<String>,
    pub provide_cluster_info: bool,
}

/// Fields of the chosen cluster, user and context that nodestrap implements; any other one is
/// refused by name (a request without the credential kubectl would send is no answer).
const CLUSTER_FIELDS: &[&str] = &[
    "server",
    "certificate-authority",
    "certificate-authority-data",
    "proxy-url",
    "tls-server-name",
    "insecure-skip-tls-verify",
    "disable-compression",
    "extensions",
];
const USER_FIELDS: &[&str] = &[
    "client-certificate",
    "client-certificate-data",
    "client-key",
    "client-key-data",
    "token",
    "tokenFile",
    "exec",
    "extensions",
];
const CONTEXT_FIELDS: &[&str] = &["cluster", "user", "namespace", "extensions"];
const EXEC_FIELDS: &[&str] = &[
    "apiVersion",
    "command",
    "args",
    "env",
    "installHint",
    "provideClusterInfo",
    "interactiveMode",
];
/// The exec credential API versions kubectl 1.32 speaks (v1alpha1 is gone from it).
pub(crate) const EXEC_VERSIONS: &[&str] = &[
    "client.authentication.k8s.io/v1",
    "client.authentication.k8s.io/v1beta1",
];

/// Refuse any key of `y` outside `known`, naming it and where it is.
fn only_known(y: &yaml_rust2::Yaml, known: &[&str], name: &str, what: &str) -> Result<()> {
    let yaml_rust2::Yaml::Hash(h) = y else {
        return Ok(());
    };
    for k in h.keys() {
        let k = yaml::scalar(k).unwrap_or_default();
        if !known.contains(&k.as_str()) {
            return Err(Error::failed(format!(
                "{name}: {what}: field {:?} is not supported by nodestrap; refused rather than ignored",
                crate::error::excerpt(&k, 64)
            )));
        }
    }
    Ok(())
}

/// Both `FIELD` and `FIELD-data`: kubectl refuses such an entry, and so does nodestrap.
fn not_both(
    data: &Option<String>,
    file: &Option<String>,
    field: &str,
    name: &str,
    what: &str,
) -> Result<()> {
    if data.is_some() && file.is_some() {
        return Err(Error::failed(format!(
            "{name}: {what}: {field}-data and {field} are both set (kubectl refuses this too)"
        )));
    }
    Ok(())
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
        // client-go uses the context `current-context` names and, without one, none at all.
        // The one difference on purpose: Tectonic's kubeconfig has a single context without a
        // name and no current-context, and nodestrap takes that one.
        let ctx = match (&current, contexts.as_slice()) {
            (Some(c), _) => contexts.iter().find(|(n, _)| n == c).ok_or_else(|| {
                Error::failed(format!(
                    "{name}: current-context {c:?} is not among the contexts"
                ))
            })?,
            (None, [only]) if only.0.is_empty() => only,
            (None, _) => {
                return Err(Error::failed(format!(
                    "{name}: no current-context, so kubectl would use no context (and no server); set current-context ({} contexts)",
                    contexts.len()
                )))
            }
        };
        let what_ctx = format!("context {:?}", ctx.0);
        only_known(&ctx.1["context"], CONTEXT_FIELDS, name, &what_ctx)?;
        let (cluster_name, user_name) = context_refs(ctx.1, name)?;
        let cluster = clusters
            .iter()
            .find(|(n, _)| *n == cluster_name)
            .ok_or_else(|| Error::failed(format!("{name}: cluster {cluster_name:?} not found")))?
            .1;
        let c = &cluster["cluster"];
        let what_cluster = format!("cluster {cluster_name:?}");
        only_known(c, CLUSTER_FIELDS, name, &what_cluster)?;
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
                "{name}: {what_cluster}: insecure-skip-tls-verify is refused: name a certificate-authority"
            )));
        }
        let proxy = yaml::opt_str(c, "proxy-url", name)?.filter(|p| !p.is_empty());
        if let Some(p) = &proxy {
            if !(p.starts_with("http://") || p.starts_with("https://")) {
                return Err(Error::failed(format!(
                    "{name}: {what_cluster}: proxy-url {:?}: only http and https proxies are supported (not socks)",
                    crate::error::excerpt(p, 80)
                )));
            }
        }
        let tls_server_name = yaml::opt_str(c, "tls-server-name", name)?.filter(|t| !t.is_empty());
        if let Some(t) = &tls_server_name {
            if !dns_subdomain(t) {
                return Err(Error::failed(format!(
                    "{name}: {what_cluster}: tls-server-name {:?} is not a DNS name",
                    crate::error::excerpt(t, 80)
                )));
            }
            if proxy.is_some() {
                return Err(Error::failed(format!(
                    "{name}: {what_cluster}: tls-server-name together with proxy-url is not supported by nodestrap"
                )));
            }
        }
        let mut kc = Kubeconfig {
            server,
            ca_data: yaml::opt_str(c, "certificate-authority-data", name)?,
            ca_file: yaml::opt_str(c, "certificate-authority", name)?,
            proxy,
            tls_server_name,
            ..Default::default()
        };
        not_both(
            &kc.ca_data,
            &kc.ca_file,
            "certificate-authority",
            name,
            &what_cluster,
        )?;
        if !user_name.is_empty() {
            let user = users
                .iter()
                .find(|(n, _)| *n == user_name)
                .ok_or_else(|| Error::failed(format!("{name}: user {user_name:?} not found")))?
                .1;
            let u = &user["user"];
            let what_user = format!("user {user_name:?}");
            only_known(u, USER_FIELDS, name, &what_user)?;
            kc.cert_data = yaml::opt_str(u, "client-certificate-data", name)?;
            kc.cert_file = yaml::opt_str(u, "client-certificate", name)?;
            kc.key_data = yaml::opt_str(u, "client-key-data", name)?;
            kc.key_file = yaml::opt_str(u, "client-key", name)?;
            kc.token = yaml::opt_str(u, "token", name)?.filter(|t| !t.is_empty());
            kc.token_file = yaml::opt_str(u, "tokenFile", name)?.filter(|t| !t.is_empty());
            not_both(
                &kc.cert_data,
                &kc.cert_file,
                "client-certificate",
                name,
                &what_user,
            )?;
            not_both(&kc.key_data, &kc.key_file, "client-key", name, &what_user)?;
            kc.exec = match &u["exec"] {
                yaml_rust2::Yaml::BadValue | yaml_rust2::Yaml::Null => None,
                e => Some(Exec::parse(e, name, &what_user)?),
            };
        }
        Ok(kc)
    }
}

impl Exec {
    fn parse(e: &yaml_rust2::Yaml, name: &str, what: &str) -> Result<Exec> {
        let what = format!("{what}: exec");
        only_known(e, EXEC_FIELDS, name, &what)?;
        let err = |m: String| Error::failed(format!("{name}: {what}: {m}"));
        let api_version = yaml::opt_str(e, "apiVersion", name)?.unwrap_or_default();
        if !EXEC_VERSIONS.contains(&api_version.as_str()) {
            return Err(err(format!(
                "apiVersion {:?}: expected one of {}",
                crate::error::excerpt(&api_version, 64),
                EXEC_VERSIONS.join(", ")
            )));
        }
        let command = yaml::opt_str(e, "command", name)?
            .filter(|c| !c.is_empty())
            .ok_or_else(|| err("no command".into()))?;
        let args = yaml::items(&e["args"], name, "exec.args")?
            .iter()
            .map(|a| yaml::scalar(a).ok_or_else(|| err("args must be strings".into())))
            .collect::<Result<Vec<_>>>()?;
        let mut env = Vec::new();
        for v in yaml::items(&e["env"], name, "exec.env")? {
            let k = yaml::opt_str(v, "name", name)?
                .ok_or_else(|| err("env entry without name".into()))?;
            let val = yaml::opt_str(v, "value", name)?.unwrap_or_default();
            env.push((k, val));
        }
        Ok(Exec {
            api_version,
            command,
            args,
            env,
            install_hint: yaml::opt_str(e, "installHint", name)?,
            provide_cluster_info: yaml::opt_str(e, "provideClusterInfo", name)?.as_deref()
                == Some("true"),
        })
    }
}

/// What an exec plugin answered.
pub(crate) enum ExecCredential {
    Token(String),
    /// Client certificate and key, PEM.
    Cert(Vec<u8>, Vec<u8>),
}

/// How long a plugin may take, and how much it may print.
const EXEC_TIMEOUT: Duration = Duration::from_secs(60);
const EXEC_OUTPUT_CAP: usize = 1 << 20;

/// Run the plugin as kubectl does: no shell, our environment plus its `env` and
/// `KUBERNETES_EXEC_INFO`, stdin closed (never interactive), stderr passed through; its stdout
/// is an `ExecCredential` of the same apiVersion. Any failure names the command.
fn run_exec(e: &Exec, kc: &Kubeconfig, name: &str) -> Result<ExecCredential> {
    let what = format!("{name}: exec plugin {:?}", e.command);
    let mut spec = serde_json::json!({"interactive": false});
    if e.provide_cluster_info {
        let mut cluster = serde_json::json!({"server": kc.server});
        if let Some(ca) = &kc.ca_data {
            cluster["certificate-authority-data"] = ca.clone().into();
        }
        if let Some(p) = &kc.proxy {
            cluster["proxy-url"] = p.clone().into();
        }
        spec["cluster"] = cluster;
    }
    let info =
        serde_json::json!({"apiVersion": e.api_version, "kind": "ExecCredential", "spec": spec});
    let mut env = e.env.clone();
    env.push(("KUBERNETES_EXEC_INFO".into(), info.to_string()));
    let c = Command {
        program: e.command.clone().into(),
        args: e.args.clone(),
        // Where kubectl runs it: in our working directory.
        cwd: std::env::current_dir().unwrap_or_else(|_| "/".into()),
        env: Env::Inherit(env),
        timeout: EXEC_TIMEOUT,
        grace: Duration::from_secs(1),
    };
    let ran = exec::capture(&c, &what, EXEC_OUTPUT_CAP).map_err(|err| {
        let hint = e
            .install_hint
            .as_deref()
            .map(|h| format!(" ({})", crate::error::excerpt(h.trim(), 200)))
            .unwrap_or_default();
        Error::failed(format!("{err}{hint}"))
    })?;
    if !ran.exit.success() {
        let said = crate::error::excerpt(ran.tail.trim(), 200);
        return Err(Error::failed(format!("{what}: {}: {said}", ran.exit)));
    }
    let out = ran.stdout;
    parse_exec_output(&out, &e.api_version, now_unix())
        .map_err(|m| Error::failed(format!("{what}: {m}")))
}

fn now_unix() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// An `ExecCredential` answer: its apiVersion must be the one asked for; a token, or a client
/// certificate and key; an `expirationTimestamp` in the past is refused.
pub(crate) fn parse_exec_output(
    out: &[u8],
    api_version: &str,
    now: i64,
) -> std::result::Result<ExecCredential, String> {
    let v: serde_json::Value = serde_json::from_slice(out).map_err(|e| {
        format!(
            "output is not JSON ({e}): \"{}\"",
            crate::error::excerpt(&String::from_utf8_lossy(out), 80)
        )
    })?;
    if v["apiVersion"] != api_version || v["kind"] != "ExecCredential" {
        return Err(format!(
            "answered {:?}/{:?}, expected {api_version}/ExecCredential",
            v["apiVersion"].as_str().unwrap_or(""),
            v["kind"].as_str().unwrap_or("")
        ));
    }
    let st = &v["status"];
    if let Some(t) = st["expirationTimestamp"].as_str() {
        let at = rfc3339(t).ok_or_else(|| {
            format!(
                "expirationTimestamp {:?} is not RFC 3339",
                crate::error::excerpt(t, 64)
            )
        })?;
        if at <= now {
            return Err(format!("its credential expired at {t}"));
        }
    }
    let s = |k: &str| st[k].as_str().filter(|x| !x.is_empty());
    match (s("token"), s("clientCertificateData"), s("clientKeyData")) {
        (Some(t), _, _) => Ok(ExecCredential::Token(t.to_string())),
        (None, Some(c), Some(k)) => Ok(ExecCredential::Cert(
            c.as_bytes().to_vec(),
            k.as_bytes().to_vec(),
        )),
        _ => Err("status has neither a token nor a client certificate and key".into()),
    }
}

/// Seconds since the epoch of an RFC 3339 time (`2026-11-24T01:02:03Z`, fractions and offsets
/// allowed).
pub fn rfc3339(t: &str) -> Option<i64> {
    let b = t.as_bytes();
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't' | b' ')
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let num = |r: std::ops::Range<usize>| t.get(r)?.parse::<i64>().ok();
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, se) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || se > 60 {
        return None;
    }
    let mut rest = &t[19..];
    if let Some(r) = rest.strip_prefix('.') {
        let n = r.bytes().take_while(u8::is_ascii_digit).count();
        if n == 0 {
            return None;
        }
        rest = &r[n..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        // ASCII first: a byte index inside a multi-byte character would panic.
        o if o.len() == 6
            && o.is_ascii()
            && (o.starts_with('+') || o.starts_with('-'))
            && &o[3..4] == ":" =>
        {
            let m = o[1..3].parse::<i64>().ok()? * 3600 + o[4..6].parse::<i64>().ok()? * 60;
            if o.starts_with('-') {
                -m
            } else {
                m
            }
        }
        _ => return None,
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let (y2, m2) = if mo <= 2 {
        (y - 1, mo + 9)
    } else {
        (y, mo - 3)
    };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let doy = (153 * m2 + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + h * 3600 + mi * 60 + se - offset)
}

fn context_refs(ctx: &yaml_rust2::Yaml, name: &str) -> Result<(String, String)> {
    let c = &ctx["context"];
    let cluster = yaml::opt_str(c, "cluster", name)?.unwrap_or_default();
    let user = yaml::opt_str(c, "user", name)?.unwrap_or_default();
    Ok((cluster, user))
}

/// The API client: `--kubeconfig` (a pod path), else the pod's service account.
pub fn api_client(kubeconfig: Option<&Path>, pod: &Root, retry: Retry) -> Result<Kube> {
    match kubeconfig {
        Some(p) => {
            let p = p.to_string_lossy();
            Kube::from_kubeconfig(pod, &p, retry)?
                .ok_or_else(|| Error::config(format!("--kubeconfig {p}: does not exist")))
        }
        None => Kube::in_cluster(retry),
    }
}

/// A node's name as the API addresses it: a DNS subdomain (RFC 1123), since it goes into
/// request paths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeName(String);

impl NodeName {
    pub fn parse(s: &str) -> Option<NodeName> {
        dns_subdomain(s).then(|| NodeName(s.to_string()))
    }
}

impl std::ops::Deref for NodeName {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for NodeName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// `--node-name`, else `NODE` (the downward API's spec.nodeName).
pub fn node_name(flag: Option<&str>, env: Option<&str>) -> Result<NodeName> {
    let (n, from) = match (
        flag.filter(|n| !n.is_empty()),
        env.filter(|n| !n.is_empty()),
    ) {
        (Some(n), _) => (n, "--node-name"),
        (None, Some(n)) => (n, "NODE"),
        (None, None) => {
            return Err(Error::config(
                "no node name: give --node-name or set NODE (the downward API's spec.nodeName)",
            ))
        }
    };
    NodeName::parse(n).ok_or_else(|| {
        Error::config(format!(
            "{from} {n:?}: not a valid node name (a DNS subdomain)"
        ))
    })
}

/// A namespace's name: an RFC 1123 label (at most 63, no dots).
pub fn dns_label(s: &str) -> bool {
    s.len() <= 63 && !s.contains('.') && dns_subdomain(s)
}

pub fn dns_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

/// A Kubernetes annotation or label key: `[prefix/]name`, prefix a DNS subdomain, name at most 63
/// alphanumerics, `-`, `_`, `.`, beginning and ending alphanumeric.
pub fn check_key(flag: &str, key: &str) -> Result<()> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    if name_ok && prefix.is_none_or(dns_subdomain) {
        Ok(())
    } else {
        Err(Error::config(format!(
            "{flag} {key:?}: not a valid key ([prefix/]name)"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_output_and_rfc3339() {
        assert_eq!(rfc3339("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(rfc3339("2026-11-24T01:02:03Z"), Some(1_795_482_123));
        assert_eq!(rfc3339("2026-11-24T02:02:03.5+01:00"), Some(1_795_482_123));
        for bad in [
            "2026-11-24",
            "2026-13-01T00:00:00Z",
            "2026-11-24T01:02:03",
            "x",
        ] {
            assert_eq!(rfc3339(bad), None, "{bad}");
        }
        let v = "client.authentication.k8s.io/v1";
        let ok = format!(
            r#"{{"apiVersion":"{v}","kind":"ExecCredential","status":{{"token":"t","expirationTimestamp":"2026-11-24T01:02:03Z"}}}}"#
        );
        assert!(
            matches!(parse_exec_output(ok.as_bytes(), v, 0), Ok(ExecCredential::Token(t)) if t == "t")
        );
        let e = parse_exec_output(ok.as_bytes(), v, 1_795_482_123)
            .err()
            .unwrap();
        assert!(e.contains("expired at 2026-11-24T01:02:03Z"), "{e}");
        let e = parse_exec_output(ok.as_bytes(), "client.authentication.k8s.io/v1beta1", 0)
            .err()
            .unwrap();
        assert!(
            e.contains("expected client.authentication.k8s.io/v1beta1/ExecCredential"),
            "{e}"
        );
        let e = parse_exec_output(b"token please", v, 0).err().unwrap();
        assert!(e.contains("output is not JSON"), "{e}");
    }

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
            .contains("no current-context, so kubectl would use no context"));
        assert!(Kubeconfig::parse("clusters: 5\n", "kc").is_err());
        assert!(Kubeconfig::parse("{", "kc")
            .unwrap_err()
            .to_string()
            .contains("kc: invalid YAML"));
    }

    #[test]
    fn node_name_from_flag_else_env() {
        assert_eq!(&*node_name(Some("n1"), Some("n2")).unwrap(), "n1");
        assert_eq!(&*node_name(Some(""), Some("n2")).unwrap(), "n2");
        assert_eq!(
            &*node_name(None, Some("ip-10-0-0-1.ec2.internal")).unwrap(),
            "ip-10-0-0-1.ec2.internal"
        );
        for (flag, env) in [(None, None), (Some(""), Some(""))] {
            assert_eq!(node_name(flag, env).unwrap_err().exit_code(), 2);
        }
        for bad in ["a/b", "../x", "N1", "a?b", "-a", "a..b"] {
            assert_eq!(
                node_name(Some(bad), None).unwrap_err().exit_code(),
                2,
                "{bad}"
            );
        }
    }

    #[test]
    fn annotation_keys() {
        for ok in [
            "container-linux-update.v1.coreos.com/tectonic-torcx-pre-hook-ok",
            "ok",
            "example.com/pre-hook_ok.v1",
        ] {
            check_key("--node-annotation", ok).unwrap();
        }
        for bad in [
            "",
            "/x",
            "a/",
            "Example.com/x",
            "a b",
            "x/-y",
            "a/b/c",
            &"x".repeat(64),
        ] {
            assert!(check_key("--node-annotation", bad).is_err(), "{bad:?}");
        }
    }
}
