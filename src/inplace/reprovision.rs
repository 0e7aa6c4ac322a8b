//! `nodestrap reprovision` and `nodestrap preflight`: IBM's in-place bootstrapper
//! (docs/reprovision.md). An operator cordons a node and labels it; a DaemonSet pod with the host's root and a
//! Secret mounted re-bootstraps the node in place and reboots it into its new configuration.
//!
//! RHCOS: the machine-config-server's Ignition config, completed with the kubeconfig and the
//! node annotations, is handed to `machine-config-daemon firstboot-complete-machineconfig`
//! which writes it out and reboots. RHEL: a bootstrap payload is unpacked and
//! its entry script run, then the node reboots. A state file under the root makes a re-run
//! after a crash converge and a run on a finished node do nothing.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};

use crate::cli::Reprovision;
use crate::crypto::digest::{self, Algo, Digest};
use crate::error::{Context, Error, Result};
use crate::inplace::mco;
use crate::inplace::progress::Reporter;
use crate::net::fetch::{Http, Request, Retry, Staging, Tls};
use crate::net::kube::Kube;
use crate::net::kube::{api_client, check_key, node_name, NodeName};
use crate::node::envfile::EnvFile;
use crate::node::exec::{self, Command, Env};
use crate::node::reboot::{self, Rebooter, Requested};
use crate::node::root::{Dir, Root, CONFIG_CAP};

/// Where the state file and the scratch folders live on the node.
const WORK: &str = "/var/lib/nodestrap/reprovision";
const STATE: &str = "state.json";
const PAYLOAD_FILE: &str = "payload.tar.gz";
const PAYLOAD_DIR: &str = "payload";
const MCD_DIR: &str = "mcd";
const OS_RELEASE: &[&str] = &["/etc/os-release", "/usr/lib/os-release"];
/// The kernel's id of this boot; tests point it elsewhere to stand for a reboot.
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";
const BOOT_ID_ENV: &str = "NODESTRAP_BOOT_ID";
const IGNITION_CAP: u64 = 64 << 20;
const PAYLOAD_CAP: u64 = 4 << 30;
const EXTRACT_TIMEOUT: Duration = Duration::from_secs(900);
const KILL_GRACE: Duration = Duration::from_secs(10);

#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Flow {
    Rhcos,
    Rhel,
}

impl Flow {
    fn name(self) -> &'static str {
        match self {
            Flow::Rhcos => "rhcos",
            Flow::Rhel => "rhel",
        }
    }
}

/// The Secret, one file per key. Not `Debug`: it holds tokens.
pub struct Secrets {
    pub flow: Flow,
    pub url: String,
    pub token: String,
    pub ca: Vec<u8>,
    /// RHCOS: the kubeconfig the node gets (else its current one).
    pub kubeconfig: Option<Vec<u8>>,
    /// RHEL: worker, cluster, region.
    pub ids: Option<(String, String, String)>,
    pub payload_sha256: Option<Digest>,
    pub progress_url: Option<String>,
    pub progress_token: Option<String>,
    pub registry_url: Option<String>,
    pub mirror_urls: Vec<String>,
}

struct SecretDir {
    root: Root,
    shown: String,
}

impl SecretDir {
    fn open(p: &Path) -> Result<SecretDir> {
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

    fn raw(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let data = self
            .root
            .read(key, CONFIG_CAP)
            .map_err(|e| Error::config(format!("{}: key {key}: {e}", self.shown)))?;
        Ok(data.filter(|d| !d.iter().all(u8::is_ascii_whitespace)))
    }

    fn text(&self, key: &str) -> Result<Option<String>> {
        match self.raw(key)? {
            None => Ok(None),
            Some(d) => String::from_utf8(d)
                .map(|s| Some(s.trim().to_string()))
                .map_err(|_| Error::config(format!("{}: key {key}: not UTF-8 text", self.shown))),
        }
    }

    fn required<T>(&self, key: &str, v: Option<T>) -> Result<T> {
        v.ok_or_else(|| {
            Error::config(format!(
                "{}: key {key} is missing or empty (required for this flow)",
                self.shown
            ))
        })
    }

    fn url(&self, key: &str) -> Result<Option<String>> {
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
    fn id(&self, key: &str) -> Result<String> {
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
    pub fn read(dir: &Path, flow: Flow) -> Result<Secrets> {
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
    fn target(&self) -> String {
        let mut text = format!("{}\n{}", self.flow.name(), self.url);
        if let Some((w, c, r)) = &self.ids {
            text.push_str(&format!("\n{w}\n{c}\n{r}"));
        }
        format!("sha256:{}", digest::hex(&digest::sha256(text.as_bytes())))
    }

    /// The payload URL with the ids the bootstrap API wants as query parameters.
    fn payload_url(&self) -> String {
        let Some((w, c, r)) = &self.ids else {
            return self.url.clone();
        };
        let sep = if self.url.contains('?') { '&' } else { '?' };
        format!("{}{sep}workerID={w}&clusterID={c}&region={r}", self.url)
    }
}

/// `abc…` (64 hex), `sha256:abc…` or `sha256-abc…`.
fn parse_sha256(v: &str) -> Option<Digest> {
    let hex = v
        .strip_prefix("sha256:")
        .or_else(|| v.strip_prefix("sha256-"))
        .unwrap_or(v);
    Digest::parse(&format!("sha256-{hex}"))
}

/// Which flow: `--flow`, else the node's os-release `ID`.
fn flow(a: &Reprovision, root: &Root) -> Result<Flow> {
    match a.flow.as_str() {
        "rhcos" => return Ok(Flow::Rhcos),
        "rhel" => return Ok(Flow::Rhel),
        "auto" => {}
        f => {
            return Err(Error::config(format!(
                "--flow {f:?}: expected auto, rhcos or rhel"
            )))
        }
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
        log::info!("flow {} (from ID={id} in {})", f.name(), root.show(p));
        return Ok(f);
    }
    Err(Error::config(format!(
        "no os-release under {}; give --flow",
        root.show("/")
    )))
}

/// Everything both commands need, checked before anything is fetched.
struct Setup {
    root: Root,
    secrets: Secrets,
    /// Ignition server and payload: the Secret's ca.crt only.
    pinned: Http,
    /// Registry, mirrors, progress: the system roots and ca.crt.
    open: Http,
    open_tls: Tls,
    node: Option<NodeName>,
    kube: Option<Kube>,
}

fn setup(a: &Reprovision, need_node: bool) -> Result<Setup> {
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
    if !matches!(a.reboot.as_str(), "auto" | "host" | "never") {
        return Err(Error::config(format!(
            "--reboot {:?}: expected auto, host or never",
            a.reboot
        )));
    }
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
    let node = match node_name(
        a.node_name.as_deref(),
        std::env::var("NODE").ok().as_deref(),
    ) {
        Ok(n) => Some(n),
        Err(e) if need_node => return Err(e),
        Err(_) => None,
    };
    let root = Root::open(&a.root)?;
    let flow = flow(a, &root)?;
    let secrets = Secrets::read(&a.secret_dir, flow)?;
    let mut pinned_tls = Tls::default();
    pinned_tls
        .add_pem(&secrets.ca, "ca.crt of --secret-dir")
        .map_err(|e| e.with_kind(crate::error::Kind::Config))?;
    let mut open_tls = Tls::system(&root)?;
    open_tls.add_pem(&secrets.ca, "ca.crt of --secret-dir")?;
    let retry = Retry::exponential(a.fetch_attempts, Duration::from_millis(a.fetch_backoff_ms));
    let kube = match &node {
        Some(_) => {
            let pod = Root::open(Path::new("/"))?;
            let retry = Retry::fixed(a.api_tries, Duration::from_secs(a.api_retry_delay));
            match api_client(a.kubeconfig.as_deref(), &pod, retry) {
                Ok(k) => Some(k),
                Err(e) if need_node => return Err(e),
                Err(e) => {
                    log::warn!("no Kubernetes API client: {e}");
                    None
                }
            }
        }
        None => None,
    };
    Ok(Setup {
        pinned: Http::new(&pinned_tls, retry).with_limits(limits),
        open: Http::new(&open_tls, retry).with_limits(limits),
        open_tls,
        root,
        secrets,
        node,
        kube,
    })
}

// ---------------------------------------------------------------------------------------------
// Preflight

pub struct Check {
    pub check: &'static str,
    pub target: String,
    pub pass: bool,
    pub detail: String,
}

fn check(check: &'static str, target: &str, r: Result<String>) -> Check {
    let (pass, detail) = match r {
        Ok(d) => (true, d),
        Err(e) => (false, e.to_string()),
    };
    if pass {
        log::info!("preflight {check} {target}: pass: {detail}");
    } else {
        log::error!("preflight {check} {target}: FAIL: {detail}");
    }
    Check {
        check,
        target: target.to_string(),
        pass,
        detail,
    }
}

fn bearer(req: &mut Request, token: &str) {
    req.headers
        .push(("Authorization", format!("Bearer {token}")));
}

/// The Ignition config, fetched with the token and checked to be spec 3.x.
fn fetch_ignition(s: &Setup) -> Result<Value> {
    let mut req = Request::get(&s.secrets.url);
    bearer(&mut req, &s.secrets.token);
    req.headers.push((
        "Accept",
        "application/vnd.coreos.ignition+json;version=3.2.0, */*;q=0.1".into(),
    ));
    let body = s.pinned.fetch(&req, IGNITION_CAP)?;
    mco::parse(&body, &s.secrets.url)
}

/// `https://host[:port]/v2/` of a registry or mirror given as a URL or `host[:port][/path]`.
fn v2_url(r: &str) -> String {
    let rest = r
        .strip_prefix("https://")
        .or_else(|| r.strip_prefix("http://"))
        .unwrap_or(r);
    let host = rest.split('/').next().unwrap_or(rest);
    let scheme = if r.starts_with("http://") {
        "http"
    } else {
        "https"
    };
    format!("{scheme}://{host}/v2/")
}

/// A registry answers `/v2/` with 200, or 401 when it wants credentials: both mean it is there.
fn probe_registry(http: &Http, r: &str) -> Result<String> {
    let url = v2_url(r);
    match http.fetch_passing(&Request::get(&url), 1 << 20, &[401])? {
        Ok(_) => Ok("HTTP 200".into()),
        Err(_) => Ok("HTTP 401 (wants credentials)".into()),
    }
}

/// The progress endpoint answers with the token: any answer but 401/403 and 5xx will do (it may
/// take POST only).
fn probe_progress(s: &Setup, url: &str) -> Result<String> {
    let mut req = Request::get(url);
    if let Some(t) = &s.secrets.progress_token {
        bearer(&mut req, t);
    }
    let pass: Vec<u16> = (400..500)
        .filter(|c| ![401, 403, 408, 429].contains(c))
        .collect();
    match s.open.fetch_passing(&req, 1 << 20, &pass)? {
        Ok(_) => Ok("answers (2xx)".into()),
        Err(e) => Ok(format!("answers ({})", short_status(&e.to_string()))),
    }
}

fn short_status(msg: &str) -> String {
    msg.split(": ")
        .find(|p| p.starts_with("HTTP "))
        .unwrap_or("4xx")
        .to_string()
}

/// Hash the payload while it streams (to nowhere: preflight writes nothing). Its SHA-256 is
/// kept in `seen`: the apply step must get the same bytes.
fn probe_payload(s: &Setup, seen: &mut Option<String>) -> Result<String> {
    let mut req = Request::get(&s.secrets.url);
    let url = s.secrets.payload_url();
    req.url = &url;
    bearer(&mut req, &s.secrets.token);
    let (n, got) = s.pinned.stream(&req, PAYLOAD_CAP, |body| {
        hash_into(
            body,
            &mut std::io::sink(),
            s.secrets
                .payload_sha256
                .as_ref()
                .map(|d| (d, "payload-sha256")),
        )
    })?;
    *seen = Some(got.clone());
    Ok(match &s.secrets.payload_sha256 {
        Some(_) => format!("{n} bytes, sha256 matches"),
        None => format!("{n} bytes, sha256 {got} (no payload-sha256 to check)"),
    })
}

/// Copy while hashing with SHA-256; a mismatch with `want` is `Staging::Mismatch`.
fn hash_into(
    body: &mut dyn std::io::Read,
    out: &mut dyn std::io::Write,
    want: Option<(&Digest, &str)>,
) -> std::result::Result<(u64, String), Staging> {
    let mut h = Digest {
        algo: Algo::Sha256,
        hex: String::new(),
    }
    .hasher();
    let n = match digest::copy_hashing(&mut &mut *body, &mut h, &mut &mut *out) {
        Ok(n) => n,
        Err(digest::CopyError::Read(e)) => return Err(Staging::Read(e)),
        Err(digest::CopyError::Write(e)) => return Err(Staging::Write(e.into())),
    };
    let got = h.finish_hex();
    match want {
        Some((w, says)) if w.hex != got => Err(Staging::Mismatch(
            format!("sha256-{got}"),
            format!("{says} says {}", w.hex),
        )),
        _ => Ok((n, got)),
    }
}

/// What preflight found: its checks, the Ignition config (RHCOS), the payload's SHA-256 (RHEL).
struct Preflight {
    checks: Vec<Check>,
    config: Option<Value>,
    payload_sha256: Option<String>,
}

/// Every check the flow depends on.
fn preflight_checks(s: &Setup) -> Preflight {
    let mut checks = Vec::new();
    let mut config = None;
    let mut payload_sha256 = None;
    match s.secrets.flow {
        Flow::Rhcos => {
            let r = fetch_ignition(s).map(|c| {
                let d = format!(
                    "spec {}, {} files, {} units",
                    mco::version(&c),
                    c.pointer("/storage/files")
                        .and_then(Value::as_array)
                        .map_or(0, Vec::len),
                    c.pointer("/systemd/units")
                        .and_then(Value::as_array)
                        .map_or(0, Vec::len)
                );
                config = Some(c);
                d
            });
            checks.push(check("ignition", &s.secrets.url, r));
        }
        Flow::Rhel => checks.push(check(
            "payload",
            &s.secrets.url,
            probe_payload(s, &mut payload_sha256),
        )),
    }
    if let Some(r) = &s.secrets.registry_url {
        checks.push(check("registry", &v2_url(r), probe_registry(&s.open, r)));
    }
    for m in &s.secrets.mirror_urls {
        checks.push(check("mirror", &v2_url(m), probe_registry(&s.open, m)));
    }
    if let Some(u) = &s.secrets.progress_url {
        checks.push(check("progress", u, probe_progress(s, u)));
    }
    if let (Some(k), Some(n)) = (&s.kube, &s.node) {
        let r = k
            .get_node(n)
            .map(|_| format!("Node {n} readable ({})", k.source));
        checks.push(check("kubernetes", &format!("nodes/{n}"), r));
    }
    Preflight {
        checks,
        config,
        payload_sha256,
    }
}

fn print_table(checks: &[Check]) -> Result<()> {
    let w0 = checks
        .iter()
        .map(|c| c.check.len())
        .max()
        .unwrap_or(0)
        .max(5);
    let w1 = checks
        .iter()
        .map(|c| c.target.len())
        .max()
        .unwrap_or(0)
        .max(6);
    crate::outln!("{:w0$}  {:w1$}  RESULT  DETAIL", "CHECK", "TARGET")?;
    for c in checks {
        crate::outln!(
            "{:w0$}  {:w1$}  {:6}  {}",
            c.check,
            c.target,
            if c.pass { "pass" } else { "FAIL" },
            c.detail
        )?;
    }
    Ok(())
}

/// A summary line once the node's state is decided: a stdout that went away is logged only.
fn summary(line: std::fmt::Arguments) {
    if let Err(e) = crate::output::line(line) {
        log::warn!("{e}");
    }
}

/// `nodestrap preflight`.
pub fn preflight(a: &Reprovision) -> Result<()> {
    let s = setup(a, false)?;
    let checks = preflight_checks(&s).checks;
    print_table(&checks)?;
    let failed = checks.iter().filter(|c| !c.pass).count();
    if failed > 0 {
        return Err(Error::failed(format!(
            "preflight: {failed} of {} checks failed",
            checks.len()
        )));
    }
    log::info!("preflight: all {} checks passed", checks.len());
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// State

/// `<root>/var/lib/nodestrap/reprovision/state.json`.
#[derive(serde::Serialize, serde::Deserialize, Clone, PartialEq, Debug)]
struct State {
    flow: String,
    target: String,
    phase: Phase,
    #[serde(rename = "bootId")]
    boot_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    config: Option<String>,
}

/// How far a reprovision got, in the order it goes; persisted by these names (state files of
/// earlier releases hold the same strings).
#[derive(serde::Serialize, serde::Deserialize, Clone, Copy, PartialEq, Eq, Debug)]
#[serde(rename_all = "kebab-case")]
enum Phase {
    /// The node has its new configuration.
    Configured,
    /// About to hand over to the MCD or the reboot.
    HandedOff,
    /// The MCD applied it, or the reboot was accepted or left to the node: nothing more to do
    /// in this boot.
    RebootPending,
    /// The node came back with it.
    Done,
}

fn boot_id() -> Result<String> {
    let p = std::env::var(BOOT_ID_ENV).unwrap_or_else(|_| BOOT_ID.into());
    std::fs::read_to_string(&p)
        .map(|s| s.trim().to_string())
        .map_err(|e| Error::failed(format!("{p}: {e}")))
}

fn read_state(root: &Root) -> Result<Option<State>> {
    let p = format!("{WORK}/{STATE}");
    let Some(data) = root.read(&p, CONFIG_CAP)? else {
        return Ok(None);
    };
    match serde_json::from_slice(&data) {
        Ok(s) => Ok(Some(s)),
        // A state we cannot read says nothing: start over (every step is safe to repeat).
        Err(e) => {
            log::warn!("{}: unreadable ({e}); starting over", root.show(&p));
            Ok(None)
        }
    }
}

fn write_state(work: &Dir, st: &State) -> Result<()> {
    let data = serde_json::to_vec_pretty(st).expect("serialisable");
    work.write_atomic(STATE, &data, 0o600)
}

// ---------------------------------------------------------------------------------------------
// Reprovision

/// `nodestrap reprovision`.
pub fn run(a: &Reprovision) -> Result<()> {
    // 0. Options, Secret, flow and clients (exit 2 on any configuration error).
    let s = setup(a, true)?;
    let node = s.node.clone().expect("need_node");
    let kube = s.kube.as_ref().expect("need_node");
    let flow = s.secrets.flow;
    let target = s.secrets.target();
    let boot = boot_id()?;
    let progress = if a.dry_run {
        Reporter::silent(&node, flow.name())
    } else {
        Reporter::new(
            &s.open_tls,
            s.secrets.progress_url.as_deref(),
            s.secrets.progress_token.as_deref(),
            &node,
            flow.name(),
        )
    };

    // 1. Where a previous run got to.
    let prev = read_state(&s.root)?.filter(|st| {
        let same = st.target == target && st.flow == flow.name();
        if !same {
            log::info!("state file is for another reprovision target; starting afresh");
        }
        same
    });
    if let Some(st) = &prev {
        if st.phase == Phase::Done {
            log::info!(
                "node {node} was already reprovisioned for this target ({}); nothing to do",
                st.config.as_deref().unwrap_or(flow.name())
            );
            summary(format_args!(
                "nodestrap: reprovision already done node={node} flow={}",
                flow.name()
            ));
            return Ok(());
        }
        // A hand-off the MCD already took (it renamed the config away) counts even when this
        // process was killed before it could record `reboot-pending`.
        let taken =
            st.phase == Phase::HandedOff && flow == Flow::Rhcos && finished_on_disk(&s.root, flow);
        if (st.phase == Phase::RebootPending || taken) && st.boot_id == boot {
            // The MCD applied the config (or systemd accepted the reboot) in this boot: the
            // node is going down. Fetching, patching and running the MCD again would only
            // race it.
            log::info!(
                "node {node} was handed off in this boot and is rebooting into its new configuration; nothing to do"
            );
            if let Err(e) = crate::outln!(
                "nodestrap: reprovision handed off node={node} flow={} (reboot pending)",
                flow.name()
            ) {
                log::warn!("{e}");
            }
            return Ok(());
        }
        let after_hand_off = st.phase == Phase::HandedOff || st.phase == Phase::RebootPending;
        if after_hand_off && st.boot_id != boot && finished_on_disk(&s.root, flow) {
            let work = work_dir(&s.root)?;
            let done = State {
                phase: Phase::Done,
                boot_id: boot.clone(),
                ..st.clone()
            };
            if !a.dry_run {
                write_state(&work, &done)?;
            }
            log::info!(
                "node {node} rebooted into its new configuration since the hand-off; reprovision done"
            );
            summary(format_args!(
                "nodestrap: reprovision done node={node} flow={}",
                flow.name()
            ));
            return Ok(());
        }
    }
    // RHEL: an entry script that succeeded is not run again; resume at the label.
    // (`done`, and a hand-off followed by a reboot, returned above.)
    let resume = flow == Flow::Rhel && prev.is_some();
    let mut rendered = prev.as_ref().and_then(|p| p.config.clone());
    let mut mcd = None;

    if !resume {
        // 2. Preflight: every dependency answers, or nothing is changed.
        progress.report("preflight", "started", "checking dependencies");
        let Preflight {
            checks,
            config,
            payload_sha256,
        } = preflight_checks(&s);
        print_table(&checks)?;
        let failed: Vec<String> = checks
            .iter()
            .filter(|c| !c.pass)
            .map(|c| format!("{} {}: {}", c.check, c.target, c.detail))
            .collect();
        if !failed.is_empty() {
            let msg = format!("preflight failed: {}", failed.join("; "));
            progress.report("preflight", "failed", &msg);
            return Err(Error::failed(format!("{msg}; nothing was changed")));
        }
        progress.report(
            "preflight",
            "succeeded",
            &format!("{} checks passed", checks.len()),
        );

        // 3 and 4. Fetch, then configure.
        let r = match flow {
            Flow::Rhcos => rhcos_configure(a, &s, &progress, config.expect("rhcos preflight")).map(
                |(name, bin)| {
                    mcd = bin;
                    Some(name)
                },
            ),
            Flow::Rhel => rhel_configure(a, &s, &node, &progress, payload_sha256).map(|()| None),
        };
        rendered = match r {
            Ok(r) => r,
            Err(e) => {
                progress.fail_once("configure", &e.to_string());
                return Err(e);
            }
        };
        if a.dry_run {
            summary(format_args!(
                "nodestrap: reprovision dry run node={node} flow={} (nothing changed)",
                flow.name()
            ));
            return Ok(());
        }
        let work = work_dir(&s.root)?;
        write_state(
            &work,
            &State {
                flow: flow.name().into(),
                target: target.clone(),
                phase: Phase::Configured,
                boot_id: boot.clone(),
                config: rendered.clone(),
            },
        )?;
    } else {
        log::info!(
            "the payload's entry script already succeeded in this boot; resuming at the label"
        );
        if a.dry_run {
            summary(format_args!(
                "nodestrap: reprovision dry run node={node} flow=rhel (nothing changed)"
            ));
            return Ok(());
        }
    }

    // 5. The label goes before the reboot, so the kubelet never comes back with it and the
    //    DaemonSet does not schedule here again. Its removal makes the DaemonSet delete this
    //    pod: from here on SIGTERM is held off until the hand-off is complete.
    hold_sigterm();
    remove_label(kube, &node, &a.label)?;

    // 6. Hand off: the state first, so a crash from here on is recognised after the reboot.
    let work = work_dir(&s.root)?;
    let handed = State {
        flow: flow.name().into(),
        target,
        phase: Phase::HandedOff,
        boot_id: boot,
        config: rendered.clone(),
    };
    write_state(&work, &handed)?;
    progress.report(
        "reboot",
        "started",
        "handing the node over to its new configuration",
    );
    // Recorded as soon as the hand-off is accepted, so that a run again in this boot does not
    // hand off a second time, even if this process is killed before it ends.
    let pending = || {
        let st = State {
            phase: Phase::RebootPending,
            ..handed.clone()
        };
        if let Err(e) = write_state(&work, &st) {
            log::warn!("{e}");
        }
    };
    let r = match flow {
        Flow::Rhcos => mcd_hand_off(
            a,
            &s.root,
            &mcd.expect("rhcos_configure found or extracted it"),
        )
        .inspect(|()| pending()),
        // "succeeded" only once systemd accepted the job; then SIGTERM (the node going down)
        // ends the wait at once with exit 0.
        Flow::Rhel => rebooter(a, &s.root)
            .request("reprovisioned in place (RHEL bootstrap payload applied)")
            .and_then(|r| match r {
                Requested::Queued(job) => {
                    pending();
                    progress.report(
                        "reboot",
                        "succeeded",
                        &format!("reboot queued as systemd job {job}"),
                    );
                    reboot::wait_to_be_stopped(Duration::from_secs(600))
                }
                // Not accepted, so not "succeeded": the node still has to be rebooted.
                Requested::Declined(why) => {
                    pending();
                    progress.report(
                        "reboot",
                        "skipped",
                        &format!("not rebooting ({why}); the node must be rebooted to finish"),
                    );
                    Ok(())
                }
            }),
    };
    match r {
        Ok(()) => {
            if flow == Flow::Rhcos {
                progress.report(
                    "reboot",
                    "succeeded",
                    &format!(
                        "machine-config-daemon applied {} and reboots the node",
                        rendered.as_deref().unwrap_or("the config")
                    ),
                );
            }
            summary(format_args!(
                "nodestrap: reprovision handed off node={node} flow={} config={}",
                flow.name(),
                rendered.as_deref().unwrap_or("-")
            ));
            Ok(())
        }
        Err(e) => {
            progress.report("reboot", "failed", &e.to_string());
            Err(e)
        }
    }
}

fn work_dir(root: &Root) -> Result<Dir> {
    let d = root.dir(WORK, true)?.expect("created");
    // Private: the state names the target, the payload may hold credentials.
    d.chmod(0o700)?;
    Ok(d)
}

/// The MCD renamed the encapsulated config away once it had applied it (before its reboot).
fn finished_on_disk(root: &Root, flow: Flow) -> bool {
    match flow {
        Flow::Rhcos => !root.exists(mco::ENCAPSULATED),
        Flow::Rhel => true,
    }
}

fn remove_label(kube: &Kube, node: &str, label: &str) -> Result<()> {
    let patch = json!({"metadata": {"labels": {label: null}}});
    let got = kube
        .patch_node(node, &patch)
        .map_err(|e| e.context(format!("removing label {label} from Node {node}")))?;
    if got
        .pointer("/metadata/labels")
        .and_then(|l| l.get(label))
        .is_some()
    {
        return Err(Error::failed(format!(
            "Node {node}: the API server's answer still has label {label}"
        )));
    }
    log::info!(
        "Node {node}: label {label} removed (credentials from {})",
        kube.source
    );
    Ok(())
}

fn rebooter(a: &Reprovision, root: &Root) -> Box<dyn Rebooter> {
    match a.reboot.as_str() {
        "host" => reboot::for_host_mount(a.dry_run),
        "never" => reboot::for_run(root, false, a.dry_run),
        _ => reboot::for_run(root, true, a.dry_run),
    }
}

/// The DaemonSet deletes this pod as soon as the label is gone; kubelet's SIGTERM must not cut
/// the hand-off short (the pod's grace period covers it). It only sets the stop flag (a
/// handler, not SIG_IGN, so the programs we start get the default disposition back); once the
/// reboot is queued, a SIGTERM that came during the hand-off, or any later one, ends the wait
/// at once with exit 0.
fn hold_sigterm() {
    crate::node::signals::catch_sigterm();
}

// RHCOS --------------------------------------------------------------------------------------

/// Steps 3 and 4 for RHCOS: complete the fetched config, get the MCD (before anything on the
/// Node changes: a failed extraction must leave the label for a retry), and persist the config
/// as the MachineConfig the MCD reads. Returns the rendered config's name and the MCD (none in
/// a dry run).
fn rhcos_configure(
    a: &Reprovision,
    s: &Setup,
    progress: &Reporter,
    mut cfg: Value,
) -> Result<(String, Option<PathBuf>)> {
    let src = &s.secrets.url;
    progress.report("fetch", "started", "Ignition config");
    let r = mco::rendered(&cfg, src);
    let r = match r {
        Ok(r) => r,
        Err(e) => {
            progress.report("fetch", "failed", &e.to_string());
            return Err(e);
        }
    };
    log::info!(
        "Ignition config from {src}: spec {}, rendered config {} (from {})",
        mco::version(&cfg),
        r.name,
        r.from
    );
    progress.report(
        "fetch",
        "succeeded",
        &format!("Ignition spec {} for {}", mco::version(&cfg), r.name),
    );

    let image = match (&a.mcd_binary, mco::mco_image(&cfg)) {
        (Some(_), _) => None,
        (None, Some(i)) => {
            log::info!("machine-config-daemon comes from {i} (named by the config's MCD units)");
            Some(i)
        }
        (None, None) => {
            return Err(Error::failed(format!(
                "{src}: no machine-config-operator image in its machine-config-daemon units to take machine-config-daemon from; give --mcd-binary"
            )))
        }
    };
    progress.report("configure", "started", &r.name);
    let (kubeconfig, from) = match &s.secrets.kubeconfig {
        Some(k) => (k.clone(), "the Secret's kubeconfig".to_string()),
        None => match s.root.read(mco::KUBECONFIG, CONFIG_CAP)? {
            Some(k) => (k, s.root.show(mco::KUBECONFIG)),
            None => {
                return Err(Error::config(format!(
                    "no kubeconfig for the node: the Secret has no key kubeconfig and {} does not exist",
                    s.root.show(mco::KUBECONFIG)
                )))
            }
        },
    };
    log::info!("{} for the node from {from}", mco::KUBECONFIG);
    mco::set_file(&mut cfg, mco::KUBECONFIG, &kubeconfig);
    mco::set_file(
        &mut cfg,
        mco::NODE_ANNOTATIONS,
        &mco::node_annotations(&r.name),
    );
    // The MCS's own (emptied) copy: the MCD would write it over the file it is consuming.
    mco::remove_file(&mut cfg, mco::ENCAPSULATED);
    let mc = mco::machine_config(&r, &cfg);
    let data = serde_json::to_vec(&mc).expect("serialisable");
    let mut mcd = None;
    if a.dry_run {
        log::info!(
            "dry run: would write {} ({} bytes) and run machine-config-daemon",
            s.root.show(mco::ENCAPSULATED),
            data.len()
        );
    } else {
        mcd = Some(match (&a.mcd_binary, image) {
            (Some(p), _) => p.clone(),
            (None, Some(image)) => extract_mcd(a, &work_dir(&s.root)?, &image)?,
            (None, None) => unreachable!("checked above"),
        });
        // 0600: it carries the kubeconfig.
        s.root.write_atomic(mco::ENCAPSULATED, &data, 0o600)?;
        log::info!(
            "wrote {} (MachineConfig {}, {} bytes)",
            s.root.show(mco::ENCAPSULATED),
            r.name,
            data.len()
        );
    }
    progress.report(
        "configure",
        "succeeded",
        &format!("MachineConfig {} persisted", r.name),
    );
    Ok((r.name, mcd))
}

/// Step 6 for RHCOS: `machine-config-daemon firstboot-complete-machineconfig`, which applies the
/// MachineConfig and reboots the node itself.
fn run_mcd(a: &Reprovision, mcd: &Path) -> Result<()> {
    let root = a.root.to_string_lossy().into_owned();
    log::info!(
        "running {} firstboot-complete-machineconfig --root-mount {root}",
        mcd.display()
    );
    exec::stream_to_log(
        &Command {
            program: mcd.to_path_buf(),
            args: vec![
                "firstboot-complete-machineconfig".into(),
                "--root-mount".into(),
                root,
                "--machineconfig-file".into(),
                mco::ENCAPSULATED.into(),
            ],
            cwd: PathBuf::from("/"),
            env: Env::Only(base_env()),
            timeout: Duration::from_secs(a.entry_timeout),
            grace: KILL_GRACE,
        },
        "machine-config-daemon",
    )
}

/// Step 6 for RHCOS, judged as the MCD behaves: once it has applied the config it renames the
/// encapsulated file away, queues the reboot and sleeps until the shutdown kills it (it never
/// exits 0 then). Ended by a signal or our timeout after that rename, it did its part.
fn mcd_hand_off(a: &Reprovision, root: &Root, mcd: &Path) -> Result<()> {
    match run_mcd(a, mcd) {
        Err(e) if finished_on_disk(root, Flow::Rhcos) => {
            log::info!(
                "machine-config-daemon applied the config ({} is gone) and ended while its reboot is under way: {e}",
                root.show(mco::ENCAPSULATED)
            );
            Ok(())
        }
        r => r,
    }
}

/// The MCD from the machine-config-operator image the config names, with the configured
/// extraction command (`oc image extract` by default) into a private folder.
fn extract_mcd(a: &Reprovision, work: &Dir, image: &str) -> Result<PathBuf> {
    work.remove_dir_tree(MCD_DIR)?;
    work.create_private_dir(MCD_DIR)?;
    let dir = work.host_path(MCD_DIR)?.to_string_lossy().into_owned();
    let root = a.root.to_string_lossy().trim_end_matches('/').to_string();
    let words: Vec<String> = a
        .mcd_extract_command
        .split_whitespace()
        .map(|w| {
            w.replace("{image}", image)
                .replace("{dir}", &dir)
                .replace("{root}", &root)
        })
        .collect();
    let (program, args) = words.split_first().expect("setup checked it is not empty");
    log::info!("extracting machine-config-daemon from {image} with {program}");
    exec::stream_to_log(
        &Command {
            program: PathBuf::from(program),
            args: args.to_vec(),
            cwd: PathBuf::from("/"),
            env: Env::Only(base_env()),
            timeout: EXTRACT_TIMEOUT,
            grace: KILL_GRACE,
        },
        "mcd-extract",
    )?;
    let bin = PathBuf::from(&dir).join("machine-config-daemon");
    let meta = std::fs::symlink_metadata(&bin)
        .with_ctx(|| format!("{program} left no machine-config-daemon in {dir}"))?;
    if !meta.is_file() {
        return Err(Error::failed(format!(
            "{}: not a regular file",
            bin.display()
        )));
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755))
        .with_ctx(|| bin.display())?;
    Ok(bin)
}

fn base_env() -> Vec<(String, String)> {
    vec![
        (
            "PATH".into(),
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
        ),
        ("LANG".into(), "C.UTF-8".into()),
    ]
}

// RHEL ---------------------------------------------------------------------------------------

/// Steps 3 and 4 for RHEL: download and verify the payload, unpack it into a private folder,
/// run its entry script.
/// `seen`: the SHA-256 of preflight's fetch. Without a configured `payload-sha256` it pins the
/// payload: what is applied must be the very bytes preflight checked.
fn rhel_configure(
    a: &Reprovision,
    s: &Setup,
    node: &str,
    progress: &Reporter,
    seen: Option<String>,
) -> Result<()> {
    let (worker, cluster, region) = s.secrets.ids.clone().expect("rhel ids");
    if a.dry_run {
        log::info!(
            "dry run: would download the payload, unpack it under {} and run {}",
            s.root.show(WORK),
            a.payload_entry
        );
        return Ok(());
    }
    let work = work_dir(&s.root)?;
    // A folder left by a crashed run goes first: it is unpacked afresh.
    work.remove_dir_tree(PAYLOAD_DIR)?;

    progress.report("fetch", "started", "bootstrap payload");
    let want = match (&s.secrets.payload_sha256, seen) {
        (Some(d), _) => Some((d.clone(), "payload-sha256")),
        (None, Some(hex)) => Some((
            Digest {
                algo: Algo::Sha256,
                hex,
            },
            "the preflight fetch",
        )),
        (None, None) => None,
    };
    let url = s.secrets.payload_url();
    let mut req = Request::get(&url);
    bearer(&mut req, &s.secrets.token);
    let got = s.pinned.stream(&req, PAYLOAD_CAP, |body| {
        let mut tmp = work
            .create_temp(PAYLOAD_FILE, 0o600)
            .map_err(Staging::Write)?;
        let (n, got) = hash_into(body, tmp.file(), want.as_ref().map(|(d, w)| (d, *w)))?;
        tmp.persist().map_err(Staging::Write)?;
        Ok((n, got))
    });
    let (n, sha) = match got {
        Ok(v) => v,
        Err(e) => {
            progress.report("fetch", "failed", &e.to_string());
            return Err(e);
        }
    };
    let verified = match &want {
        Some((_, says)) => format!("verified against {says}"),
        None => "no payload-sha256 to check".to_string(),
    };
    log::info!(
        "payload from {}: {n} bytes, sha256 {sha} ({verified})",
        s.secrets.url
    );
    progress.report("fetch", "succeeded", &format!("{n} bytes, sha256 {sha}"));

    progress.report(
        "configure",
        "started",
        "unpacking the payload and running its entry script",
    );
    let r = unpack_and_run(a, s, &work, node, (&worker, &cluster, &region));
    // The unpacked payload and the archive may hold credentials: neither stays.
    let _ = work.remove_dir_tree(PAYLOAD_DIR);
    let _ = work.remove(PAYLOAD_FILE);
    r?;
    progress.report(
        "configure",
        "succeeded",
        &format!("{} exited 0", a.payload_entry),
    );
    Ok(())
}

fn unpack_and_run(
    a: &Reprovision,
    s: &Setup,
    work: &Dir,
    node: &str,
    (worker, cluster, region): (&str, &str, &str),
) -> Result<()> {
    let archive = work.open(PAYLOAD_FILE)?;
    let dest = work.create_private_dir(PAYLOAD_DIR)?;
    let sum = crate::inplace::payload::unpack_tar_gz(
        archive,
        &dest,
        &s.secrets.url,
        &crate::inplace::payload::Limits::default(),
    )?;
    log::info!(
        "payload unpacked into {}: {} files, {} directories, {} symlinks, {} hard links, {} bytes",
        work.show(PAYLOAD_DIR),
        sum.files,
        sum.dirs,
        sum.symlinks,
        sum.hardlinks,
        sum.bytes
    );
    let dir = work.host_path(PAYLOAD_DIR)?;
    let entry = dir.join(&a.payload_entry);
    match std::fs::symlink_metadata(&entry) {
        Ok(m) if m.is_file() => {}
        Ok(_) => {
            return Err(Error::failed(format!(
                "payload entry {}: not a regular file",
                a.payload_entry
            )))
        }
        Err(e) => {
            return Err(Error::failed(format!(
                "payload entry {}: {e}",
                a.payload_entry
            )))
        }
    }
    let mut env = base_env();
    env.extend([
        ("WORKER_ID".into(), worker.to_string()),
        ("CLUSTER_ID".into(), cluster.to_string()),
        ("REGION".into(), region.to_string()),
        ("NODE_NAME".into(), node.to_string()),
        ("HOST_ROOT".into(), a.root.to_string_lossy().into_owned()),
        ("HOME".into(), "/root".into()),
    ]);
    log::info!(
        "running the payload's {} (timeout {} s)",
        a.payload_entry,
        a.entry_timeout
    );
    exec::stream_to_log(
        &Command {
            program: entry,
            args: Vec::new(),
            cwd: dir,
            env: Env::Only(env),
            timeout: Duration::from_secs(a.entry_timeout),
            grace: KILL_GRACE,
        },
        &a.payload_entry,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v2_urls() {
        assert_eq!(v2_url("quay.io"), "https://quay.io/v2/");
        assert_eq!(
            v2_url("https://mirror.example:5000/ocp4/release"),
            "https://mirror.example:5000/v2/"
        );
        assert_eq!(v2_url("http://10.0.0.1:5000"), "http://10.0.0.1:5000/v2/");
    }

    #[test]
    fn state_files_of_earlier_releases_still_read() {
        for (text, phase) in [
            ("configured", Phase::Configured),
            ("handed-off", Phase::HandedOff),
            ("reboot-pending", Phase::RebootPending),
            ("done", Phase::Done),
        ] {
            let old = format!(
                r#"{{"flow": "rhcos", "target": "sha256:ab", "phase": "{text}", "bootId": "b1", "config": "rendered-worker-1"}}"#
            );
            let st: State = serde_json::from_str(&old).unwrap();
            assert_eq!(st.phase, phase);
            // Written back as it was read.
            let again: serde_json::Value = serde_json::to_value(&st).unwrap();
            assert_eq!(
                again,
                serde_json::from_str::<serde_json::Value>(&old).unwrap()
            );
        }
        assert!(serde_json::from_str::<State>(
            r#"{"flow": "rhcos", "target": "t", "phase": "halfway", "bootId": "b"}"#
        )
        .is_err());
    }

    #[test]
    fn sha256_forms() {
        let hex = "ab".repeat(32);
        for v in [
            hex.clone(),
            format!("sha256:{hex}"),
            format!("sha256-{hex}"),
        ] {
            assert_eq!(parse_sha256(&v).unwrap().hex, hex);
        }
        assert!(parse_sha256("sha512:ab").is_none());
        assert!(parse_sha256(&"zz".repeat(32)).is_none());
    }

    #[test]
    fn short_statuses() {
        assert_eq!(
            short_status("GET https://x: HTTP 405 Method Not Allowed: no"),
            "HTTP 405 Method Not Allowed"
        );
    }
}
