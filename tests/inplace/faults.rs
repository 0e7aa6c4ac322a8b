//! Issue 49: `reprovision` (the RHCOS flow) failing (EIO, ENOSPC) at every mutating call and
//! killed (SIGKILL) at every rename and fsync, then run again in the same boot, as the
//! DaemonSet's pod restarts: it resumes at its phase and converges to what a clean run leaves,
//! and the boot after the MCD's reboot finds it done. Only nodestrap's own process gets the
//! faults (the machine-config-daemon it hands over to is another program).

use super::*;
use support::faults::{self, Case, Fault};

/// What the stand-in MCD recorded, gone: each case counts its own runs.
fn forget_mcd(w: &World) {
    for f in ["mcd-runs", "mcd-args", "mc.json", "mc.mode"] {
        let _ = std::fs::remove_file(w.rec.join(f));
    }
}

/// The phase in state.json, read whole: None when there is none yet.
fn phase(w: &World) -> Result<Option<String>, String> {
    let p = w.path("/var/lib/nodestrap/reprovision/state.json");
    let bytes = match std::fs::read(&p) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        r => r.map_err(|e| format!("{}: {e}", p.display()))?,
    };
    let v: Value =
        serde_json::from_slice(&bytes).map_err(|e| format!("{}: not whole: {e}", p.display()))?;
    v["phase"]
        .as_str()
        .map(|s| Some(s.to_string()))
        .ok_or_else(|| format!("{}: no phase: {v}", p.display()))
}

/// The boot after the hand-off: the run finds the node done, the records whole and no temp file
/// left. The faulted run's words for the outcome (`first`: its phase).
fn done_after_the_reboot(w: &mut World, run: &Run, first: Option<&str>) -> Result<String, String> {
    w.boot("boot-2");
    let done = Run::from(w.command("reprovision").output().unwrap());
    if done.code != 0 || phase(w)?.as_deref() != Some("done") {
        return Err(format!("boot 2: exit {}:\n{}", done.code, done.stderr));
    }
    faults::records_whole(&w.root)?;
    let temps = faults::temps_under(&w.root);
    if !temps.is_empty() {
        return Err(format!("temp files left: {temps:?}"));
    }
    Ok(match (run.code, first) {
        (0, _) => "succeeded".to_string(),
        (_, p) => format!("failed at {}", p.unwrap_or("the start")),
    })
}

#[test]
fn fault_matrix_of_an_rhcos_reprovision() {
    if !faults::native() {
        return;
    }
    let mut w = World::new("rhcos");
    let work = unique_dir("rp-faults");
    let pristine = work.join("pristine");
    faults::copy_tree(&w.root, &pristine);
    // The state and the records hold the clock and the run; they are judged on their own.
    let skip = ["var/lib/nodestrap", "run/nodestrap"];

    let trace = work.join("trace");
    // The main thread's calls (`trace`), which `command_of_main` faults.
    let (calls, run) = faults::trace(&w.command("reprovision"), &trace);
    run.assert_ok();
    assert_eq!(phase(&w).unwrap().as_deref(), Some("reboot-pending"));
    assert_eq!(w.mcd_runs(), 1);
    let after = faults::snapshot(&w.root, &skip);
    assert!(
        calls.iter().any(|c| c.line.contains("state.json")),
        "{calls:#?}"
    );

    let out = work.join("inject");
    let mut judge = |c: &Case| -> Result<String, String> {
        faults::copy_tree(&pristine, &w.root);
        forget_mcd(&w);
        w.boot("boot-1");
        let mut cmd = c.command_of_main(&w.command("reprovision"), &out);
        let run = Run::from(cmd.output().unwrap());
        if !faults::was_injected(&out) {
            return Err("strace did not inject it".into());
        }
        let first = phase(&w)?;
        faults::records_whole(&w.root)?;
        if c.fault == Fault::Kill && run.code == 0 {
            return Err("the kill did not end the run".into());
        }
        let mcd_first = w.mcd_runs();
        // The pod restarted, same boot.
        let again = Run::from(w.command("reprovision").output().unwrap());
        let now = faults::snapshot(&w.root, &skip);
        // Either phase ends the hand-off in this boot: `reboot-pending`, or `handed-off` with
        // the encapsulated file taken by the daemon (a later record that could not be written).
        let ended = matches!(phase(&w)?.as_deref(), Some("reboot-pending" | "handed-off"));
        if again.code != 0 || !ended || now != after {
            return Err(format!(
                "after {first:?} (exit {}), the next run did not converge (exit {}, {:?}):\n{}\n{}",
                run.code,
                again.code,
                phase(&w),
                faults::diff(&after, &now),
                again.stderr
            ));
        }
        let mcd = w.mcd_runs();
        if mcd == 0 || mcd > 2 || (mcd == 2 && first.as_deref() == Some("reboot-pending")) {
            return Err(format!("the MCD ran {mcd} times (after {first:?})"));
        }
        // The hand-off's reboot: the next boot finds the node done.
        let label = done_after_the_reboot(&mut w, &run, first.as_deref())?;
        Ok(if mcd == 2 && mcd_first == 1 {
            format!("{label}, resumed, the MCD handed the config twice")
        } else {
            format!("{label}, resumed")
        })
    };
    eprintln!("reprovision (rhcos): {} mutating calls", calls.len());
    faults::each_case("reprovision (rhcos)", &faults::cases(&calls), &mut judge);
    let _ = std::fs::remove_dir_all(&work);
}

/// The RHEL flow (a verified payload, its entry script) under the same faults: the run again in
/// the same boot converges to the clean run's phase and tree (the payload, which may hold
/// credentials, gone even where the faulted run could not remove it), an entry script whose
/// success was recorded is not run again, and the next boot finds the node done.
#[test]
fn fault_matrix_of_a_rhel_reprovision() {
    if !faults::native() {
        return;
    }
    let mut w = World::new("rhel");
    let rec = w.rec.display().to_string();
    let payload = tgz(&[
        (
            "bootstrap.sh",
            format!("#!/bin/sh\necho x >>{rec}/entry-ran\n").as_bytes(),
            0o755,
        ),
        ("lib/data.txt", b"payload data\n", 0o644),
    ]);
    w.secret_key(
        "payload-sha256",
        &format!("sha256:{}", sha256_hex(&payload)),
    );
    w.serve_payload(payload);
    let work = unique_dir("rp-rhel-faults");
    let pristine = work.join("pristine");
    faults::copy_tree(&w.root, &pristine);
    let skip = [
        "var/lib/nodestrap/reprovision/state.json",
        "var/lib/nodestrap/status-reprovision.json",
        "run/nodestrap",
    ];
    let entry_runs = |w: &World| {
        std::fs::read_to_string(w.rec.join("entry-ran"))
            .map(|s| s.lines().count())
            .unwrap_or(0)
    };

    let trace = work.join("trace");
    let (calls, run) = faults::trace(&w.command("reprovision"), &trace);
    run.assert_ok();
    let clean = phase(&w).unwrap();
    assert!(clean.is_some());
    assert_eq!(entry_runs(&w), 1);
    let after = faults::snapshot(&w.root, &skip);

    let out = work.join("inject");
    let mut judge = |c: &Case| -> Result<String, String> {
        faults::copy_tree(&pristine, &w.root);
        let _ = std::fs::remove_file(w.rec.join("entry-ran"));
        w.boot("boot-1");
        let mut cmd = c.command_of_main(&w.command("reprovision"), &out);
        let run = Run::from(cmd.output().unwrap());
        if !faults::was_injected(&out) {
            return Err("strace did not inject it".into());
        }
        let first = phase(&w)?;
        faults::records_whole(&w.root)?;
        if c.fault == Fault::Kill && run.code == 0 {
            return Err("the kill did not end the run".into());
        }
        let runs_first = entry_runs(&w);
        let again = Run::from(w.command("reprovision").output().unwrap());
        let now = faults::snapshot(&w.root, &skip);
        if again.code != 0 || phase(&w)? != clean || now != after {
            return Err(format!(
                "after {first:?} (exit {}), the next run did not converge (exit {}, {:?}):\n{}\n{}",
                run.code,
                again.code,
                phase(&w),
                faults::diff(&after, &now),
                again.stderr
            ));
        }
        let runs = entry_runs(&w);
        // A second run of the script only when its success was never recorded (no phase yet).
        if runs == 0 || runs > 2 || (runs == 2 && first.is_some()) {
            return Err(format!(
                "the entry script ran {runs} times (after {first:?})"
            ));
        }
        let label = done_after_the_reboot(&mut w, &run, first.as_deref())?;
        Ok(if runs == 2 && runs_first == 1 {
            format!("{label}, resumed, the entry script ran again")
        } else {
            format!("{label}, resumed")
        })
    };
    eprintln!("reprovision (rhel): {} mutating calls", calls.len());
    faults::each_case("reprovision (rhel)", &faults::cases(&calls), &mut judge);
    let _ = std::fs::remove_dir_all(&work);
}
