//! What every step starts from: the flow, the Secret's keys, and the clients (step 0).

use std::path::Path;
use std::time::Duration;

use crate::cli::{Pick, Reprovision};
use crate::crypto::digest::{self, Digest};
use crate::error::{Error, Result};
use crate::inplace::mco;
use crate::net::fetch::{Http, Request};
use crate::net::kube::api_client;
use crate::net::kube::Kube;
use crate::net::names::{check_key, node_name, NodeName};
use crate::net::retry::Retry;
use crate::net::tls::Tls;
use crate::node::dir::Dir;
use crate::node::envfile::EnvFile;
use crate::node::root::{Root, CONFIG_CAP};

/// Where the state file and the scratch folders live on the node.
pub(super) const WORK: &str = "/var/lib/nodestrap/reprovision";
pub(super) const STATE: &str = "state.json";
pub(super) const PAYLOAD_FILE: &str = "payload.tar.gz";
pub(super) const PAYLOAD_DIR: &str = "payload";
pub(super) const MCD_DIR: &str = "mcd";
pub(super) const OS_RELEASE: &[&str] = &["/etc/os-release", "/usr/lib/os-release"];
/// The kernel's id of this boot; tests point it elsewhere to stand for a reboot.
pub(super) const IGNITION_CAP: u64 = 64 << 20;
pub(super) const PAYLOAD_CAP: u64 = 4 << 30;
pub(super) const EXTRACT_TIMEOUT: Duration = Duration::from_secs(900);
pub(super) const KILL_GRACE: Duration = Duration::from_secs(10);

pub(super) use crate::cli::Flow;

/// The Secret, one file per key. Not `Debug`: it holds tokens.
pub(super) struct Secrets {
    pub(crate) flow: Flow,
    pub(crate) url: String,
    pub(crate) token: String,
    pub(crate) ca: Vec<u8>,
    /// RHCOS: the kubeconfig the node gets (else its current one).
    pub(crate) kubeconfig: Option<Vec<u8>>,
    /// RHEL: worker, cluster, region.
    pub(crate) ids: Option<(String, String, String)>,
    pub(crate) payload_sha256: Option<Digest>,
    pub(crate) progress_url: Option<String>,
    pub(crate) progress_token: Option<String>,
    pub(crate) registry_url: Option<String>,
    pub(crate) mirror_urls: Vec<String>,
}

pub(super) struct SecretDir {
    pub(super) root: Root,
    pub(super) shown: String,
}

impl SecretDir {
    pub(super) fn open(p: &Path) -> Result<SecretDir> {
        let shown = format!("--secret-dir {}", p.display());
        match std::fs::metadata(p) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(Error::config(format!("{shown}: not a directory"))),
            Err(e) => return Err(Error::config(format!("{shown}: {e}"))),
        }
        // Resolved inside the folder: a Secret volume's keys are symlinks into `..data/`.
        Ok(SecretDir {
            root: Root::open(p)?,
            shown,
        })
    }

    pub(super) fn raw(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let data = self
            .root
            .read(key, CONFIG_CAP)
            .map_err(|e| Error::config(format!("{}: key {key}: {e}", self.shown)))?;
        Ok(data.filter(|d| !d.iter().all(u8::is_ascii_whitespace)))
    }

    pub(super) fn text(&self, key: &str) -> Result<Option<String>> {
        match self.raw(key)? {
            None => Ok(None),
            Some(d) => String::from_utf8(d)
                .map(|s| Some(s.trim().to_string()))
                .map_err(|_| Error::config(format!("{}: key {key}: not UTF-8 text", self.shown))),
        }
    }

    pub(super) fn required<T>(&self, key: &str, v: Option<T>) -> Result<T> {
        v.ok_or_else(|| {
            Error::config(format!(
                "{}: key {key} is missing or empty (required for this flow)",
                self.shown
            ))
        })
    }

    pub(super) fn url(&self, key: &str) -> Result<Option<String>> {
        match self.text(key)? {
            Some(u) if u.starts_with("https://") && !u.contains(char::is_whitespace) => Ok(Some(u)),
            Some(u) => Err(Error::config(format!(
                "{}: key {key}: {u:?} is not an https:// URL (tokens are never sent in the clear)",
                self.shown
            ))),
            None => Ok(None),
        }
    }

    /// A worker, cluster or region id: it goes into a query string and the script's environment.
    pub(super) fn id(&self, key: &str) -> Result<String> {
        let v = self.required(key, self.text(key)?)?;
        if v.len() > 128
            || !v
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        {
            return Err(Error::config(format!(
                "{}: key {key}: {v:?} is not an id (letters, digits, '.', '_', '-')",
                self.shown
            )));
        }
        Ok(v)
    }
}

impl Secrets {
    pub(super) fn read(dir: &Path, flow: Flow) -> Result<Secrets> {
        let s = SecretDir::open(dir)?;
        let (url_key, token_key) = match flow {
            Flow::Rhcos => ("ignition-url", "ignition-token"),
            Flow::Rhel => ("payload-url", "payload-token"),
        };
        let url = s.required(url_key, s.url(url_key)?)?;
        let token = s.required(token_key, s.text(token_key)?)?;
        let ca = s.required("ca.crt", s.raw("ca.crt")?)?;
        let (kubeconfig, ids, payload_sha256) = match flow {
            Flow::Rhcos => (s.raw("kubeconfig")?, None, None),
            Flow::Rhel => {
                let ids = (s.id("worker-id")?, s.id("cluster-id")?, s.id("region")?);
                let sha = match s.text("payload-sha256")? {
                    None => None,
                    Some(v) => Some(parse_sha256(&v).ok_or_else(|| {
                        Error::config(format!(
                            "{}: key payload-sha256: {v:?} is not a sha256 (64 hex digits)",
                            s.shown
                        ))
                    })?),
                };
                (None, Some(ids), sha)
            }
        };
        let mirror_urls = s
            .text("mirror-urls")?
            .map(|t| {
                t.lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty() && !l.starts_with('#'))
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default();
        Ok(Secrets {
            flow,
            url,
            token,
            ca,
            kubeconfig,
            ids,
            payload_sha256,
            progress_url: s.url("progress-url")?,
            progress_token: s.text("progress-token")?,
            registry_url: s.text("registry-url")?,
            mirror_urls,
        })
    }

    /// What this reprovision is for: a run for another URL or worker is a new reprovision.
    pub(super) fn target(&self) -> String {
        let mut text = format!("{}\n{}", self.flow.name(), self.url);
        if let Some((w, c, r)) = &self.ids {
            text.push_str(&format!("\n{w}\n{c}\n{r}"));
        }
        format!("sha256:{}", digest::hex(&digest::sha256(text.as_bytes())))
    }

    /// The payload URL with the ids the bootstrap API wants as query parameters.
    pub(super) fn payload_url(&self) -> String {
        let Some((w, c, r)) = &self.ids else {
            return self.url.clone();
        };
        let sep = if self.url.contains('?') { '&' } else { '?' };
        format!("{}{sep}workerID={w}&clusterID={c}&region={r}", self.url)
    }
}

/// `abc…` (64 hex), `sha256:abc…` or `sha256-abc…`.
pub(super) fn parse_sha256(v: &str) -> Option<Digest> {
    let hex = v
        .strip_prefix("sha256:")
        .or_else(|| v.strip_prefix("sha256-"))
        .unwrap_or(v);
    Digest::parse(&format!("sha256-{hex}"))
}

/// Which flow: `--flow`, else the node's os-release `ID`.
pub(super) fn flow(a: &Reprovision, root: &Root) -> Result<Flow> {
    if let Pick::Given(f) = a.flow {
        return Ok(f);
    }
    for p in OS_RELEASE {
        let Some(text) = root.read_text(p)? else {
            continue;
        };
        let env = EnvFile::parse(&text, &root.show(p))?;
        let id = env.get("ID").unwrap_or("");
        let f = match id {
            "rhcos" => Flow::Rhcos,
            "rhel" => Flow::Rhel,
            _ => {
                return Err(Error::config(format!(
                    "{}: ID={id:?} is neither rhcos nor rhel; give --flow",
                    root.show(p)
                )))
            }
        };
        crate::info!("flow {} (from ID={id} in {})", f.name(), root.show(p));
        return Ok(f);
    }
    Err(Error::config(format!(
        "no os-release under {}; give --flow",
        root.show("/")
    )))
}

/// Everything both commands need, checked before anything is fetched.
pub(super) struct Setup {
    pub(super) root: Root,
    pub(super) secrets: Secrets,
    /// Ignition server and payload: the Secret's ca.crt only.
    pub(super) pinned: Http,
    /// Registry, mirrors, progress: the system roots and ca.crt.
    pub(super) open: Http,
    pub(super) open_tls: Tls,
}

/// This node's Node and a client of the API server.
pub(super) struct Api {
    pub(super) node: NodeName,
    pub(super) kube: Kube,
}

/// What a command needs of the cluster, as a type: reprovision cannot run without its Node and
/// an API client (`Api`), preflight checks what it can reach (`Option<Api>`). Each is asked in
/// the order `setup` checks its inputs, so the first configuration error is the same either way.
pub(super) trait Needs {
    const COMMAND: Command;
    type Node;
    type Api;
    fn node(r: Result<NodeName>) -> Result<Self::Node>;
    fn api(node: Self::Node, client: impl FnOnce() -> Result<Kube>) -> Result<Self::Api>;
}

pub(super) struct ForReprovision;
pub(super) struct ForPreflight;

impl Needs for ForReprovision {
    const COMMAND: Command = Command::Reprovision;
    type Node = NodeName;
    type Api = Api;
    fn node(r: Result<NodeName>) -> Result<NodeName> {
        r
    }
    fn api(node: NodeName, client: impl FnOnce() -> Result<Kube>) -> Result<Api> {
        Ok(Api {
            node,
            kube: client()?,
        })
    }
}

impl Needs for ForPreflight {
    const COMMAND: Command = Command::Preflight;
    type Node = Option<NodeName>;
    type Api = Option<Api>;
    fn node(r: Result<NodeName>) -> Result<Option<NodeName>> {
        Ok(r.ok())
    }
    fn api(node: Option<NodeName>, client: impl FnOnce() -> Result<Kube>) -> Result<Option<Api>> {
        let Some(node) = node else { return Ok(None) };
        match client() {
            Ok(kube) => Ok(Some(Api { node, kube })),
            Err(e) => {
                crate::warn!("no Kubernetes API client: {e}");
                Ok(None)
            }
        }
    }
}

/// Which command sets up: preflight checks within a short deadline and takes a busy answer as
/// a result; reprovision needs its Node and waits for busy servers until its deadline.
#[derive(Clone, Copy, PartialEq, Debug)]
pub(super) enum Command {
    Preflight,
    Reprovision,
}

/// The one short wait preflight gives a busy endpoint (a `Retry-After` is cut to it).
pub(super) const PREFLIGHT_BUSY_WAIT: Duration = Duration::from_secs(3);

pub(super) fn setup<N: Needs>(a: &Reprovision) -> Result<(Setup, N::Api)> {
    let cmd = N::COMMAND;
    let until = crate::cli::deadline(a.deadline.unwrap_or(match cmd {
        Command::Preflight => crate::cli::PREFLIGHT_DEADLINE_SECS,
        Command::Reprovision => crate::cli::REPROVISION_DEADLINE_SECS,
    }))?;
    // preflight: one short wait for a busy endpoint, then its row says so.
    let bounded = |r: Retry| match cmd {
        Command::Preflight => r
            .busy_attempts(2)
            .capped_at(PREFLIGHT_BUSY_WAIT)
            .until(until),
        Command::Reprovision => r.until(until),
    };
    let limits = check_flags(a)?;
    let node = N::node(node_name(
        a.node_name.as_deref(),
        std::env::var("NODE").ok().as_deref(),
    ))?;
    let root = Root::open(&a.root)?;
    let flow = flow(a, &root)?;
    let secrets = Secrets::read(&a.secret_dir, flow)?;
    let (pinned_tls, open_tls) = tls(&root, &secrets)?;
    let retry = bounded(Retry::exponential(
        a.fetch_attempts,
        Duration::from_millis(a.fetch_backoff_ms),
    ));
    let api = N::api(node, || {
        let pod = Root::open(Path::new("/"))?;
        let retry = bounded(Retry::exponential(
            a.api_tries,
            Duration::from_secs(a.api_retry_delay),
        ));
        api_client(a.kubeconfig.as_deref(), &pod, retry)
    })?;
    let s = Setup {
        pinned: Http::new(&pinned_tls, retry).with_limits(limits),
        open: Http::new(&open_tls, retry).with_limits(limits),
        open_tls,
        root,
        secrets,
    };
    Ok((s, api))
}

/// Step 0's options that clap cannot check: bounds, the MCD's source, the label, the payload's
/// entry; the fetch attempts' limits.
fn check_flags(a: &Reprovision) -> Result<crate::net::fetch::AttemptLimits> {
    for (flag, v, max) in [
        ("--api-tries", a.api_tries as u64, 100),
        ("--api-retry-delay", a.api_retry_delay, 3600),
        ("--fetch-attempts", a.fetch_attempts as u64, 100),
        ("--fetch-backoff-ms", a.fetch_backoff_ms, 60_000),
        ("--entry-timeout", a.entry_timeout, 86_400),
    ] {
        crate::cli::at_most(flag, v, max)?;
    }
    let limits = crate::net::fetch::AttemptLimits::from_options(
        a.fetch_timeout,
        a.fetch_min_rate,
        a.fetch_min_rate_window,
    )?;
    if a.mcd_extract_command.split_whitespace().next().is_none() {
        return Err(Error::config("--mcd-extract-command is empty"));
    }
    if let Some(p) = &a.mcd_binary {
        if !p.is_file() {
            return Err(Error::config(format!(
                "--mcd-binary {}: not an existing file",
                p.display()
            )));
        }
    }
    check_key("--label", &a.label)?;
    let entry = Path::new(&a.payload_entry);
    if a.payload_entry.is_empty()
        || entry.is_absolute()
        || entry
            .components()
            .any(|c| !matches!(c, std::path::Component::Normal(_)))
    {
        return Err(Error::config(format!(
            "--payload-entry {:?}: expected a relative path inside the payload",
            a.payload_entry
        )));
    }
    Ok(limits)
}

/// The pinned client's TLS (ca.crt of --secret-dir only) and the open one's (the system roots
/// and ca.crt).
fn tls(root: &Root, secrets: &Secrets) -> Result<(Tls, Tls)> {
    let mut pinned_tls = Tls::default();
    pinned_tls
        .add_pem(&secrets.ca, "ca.crt of --secret-dir")
        .map_err(|e| e.with_kind(crate::error::Kind::Config))?;
    let mut open_tls = Tls::system(root)?;
    open_tls.add_pem(&secrets.ca, "ca.crt of --secret-dir")?;
    Ok((pinned_tls, open_tls))
}

pub(super) fn work_dir(root: &Root) -> Result<Dir> {
    let d = root.make_dir(WORK)?;
    // Private: the state names the target, the payload may hold credentials.
    d.chmod(0o700)?;
    Ok(d)
}

/// The MCD renamed the encapsulated config away once it had applied it (before its reboot).
pub(super) fn finished_on_disk(root: &Root, flow: Flow) -> bool {
    match flow {
        Flow::Rhcos => !root.exists(mco::ENCAPSULATED),
        Flow::Rhel => true,
    }
}

pub(super) fn bearer(req: &mut Request, token: &str) {
    req.headers
        .push(("Authorization".into(), format!("Bearer {token}")));
}

pub(super) fn base_env() -> Vec<(String, String)> {
    vec![
        (
            "PATH".into(),
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
        ),
        ("LANG".into(), "C.UTF-8".into()),
    ]
}
