//! The last run of each command, in node_exporter's textfile collector format (docs/status.md,
//! "Metrics"): `<--metrics-dir>/nodestrap_<command>.prom`, replaced atomically at the run's end,
//! best effort (a folder that cannot be written is a warning and a `metrics` decision, never the
//! run's failure). One file per command, so that runs of two commands never write the same
//! file; the families they share carry the same HELP and TYPE in every file, as the collector
//! needs to merge them. Every value is the last run's (they start again at each run): gauges,
//! named `nodestrap_last_run_*`, never `_total` counters.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// What the network floor counts during a run.
static REQUESTS: AtomicU64 = AtomicU64::new(0);
static BUSY: AtomicU64 = AtomicU64::new(0);
static FETCHED: AtomicU64 = AtomicU64::new(0);
static WAITED_MS: AtomicU64 = AtomicU64::new(0);
/// Where this run writes its file: (the node's root, the folder as a node path).
static TARGET: Mutex<Option<(std::path::PathBuf, String)>> = Mutex::new(None);

/// One HTTP attempt made (every request, every retry).
pub(crate) fn request() {
    REQUESTS.fetch_add(1, Ordering::Relaxed);
}

/// One busy answer (408, 429, 5xx).
pub(crate) fn busy() {
    BUSY.fetch_add(1, Ordering::Relaxed);
}

/// Body bytes received.
pub(crate) fn fetched(n: u64) {
    FETCHED.fetch_add(n, Ordering::Relaxed);
}

/// A pause before another attempt.
pub(crate) fn waited(d: std::time::Duration) {
    WAITED_MS.fetch_add(d.as_millis() as u64, Ordering::Relaxed);
}

/// This run writes its metrics into `dir` (a node path under `root`).
pub(crate) fn write_to(root: &std::path::Path, dir: &str) {
    if let Ok(mut t) = TARGET.lock() {
        *t = Some((root.to_path_buf(), dir.to_string()));
    }
}

/// The families, each with its HELP (the same text in every command's file).
const FAMILIES: &[(&str, &str)] = &[
    ("nodestrap_last_run_start_timestamp_seconds", "When the last run started, in seconds since the epoch."),
    ("nodestrap_last_run_end_timestamp_seconds", "When the last run ended, in seconds since the epoch."),
    ("nodestrap_last_run_duration_seconds", "How long the last run took."),
    ("nodestrap_last_run_exit_code", "The last run's exit code (docs/bootstrap.md, \"Exit codes\")."),
    ("nodestrap_last_run_success", "1 if the last run ended with exit 0, else 0."),
    ("nodestrap_last_run_requests", "HTTP attempts the last run made, retries included."),
    ("nodestrap_last_run_busy_answers", "Busy answers (408, 429, 5xx) the last run got."),
    ("nodestrap_last_run_fetched_bytes", "Body bytes the last run received."),
    ("nodestrap_last_run_waited_seconds", "Seconds the last run paused between attempts."),
    ("nodestrap_last_run_chosen_info", "What the last run chose, one series per extension or image, value 1."),
    ("nodestrap_last_check_verified", "1 if the last boot check found the node running what was chosen, 0 if not, absent before one."),
];

/// What a run ended with, for its file.
pub(crate) struct Ended<'a> {
    pub(crate) command: &'a str,
    pub(crate) started: std::time::SystemTime,
    pub(crate) exit_code: i32,
    /// (name, version) of what it chose.
    pub(crate) chosen: Vec<(String, String)>,
    /// The boot check's verdict, for `verify`.
    pub(crate) verified: Option<bool>,
}

/// The file's text.
pub(crate) fn render(e: &Ended, now: std::time::SystemTime) -> String {
    let epoch = |t: std::time::SystemTime| {
        t.duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64())
    };
    let (started_s, ended_s) = (epoch(e.started), epoch(now));
    let cmd = label(e.command);
    let mut out = String::new();
    let mut family = |name: &str, samples: &[(String, String)]| {
        let help = FAMILIES
            .iter()
            .find(|(n, _)| *n == name)
            .map_or("", |(_, h)| h);
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for (labels, value) in samples {
            let _ = writeln!(out, "{name}{{{labels}}} {value}");
        }
    };
    let one = |v: String| vec![(format!("command=\"{cmd}\""), v)];
    family(
        "nodestrap_last_run_start_timestamp_seconds",
        &one(format!("{:.3}", started_s)),
    );
    family(
        "nodestrap_last_run_end_timestamp_seconds",
        &one(format!("{:.3}", ended_s)),
    );
    family(
        "nodestrap_last_run_duration_seconds",
        &one(format!("{:.3}", (ended_s - started_s).max(0.0))),
    );
    family(
        "nodestrap_last_run_exit_code",
        &one(e.exit_code.to_string()),
    );
    family(
        "nodestrap_last_run_success",
        &one(u8::from(e.exit_code == 0).to_string()),
    );
    family(
        "nodestrap_last_run_requests",
        &one(REQUESTS.load(Ordering::Relaxed).to_string()),
    );
    family(
        "nodestrap_last_run_busy_answers",
        &one(BUSY.load(Ordering::Relaxed).to_string()),
    );
    family(
        "nodestrap_last_run_fetched_bytes",
        &one(FETCHED.load(Ordering::Relaxed).to_string()),
    );
    let waited = WAITED_MS.load(Ordering::Relaxed) as f64 / 1000.0;
    family(
        "nodestrap_last_run_waited_seconds",
        &one(format!("{waited:.3}")),
    );
    let chosen: Vec<(String, String)> = e
        .chosen
        .iter()
        .map(|(n, v)| {
            (
                format!(
                    "command=\"{cmd}\",name=\"{}\",version=\"{}\"",
                    label(n),
                    label(v)
                ),
                "1".into(),
            )
        })
        .collect();
    family("nodestrap_last_run_chosen_info", &chosen);
    if let Some(ok) = e.verified {
        family(
            "nodestrap_last_check_verified",
            &one(u8::from(ok).to_string()),
        );
    }
    out
}

/// A label value as the text format takes it: backslash, double quote and newline escaped.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Write the run's file where `write_to` said, if it did, best effort: a line either way, and
/// what happened, for the run's record (`metrics`: `written` or `not written`, and where or why).
pub(crate) fn ended(e: Ended) -> Option<(&'static str, String)> {
    match write(&e) {
        Ok(None) => None,
        Ok(Some(at)) => {
            crate::info!("metrics written to {at}");
            Some(("written", at))
        }
        Err(err) => {
            crate::warn!("metrics not written: {err}");
            Some(("not written", err.to_string()))
        }
    }
}

fn write(e: &Ended) -> crate::error::Result<Option<String>> {
    let Some((root, dir)) = TARGET.lock().ok().and_then(|t| t.clone()) else {
        return Ok(None);
    };
    let root = crate::node::root::Root::open(&root)?;
    let d = root.make_dir(&dir)?;
    let name = format!("nodestrap_{}.prom", e.command.replace('-', "_"));
    d.write_atomic(
        &name,
        render(e, std::time::SystemTime::now()).as_bytes(),
        0o644,
    )?;
    Ok(Some(d.show(&name)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_carry_help_and_type_and_escaped_labels() {
        let at = |s: f64| std::time::UNIX_EPOCH + std::time::Duration::from_secs_f64(s);
        let e = Ended {
            command: "bootstrap",
            started: at(10.0),
            exit_code: 1,
            chosen: vec![("kubernetes".into(), "v1.32.\"3\"".into())],
            verified: None,
        };
        let t = render(&e, at(12.5));
        assert!(t.contains("# TYPE nodestrap_last_run_exit_code gauge\nnodestrap_last_run_exit_code{command=\"bootstrap\"} 1\n"), "{t}");
        assert!(
            t.contains("nodestrap_last_run_success{command=\"bootstrap\"} 0\n"),
            "{t}"
        );
        assert!(
            t.contains("nodestrap_last_run_duration_seconds{command=\"bootstrap\"} 2.500\n"),
            "{t}"
        );
        assert!(t.contains("version=\"v1.32.\\\"3\\\"\""), "{t}");
        assert!(!t.contains("nodestrap_last_check_verified"), "{t}");
    }
}
