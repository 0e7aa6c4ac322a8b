//! The status record: what the last run decided, from which source, what it staged, how far it
//! got and how it ended, for an operator (`nodestrap status`) and for other tools (`--json`).
//! Its schema is in docs/status.md.
//!
//! A run that keeps a record calls `begin`; the steps call `decide`, `staged`, `phase`, `reboot`
//! and `marker` as they go (no-ops without a record, so the shared steps need not know which
//! command runs them), and `cli::logged` calls `finish` with the outcome. The record is written
//! atomically to `/run/nodestrap/status.json` when the run begins, at each phase and at its end,
//! and at its end also under the node's root, `/var/lib/nodestrap/status.json`, which outlives
//! a reboot. Here the record and its recording; `keep` writes and reads it, `show` shows it.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use serde_json::json;

use crate::error::Error;
use crate::node::events::emit;
use crate::node::root::Root;
pub(crate) use crate::node::run::rfc3339;
use crate::node::run::start_ticks;

pub(crate) const SCHEMA: u32 = 1;
/// The last completed bootstrap's copy, a node path under the root (units test for it).
pub(crate) const KEPT: &str = "/var/lib/nodestrap/status.json";
const KEPT_DIR: &str = "/var/lib/nodestrap";

/// The commands that keep a record, each in its own file: `status.json` for bootstrap (the
/// name units and tools know), `status-<command>.json` for the others.
pub(crate) const COMMANDS: [&str; 6] = [
    "bootstrap",
    "hook",
    "preflight",
    "reprovision",
    "activate",
    "join-service",
];

fn file_name(command: &str) -> String {
    match command {
        "bootstrap" => "status.json".to_string(),
        c => format!("status-{c}.json"),
    }
}

/// The kept copy of `command`'s last run, a node path under the root.
pub(crate) fn kept(command: &str) -> String {
    format!("{KEPT_DIR}/{}", file_name(command))
}
/// A record is small; a larger file is not ours.
const CAP: u64 = 1 << 20;
/// Bounds on what one run records, so a record stays small whatever the input.
const MAX_ENTRIES: usize = 64;

/// How far the run got. Runs go forward only; a failure names the last phase reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Phase {
    /// Options checked, nothing decided yet.
    Started,
    /// The cluster's version is known.
    Version,
    /// The payload is chosen (images, runtime, OS update).
    Chosen,
    /// Every file of the payload is in place.
    Staged,
    /// kubelet.env, the done marker, is written.
    Marker,
    /// Reported, and the reboot decided.
    Done,
    /// After a boot, `nodestrap verify` found running what the run chose.
    Verified,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum State {
    Running,
    Done,
    Failed,
    /// Never written: what a reader makes of `running` when the run's process is gone (killed,
    /// or the machine rebooted) so it never ended its record.
    Interrupted,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "decision", rename_all = "kebab-case")]
pub(crate) enum Reboot {
    /// The run ended before deciding.
    Undecided,
    No,
    Needed {
        reason: String,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    pub(crate) what: String,
    pub(crate) value: String,
    pub(crate) source: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Staged {
    /// Node path (under `root`).
    pub(crate) path: String,
    /// `sha256-<hex>` or `sha512-<hex>`, as verified.
    pub(crate) digest: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Marker {
    pub(crate) path: String,
    /// Seconds from the kernel's start to the marker's write: the node's wait for its kubelet.
    pub(crate) since_boot_s: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub(crate) schema: u32,
    pub(crate) command: String,
    pub(crate) version: String,
    pub(crate) root: String,
    /// RFC 3339, UTC.
    pub(crate) started: String,
    pub(crate) ended: Option<String>,
    pub(crate) duration_s: Option<f64>,
    pub(crate) state: State,
    pub(crate) exit_code: Option<i32>,
    pub(crate) phase: Phase,
    pub(crate) error: Option<String>,
    pub decisions: Vec<Decision>,
    pub files: Vec<Staged>,
    pub(crate) reboot: Reboot,
    pub(crate) kubelet_env: Option<Marker>,
    /// The run's process, so that a reader tells a live run from a killed one (`null` in
    /// records of older versions).
    #[serde(default)]
    pub(crate) process: Option<Process>,
    /// The set the run settled on, one entry per extension it manages (sysext): what
    /// `nodestrap verify` compares with what runs after a boot.
    #[serde(default)]
    pub(crate) chosen: Vec<Chosen>,
    /// What `nodestrap verify` found after the last boot (sysext).
    #[serde(default)]
    pub(crate) verification: Option<Verification>,
    /// What became of the run's events (`--events-url`); `null` when it sent none.
    #[serde(default)]
    pub(crate) events: Option<crate::node::events::Delivery>,
    /// What the node runs from this command's last run that succeeded (this one, when it did):
    /// carried into every later record, so that a failed attempt never hides the set still in
    /// place; `null` when no run of this command has succeeded on this root.
    #[serde(default)]
    pub(crate) running: Option<Running>,
}

/// The set in place: what the last successful run staged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Running {
    /// When that run ended (RFC 3339, UTC).
    pub(crate) since: String,
    /// The cluster version it went by (its `k8s` decision), if it had one.
    pub(crate) k8s: Option<String>,
    /// The extensions it settled on (sysext).
    pub(crate) chosen: Vec<Chosen>,
    /// The files it staged, with their verified digests (torcx images, sysext images).
    pub(crate) files: Vec<Staged>,
}

impl Running {
    fn of(r: &Record) -> Running {
        Running {
            since: r.ended.clone().unwrap_or_else(|| r.started.clone()),
            k8s: r
                .decisions
                .iter()
                .find(|d| d.what == "k8s")
                .map(|d| d.value.clone()),
            chosen: r.chosen.clone(),
            files: r.files.clone(),
        }
    }

    /// This run's set, since when it first ran: a run that left the same set in place (a patch
    /// run with nothing new, a held one) keeps the earlier `since`.
    fn since_unchanged(self, before: Option<Running>) -> Running {
        let same = |b: &Running| {
            if self.chosen.is_empty() {
                b.files == self.files
            } else {
                b.chosen == self.chosen
            }
        };
        match before {
            Some(b) if same(&b) => Running {
                since: b.since,
                ..self
            },
            _ => self,
        }
    }

    /// The set carried from the record this command kept under `root` before this run.
    fn before(root: &Path, command: &str) -> Option<Running> {
        let root = Root::open(root).ok()?;
        let f = root.open_file(&kept(command)).ok()??;
        let (prev, _) = parse(f, "").ok()?;
        match prev.state {
            State::Done => Some(Running::of(&prev)),
            _ => prev.running,
        }
    }
}

/// Who wrote a record: this boot's ID, the PID and the process's start (clock ticks after
/// boot, /proc/PID/stat field 22), which together name one process even when PIDs are reused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Process {
    pub(crate) pid: u32,
    pub(crate) start_ticks: u64,
    pub(crate) boot_id: String,
}

impl Process {
    fn this() -> Option<Process> {
        let pid = std::process::id();
        Some(Process {
            pid,
            start_ticks: start_ticks(pid)?,
            boot_id: crate::node::seams::boot_id().ok()?,
        })
    }

    /// Whether this process still runs (on this boot). Unknowable ones count as alive: a
    /// reader must not call a live run interrupted.
    fn alive(&self) -> bool {
        match crate::node::seams::boot_id() {
            Ok(b) if b != self.boot_id => false,
            _ => {
                start_ticks(self.pid).is_none_or(|t| t == self.start_ticks)
                    && std::path::Path::new(&format!("/proc/{}", self.pid)).exists()
            }
        }
    }
}

struct Open {
    record: Record,
    root: PathBuf,
    since: std::time::Instant,
}

static OPEN: Mutex<Option<Open>> = Mutex::new(None);
static STARTED: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();

/// When this run started (the first call; `cli` makes it early): the run's deadline and its
/// duration count from here.
pub fn started() -> std::time::Instant {
    *STARTED.get_or_init(std::time::Instant::now)
}

fn with(f: impl FnOnce(&mut Open)) {
    if let Ok(mut g) = OPEN.lock() {
        if let Some(o) = g.as_mut() {
            f(o);
        }
    }
}

/// Start this run's record (not for a dry run, which writes nothing).
pub(crate) fn begin(command: &str, root: &Path) {
    let record = Record {
        schema: SCHEMA,
        command: command.to_string(),
        version: crate::VERSION.to_string(),
        root: root.display().to_string(),
        started: rfc3339(SystemTime::now()),
        ended: None,
        duration_s: None,
        state: State::Running,
        exit_code: None,
        phase: Phase::Started,
        error: None,
        decisions: Vec::new(),
        files: Vec::new(),
        reboot: Reboot::Undecided,
        kubelet_env: None,
        process: Process::this(),
        chosen: Vec::new(),
        verification: None,
        events: None,
        running: Running::before(root, command),
    };
    emit(
        "started",
        json!({"version": record.version, "root": record.root, "started": record.started}),
    );
    if let Ok(mut g) = OPEN.lock() {
        *g = Some(Open {
            record,
            root: root.to_path_buf(),
            since: started(),
        });
    }
    save_running();
}

/// One decision: what was decided, the value, and where it came from.
pub(crate) fn decide(what: &str, value: impl std::fmt::Display, source: impl std::fmt::Display) {
    with(|o| {
        let d = &mut o.record.decisions;
        let entry = Decision {
            what: what.to_string(),
            value: value.to_string(),
            source: source.to_string(),
        };
        emit("decision", json!(entry));
        // A decision taken again (the same `what`) replaces the earlier one.
        if let Some(x) = d.iter_mut().find(|x| x.what == entry.what) {
            *x = entry;
        } else if d.len() < MAX_ENTRIES {
            d.push(entry);
        }
    });
}

/// A file now in place at `path` (node path), verified against `digest`.
pub(crate) fn staged(path: &str, digest: impl std::fmt::Display) {
    with(|o| {
        let s = Staged {
            path: path.to_string(),
            digest: digest.to_string(),
        };
        emit("staged", json!(s));
        if o.record.files.len() < MAX_ENTRIES {
            o.record.files.push(s);
        }
    });
}

/// One extension of the set this run settles on (replacing an earlier entry of that name).
pub(crate) fn chosen(c: Chosen) {
    with(|o| {
        emit("chosen", json!(c));
        let set = &mut o.record.chosen;
        if let Some(x) = set.iter_mut().find(|x| x.name == c.name) {
            *x = c;
        } else if set.len() < MAX_ENTRIES {
            set.push(c);
        }
    });
}

/// A run that changes nothing on purpose (a rollout hold) settles on the set that runs: the
/// carried `running` set becomes its `chosen`, which the boot check compares with what runs.
pub(crate) fn keep_running_set() {
    with(|o| {
        if let Some(run) = &o.record.running {
            o.record.chosen = run.chosen.clone();
        }
    });
}

/// Whether this run authenticates the lists and manifests it fetches: `false` under
/// `--no-verify-signatures`.
static UNVERIFIED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Records whether signatures are checked (the `signatures` decision: `verified` and the
/// keyring, or `not verified`), so that an audit finds every node that took unauthenticated
/// payloads; from then on `signed` words this run's log lines.
pub(crate) fn signatures(verified: bool, source: impl std::fmt::Display) {
    UNVERIFIED.store(!verified, std::sync::atomic::Ordering::Relaxed);
    decide(
        "signatures",
        if verified { "verified" } else { "not verified" },
        source,
    );
}

/// What names the digests a payload must match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum List {
    /// A sysext source's SHA256SUMS.
    Sums,
    /// A torcx package manifest.
    Manifest,
}

/// `the signed SHA256SUMS`, or `the unverified SHA256SUMS` when this run checks no signature:
/// no line calls signed what nobody checked.
pub(crate) fn signed(what: List) -> &'static str {
    let unverified = UNVERIFIED.load(std::sync::atomic::Ordering::Relaxed);
    match (what, unverified) {
        (List::Sums, false) => "the signed SHA256SUMS",
        (List::Sums, true) => "the unverified SHA256SUMS",
        (List::Manifest, false) => "the signed manifest",
        (List::Manifest, true) => "the unverified manifest",
    }
}

pub(crate) fn phase(p: Phase) {
    let mut moved = false;
    with(|o| {
        if p > o.record.phase {
            o.record.phase = p;
            moved = true;
            emit("phase", json!({ "phase": p }));
        }
    });
    if moved {
        save_running();
    }
}

pub(crate) fn reboot(r: Reboot) {
    with(|o| {
        emit("reboot", json!({ "reboot": r }));
        o.record.reboot = r
    });
}

pub(crate) fn marker(path: &str, since_boot: std::time::Duration) {
    with(|o| {
        let m = Marker {
            path: path.to_string(),
            since_boot_s: round(since_boot.as_secs_f64()),
        };
        emit("marker", json!(m));
        o.record.kubelet_env = Some(m)
    });
}

/// End the record with the run's exit code and error, and write both copies. A record that
/// cannot be written is logged; it does not change how the run ended.
pub(crate) fn finish(code: i32, error: Option<&Error>) {
    let Some(mut o) = OPEN.lock().ok().and_then(|mut g| g.take()) else {
        return;
    };
    let r = &mut o.record;
    r.ended = Some(rfc3339(SystemTime::now()));
    r.duration_s = Some(round(o.since.elapsed().as_secs_f64()));
    r.exit_code = Some(code);
    r.state = if code == 0 {
        State::Done
    } else {
        State::Failed
    };
    r.error = error.map(|e| e.to_string());
    if code == 0 {
        r.phase = Phase::Done;
        r.running = Some(Running::of(r).since_unchanged(r.running.take()));
    }
    emit(
        "finished",
        json!({"state": r.state, "exit_code": code, "phase": r.phase, "error": r.error,
               "duration_s": r.duration_s}),
    );
    r.events = crate::node::events::close();
    // The metrics file (if asked for), then what became of it, in the record.
    let metrics = crate::node::metrics::ended(crate::node::metrics::Ended {
        command: &r.command,
        started: SystemTime::now() - o.since.elapsed(),
        exit_code: code,
        chosen: r
            .chosen
            .iter()
            .map(|c| (c.name.clone(), c.version.clone()))
            .collect(),
        verified: None,
    });
    if let Some((value, source)) = metrics {
        r.decisions.push(Decision {
            what: "metrics".into(),
            value: value.into(),
            source,
        });
    }
    let json = match to_json(r) {
        Ok(j) => j,
        Err(e) => return crate::error!("{e}"),
    };
    // A record that cannot be written is a warning: the run's own error stays the last.
    let command = o.record.command.clone();
    if let Err(e) = save_run_dir(&command, &json) {
        crate::warn!("{e}");
    }
    let kept_at = kept(&command);
    let kept = Root::open(&o.root).and_then(|root| {
        root.write_atomic(&kept_at, &json, 0o644)?;
        Ok(root.show(&kept_at))
    });
    match kept {
        Ok(at) => crate::info!(
            "status record written to {} and {at}",
            run_file(&command).display()
        ),
        Err(e) => crate::warn!("status record: {e}"),
    }
}

fn save_running() {
    let Some((command, json)) = OPEN.lock().ok().and_then(|g| {
        g.as_ref()
            .map(|o| (o.record.command.clone(), to_json(&o.record)))
    }) else {
        return;
    };
    if let Err(e) = json.and_then(|j| save_run_dir(&command, &j)) {
        crate::warn!("{e}");
    }
}

mod keep;
mod show;
mod verification;
pub use keep::*;
pub use show::*;
pub(crate) use verification::*;

fn round(s: f64) -> f64 {
    (s * 10.0).round() / 10.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn rfc3339_dates() {
        let at = |s| rfc3339(UNIX_EPOCH + Duration::from_secs(s));
        assert_eq!(at(0), "1970-01-01T00:00:00Z");
        assert_eq!(at(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(at(1_795_325_200), "2026-11-22T05:26:40Z");
        assert_eq!(at(1_795_570_799), "2026-11-25T01:39:59Z");
        assert_eq!(at(4_107_542_400), "2100-03-01T00:00:00Z");
    }

    #[test]
    fn phases_only_go_forward_and_read_as_the_record_spells_them() {
        assert!(Phase::Started < Phase::Version && Phase::Marker < Phase::Done);
        assert_eq!(phase_word(Phase::Started), "started");
        assert_eq!(phase_word(Phase::Done), "done");
    }
}
