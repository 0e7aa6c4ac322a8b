//! Around each command's run: settings merged, logging set up, the status record begun and
//! its last line written, the events' target, and the exit code.

use std::path::Path;

use super::*;

/// `nodestrap bootstrap` from the command line `args` (normalised) it was parsed from:
/// settings from the node's config file and kernel command line are merged under the command
/// line (--root, --config and --cmdline say where they are); each value is checked as it is
/// read, so an error names the file line or kernel argument; then `run`.
pub fn bootstrap(b: &Bootstrap, args: &[String], run: &dyn Fn(&Bootstrap) -> Result<()>) -> i32 {
    let merged = match settings::merge(b, args) {
        Ok(m) => m,
        Err(e) => {
            crate::logger::init(log::LevelFilter::Info);
            crate::error!("{e}");
            crate::net::cluster::report_unknown(&e);
            // A node whose settings are wrong is one an operator asks about too.
            if !b.dry_run {
                crate::node::status::begin("bootstrap", &b.root);
                crate::node::status::finish(e.exit_code(), Some(&e));
            }
            last_line(e.exit_code());
            return e.exit_code();
        }
    };
    let cli = match parse(&merged.args) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let Cmd::Bootstrap(b) = &cli.cmd else {
        unreachable!("merged arguments keep the subcommand")
    };
    logged(&b.verbose, || {
        for n in &merged.notes {
            crate::info!("{n}");
        }
        // A dry run writes nothing, not even its record, and sends no events.
        if !b.dry_run {
            begin("bootstrap", &b.root, b.events_to())?;
            if let Some(d) = &b.metrics_dir {
                crate::node::metrics::write_to(&b.root, d);
            }
        }
        settings::payload_options(b, &merged)?;
        // Every run prints its plan line, a failed one too.
        run(b).inspect_err(|e| crate::net::cluster::report_unknown(e))
    })
}

/// The node's client certificate for events: the kubelet's, once it has joined.
const KUBELET_CLIENT_CERT: &str = "/var/lib/kubelet/pki/kubelet-client-current.pem";

/// Where `--events-url` sends (docs/status.md, "Events"): the receiver trusted through the
/// system roots and `ca`; the node's kubelet client certificate as its identity where it has
/// one, else the bearer token in `token`.
pub(crate) fn events_target(
    root: &Root,
    url: &str,
    token: Option<&Input>,
    ca: Option<&Input>,
) -> Result<crate::net::events::Target> {
    let shown = crate::net::events::check_url(url, "--events-url")?;
    let mut tls = Tls::system(root)?;
    tls.fix = Some("--events-ca-file (a PEM file)".into());
    if let Some(ca) = ca {
        let pem = ca.read(root, 16 << 20, "events-ca-file")?;
        tls.add_pem(&pem, &ca.name(root, "events-ca-file"))?;
    }
    let cert = match root.read(KUBELET_CLIENT_CERT, 64 << 10) {
        Ok(Some(pem)) => {
            let name = root.show(KUBELET_CLIENT_CERT);
            match crate::net::kubeconfig::client_cert(&pem, &pem, &name) {
                Ok(c) => Some((c, name)),
                Err(e) => {
                    crate::warn!("events: not the node's identity: {e}");
                    None
                }
            }
        }
        Ok(None) => None,
        Err(e) => {
            crate::warn!("events: {e}");
            None
        }
    };
    let (token, who) = match (cert, token) {
        (Some((c, name)), _) => {
            tls.client = Some(c);
            (None, format!("the kubelet's client certificate {name}"))
        }
        (None, Some(t)) => {
            let bytes = t.read(root, 4 << 10, "events-token-file")?;
            let tok = String::from_utf8(bytes)
                .ok()
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_graphic()))
                .ok_or_else(|| {
                    Error::config(format!(
                        "{}: not a bearer token (one line of printable ASCII)",
                        t.name(root, "events-token-file")
                    ))
                })?;
            (Some(tok), format!("the bearer token in {}", t.label(root)))
        }
        (None, None) => (None, "no credentials".to_string()),
    };
    crate::info!("events: sending each decision and phase to {shown}, as {who}");
    Ok(crate::net::events::Target {
        url: url.to_string(),
        shown,
        tls,
        token,
        who,
    })
}

/// `nodestrap verify`, its events sent where the command line or else the node's settings
/// (config file, kernel command line) say; a wrong events setting is a warning, never the boot
/// check's failure.
pub fn verify(v: &Verify, run: &dyn Fn(&Verify) -> Result<()>) -> i32 {
    logged(&v.verbose, || {
        let started = std::time::SystemTime::now();
        let metrics = verify_metrics_dir(v);
        if let Some(d) = &metrics {
            crate::node::metrics::write_to(Path::new("/"), d);
        }
        if let Some(t) = verify_events(v) {
            crate::node::events::open("verify", crate::net::events::Sender::start(t));
            crate::node::events::emit(
                "started",
                serde_json::json!({ "version": crate::VERSION, "root": "/" }),
            );
        }
        let r = run(v);
        // A check that ended before its verdict (an error) says so here.
        if crate::node::events::is_open() {
            crate::node::events::emit(
                "finished",
                serde_json::json!({
                    "exit_code": r.as_ref().map_or_else(|e| e.exit_code(), |_| 0),
                    "error": r.as_ref().err().map(|e| e.to_string()),
                }),
            );
            crate::node::events::close();
        }
        if metrics.is_some() {
            let code = r.as_ref().map_or_else(|e| e.exit_code(), |_| 0);
            // The check's own record was amended by the check: the line says what happened.
            crate::node::metrics::ended(crate::node::metrics::Ended {
                command: "verify",
                started,
                exit_code: code,
                chosen: Vec::new(),
                // A wrong setting (exit 2) judged nothing.
                verified: (code != 2).then_some(code == 0),
            });
        }
        r
    })
}

/// `--metrics-dir` of `nodestrap verify`, else the node's setting.
fn verify_metrics_dir(v: &Verify) -> Option<String> {
    if let Some(d) = &v.metrics_dir {
        return Some(d.clone()).filter(|d| !d.is_empty());
    }
    let root = Root::open(Path::new("/")).ok()?;
    let node = settings::events(&root).unwrap_or_default();
    node.into_iter()
        .find(|(k, _)| *k == "metrics-dir")
        .map(|(_, v)| v)
        .filter(|d| !d.is_empty())
}

fn verify_events(v: &Verify) -> Option<crate::net::events::Target> {
    let root = Root::open(Path::new("/"))
        .inspect_err(|e| crate::warn!("events: {e}"))
        .ok()?;
    let node = settings::events(&root).unwrap_or_else(|e| {
        crate::warn!("events: the node's settings: {e}");
        Vec::new()
    });
    let from_node = |key: &str| node.iter().find(|(k, _)| *k == key).map(|(_, v)| v.clone());
    let input = |given: &Option<Input>, key: &str| {
        given.clone().or_else(|| {
            from_node(key).and_then(|v| <Input as argh::FromArgValue>::from_arg_value(&v).ok())
        })
    };
    let url = v.events_url.clone().or_else(|| from_node("events-url"))?;
    if url.is_empty() {
        return None;
    }
    let token = input(&v.events_token_file, "events-token-file");
    let ca = input(&v.events_ca_file, "events-ca-file");
    events_target(&root, &url, token.as_ref(), ca.as_ref())
        .inspect_err(|e| crate::warn!("events: none sent: {e}"))
        .ok()
}

/// `nodestrap status`: its exit code says how the last run ended.
pub fn status(s: &Status) -> i32 {
    crate::logger::init(log::LevelFilter::Info);
    match s.command {
        RecordOf::One(c) => crate::node::status::print(&s.root, c, s.json),
        RecordOf::All => crate::node::status::print_all(&s.root, s.json),
    }
    .unwrap_or_else(|e| {
        crate::error!("{e}");
        e.exit_code()
    })
}

/// `logged` for a command that keeps a status record of its run under `root` (docs/status.md);
/// a dry run writes none.
pub fn recorded(
    command: &str,
    root: &Path,
    dry_run: bool,
    verbose: &str,
    events: EventsTo,
    f: impl FnOnce() -> Result<()>,
) -> i32 {
    logged(verbose, || {
        if !dry_run {
            begin(command, root, events)?;
        }
        f()
    })
}

/// Where a command's events go (`--events-url`, `--events-token-file`, `--events-ca-file`).
pub struct EventsTo<'a> {
    pub(crate) url: Option<&'a str>,
    pub(crate) token: Option<&'a Input>,
    pub(crate) ca: Option<&'a Input>,
}

/// The commands that send events.
pub trait SendsEvents {
    fn events_to(&self) -> EventsTo<'_>;
}

macro_rules! sends_events {
    ($($t:ty),*) => {$(
        impl SendsEvents for $t {
            fn events_to(&self) -> EventsTo<'_> {
                EventsTo {
                    url: self.events_url.as_deref(),
                    token: self.events_token_file.as_ref(),
                    ca: self.events_ca_file.as_ref(),
                }
            }
        }
    )*};
}
sends_events!(Bootstrap, Hook, Reprovision, Activate, JoinService, Verify);

/// Begin `command`'s status record, its events first when it sends them (so that the receiver
/// sees the run start). A wrong events setting is the run's error, after the record began.
fn begin(command: &str, root: &Path, to: EventsTo) -> Result<()> {
    let target = to
        .url
        .map(|u| Root::open(root).and_then(|r| events_target(&r, u, to.token, to.ca)));
    let said = match target {
        Some(Ok(t)) => {
            let said = (t.shown.clone(), t.who.clone());
            crate::node::events::open(command, crate::net::events::Sender::start(t));
            Ok(Some(said))
        }
        Some(Err(e)) => Err(e),
        None => Ok(None),
    };
    crate::node::status::begin(command, root);
    if let Some((url, who)) = said? {
        crate::node::status::decide("events", url, who);
    }
    Ok(())
}

/// Start the log at `--verbose`, run `f`, and turn its result into the exit code.
pub fn logged(verbose: &str, f: impl FnOnce() -> Result<()>) -> i32 {
    let Some(level) = log_level(verbose) else {
        return 2;
    };
    crate::logger::init(level);
    let r = f();
    let code = match &r {
        Ok(()) => 0,
        Err(e) => {
            crate::error!("{e}");
            e.exit_code()
        }
    };
    // The status record, when the run keeps one, ends with the same outcome.
    crate::node::status::finish(code, r.as_ref().err());
    last_line(code);
    code
}

/// The last line of every run: how long it took, whatever its end.
fn last_line(code: i32) {
    crate::info!(
        "run {} after {:.1} s (exit {code})",
        if code == 0 { "done" } else { "failed" },
        started().elapsed().as_secs_f64()
    );
}

fn log_level(verbose: &str) -> Option<log::LevelFilter> {
    let l = crate::logger::parse_level(verbose);
    if l.is_none() {
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr(),
            "error: --verbose {verbose:?}: expected panic, fatal, error, warn, info, debug or trace"
        );
    }
    l
}
