//! Showing the status record: `nodestrap status` for a person (one screen) or a tool (`--json`),
//! and its exit codes.

use std::path::Path;

use crate::error::{Error, Result};
use crate::node::root::Root;
use crate::node::run::run_dir;

use super::*;

/// What `nodestrap status` exits with: 0 the last run is done, 1 it failed or was interrupted,
/// 3 it is still running, 4 there is no record.
pub(crate) fn print(root: &Path, command: &str, json: bool) -> Result<i32> {
    let Some((r, from)) = load(root, command)? else {
        crate::error!(
            "no status record at {} nor {}: no {command} has run",
            run_file(command).display(),
            Root::open(root)?.show(&kept(command))
        );
        return Ok(4);
    };
    if json {
        crate::outln!("{}", to_json_text(&r)?.trim_end())?;
    } else {
        for line in human_lines(&r, &from) {
            crate::outln!("{line}")?;
        }
    }
    Ok(exit_code(&r))
}

/// `--command all`: the last record of each command that has one, bootstrap first; the exit
/// code is bootstrap's when it has a record, else the first found's, else 4. `--json` prints
/// them as one array.
pub(crate) fn print_all(root: &Path, json: bool) -> Result<i32> {
    let mut found = Vec::new();
    for c in COMMANDS {
        // One unreadable record does not hide the others.
        match load(root, c) {
            Ok(Some(x)) => found.push(x),
            Ok(None) => {}
            Err(e) => crate::error!("{e}"),
        }
    }
    if found.is_empty() {
        crate::error!(
            "no status record of any command under {} nor {}",
            run_dir().display(),
            Root::open(root)?.show(KEPT_DIR)
        );
        return Ok(4);
    }
    if json {
        let all: Vec<&Record> = found.iter().map(|(r, _)| r).collect();
        let text = serde_json::to_string_pretty(&all)
            .map_err(|e| Error::failed(format!("status records: {e}")))?;
        crate::outln!("{text}")?;
    } else {
        for (i, (r, from)) in found.iter().enumerate() {
            if i > 0 {
                crate::outln!("")?;
            }
            for line in human_lines(r, from) {
                crate::outln!("{line}")?;
            }
        }
    }
    Ok(exit_code(&found[0].0))
}

pub(super) fn exit_code(r: &Record) -> i32 {
    match r.state {
        State::Done
            if r.verification
                .as_ref()
                .is_some_and(|v| v.outcome == Outcome::Mismatch) =>
        {
            5
        }
        State::Done => 0,
        // The last attempt failed, and the node still runs what an earlier one staged.
        State::Failed | State::Interrupted if r.running.is_some() => 6,
        State::Failed | State::Interrupted => 1,
        State::Running => 3,
    }
}

/// The record for a person, one screen: how the run ended, then each decision and file
/// (`from`: the file it was read from).
pub fn human_lines(r: &Record, from: &str) -> Vec<String> {
    let state = state_words(r);
    let mut out = vec![format!("nodestrap {} {}: {state}", r.command, r.version)];
    let mut row = |k: &str, v: String| out.push(format!("  {k:<16} {v}"));
    row(
        "started",
        match (&r.ended, r.duration_s) {
            (Some(e), Some(d)) => format!("{}, ended {e} ({d:.1} s)", r.started),
            _ => r.started.clone(),
        },
    );
    row("root", r.root.clone());
    if let Some(e) = &r.error {
        row("error", e.clone());
    }
    if r.state != State::Done {
        if let Some(run) = &r.running {
            row("running", running_line(run));
        } else if r.state != State::Running {
            row(
                "running",
                "nothing: no run of this command has succeeded on this root".into(),
            );
        }
    }
    if r.state == State::Failed {
        row(
            "next",
            match r.exit_code {
                Some(2) => "a configuration error: fix what the error names and run again; no unit retries it".into(),
                _ => "the unit (or the patch timer) tries again; what runs stays until a run succeeds".to_string(),
            },
        );
    }
    for d in &r.decisions {
        row(&d.what, format!("{}  from {}", d.value, d.source));
    }
    for f in &r.files {
        let short: String = f.digest.chars().take(23).collect();
        let more = if short.len() < f.digest.len() {
            "…"
        } else {
            ""
        };
        row("staged", format!("{}  {short}{more}", f.path));
    }
    if let Some(m) = &r.kubelet_env {
        row(
            "kubelet",
            format!("{} written {:.1} s after boot", m.path, m.since_boot_s),
        );
    }
    row(
        "reboot",
        match &r.reboot {
            Reboot::Undecided => "not decided".to_string(),
            Reboot::No => "no".to_string(),
            Reboot::Needed { reason } => format!("needed: {reason}"),
        },
    );
    if let Some(v) = &r.verification {
        for (k, line) in verification_rows(v) {
            row(k, line);
        }
    }
    row("record", from.to_string());
    out
}

/// The first line's verdict: running, done, interrupted or failed, with the phase.
fn state_words(r: &Record) -> String {
    match (r.state, r.exit_code) {
        (State::Running, _) => format!("running, phase {}", phase_word(r.phase)),
        (State::Done, _) => "done".to_string(),
        (State::Interrupted, _) => format!(
            "INTERRUPTED in phase {}: its process {} is gone (killed, or the machine restarted) before it ended its record",
            phase_word(r.phase),
            r.process.as_ref().map_or(0, |p| p.pid)
        ),
        (State::Failed, c) => format!(
            "FAILED (exit {}) in phase {}",
            c.unwrap_or(1),
            phase_word(r.phase)
        ),
    }
}

/// The boot check's rows: what it found, who merged, and any return to the known-good set.
fn verification_rows(v: &Verification) -> Vec<(&'static str, String)> {
    let api = match v.api {
        ApiCheck::Confirmed => "the Node says the same",
        ApiCheck::Unreached => "the API server was not reached",
        ApiCheck::Mismatch => "the Node says otherwise",
        ApiCheck::Skipped => "the API server was not asked",
    };
    let found = match v.outcome {
        Outcome::Verified => format!("verified at {}: runs as chosen; {api}", v.at),
        Outcome::Mismatch => format!("MISMATCH at {}: {}", v.at, v.first_mismatch()),
    };
    let mut rows = vec![("after boot", found)];
    if let Some(by) = &v.merged_by {
        rows.push((
            "merged by",
            match by.as_str() {
                "initramfs" => "the initramfs (systemd-sysext-sysroot.service)".to_string(),
                "real-root" => "the real root (systemd-sysext.service)".to_string(),
                other => other.to_string(),
            },
        ));
    }
    if let Some(back) = &v.returned {
        let set: Vec<String> = back
            .to
            .iter()
            .map(|c| format!("{} {}", c.name, c.version))
            .collect();
        // Only a return that merged put the node back.
        rows.push((
            "returned",
            match back.result.as_str() {
                "merged" => format!("to the known-good set {} (merged)", set.join(", ")),
                failed => format!(
                    "NO: the node stays as found; the return to the known-good set {} failed: {failed}",
                    set.join(", ")
                ),
            },
        ));
    }
    rows
}

/// `kubernetes v1.32.3 sha256-1a2b…, containerd 1.7.24 sha256-…, since 2026-…` (sysext), or
/// the staged files (torcx).
pub(super) fn running_line(run: &Running) -> String {
    let short = |d: &str| {
        let s: String = d.chars().take(19).collect();
        if s.len() < d.len() {
            s + "…"
        } else {
            s
        }
    };
    let set: Vec<String> = if run.chosen.is_empty() {
        run.files
            .iter()
            .map(|f| format!("{} {}", f.path, short(&f.digest)))
            .collect()
    } else {
        run.chosen
            .iter()
            .map(|c| format!("{} {} {}", c.name, c.version, short(&c.digest)))
            .collect()
    };
    let k8s = run
        .k8s
        .as_ref()
        .map(|k| format!(" for a {k} cluster"))
        .unwrap_or_default();
    let set = if set.is_empty() {
        "what it staged".to_string()
    } else {
        set.join(", ")
    };
    format!("{set}{k8s}, since {}", run.since)
}

/// The phase's name as the record spells it.
pub(super) fn phase_word(p: Phase) -> String {
    serde_json::to_value(p)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}
