//! The fault matrix: a run of nodestrap traced with strace to list every mutating system call
//! of its main thread, then run again once per call with a fault injected there (EIO, ENOSPC,
//! or SIGKILL on entry), each time from the same tree; what the run leaves behind is compared
//! with the tree before it and with the tree a clean run leaves. strace counts each syscall
//! per thread, which is how one call is picked out (`when=N`). Needs strace (.ci/setup).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use super::Run;

/// System calls that change files. `openat` counts only with `O_CREAT`, `write` from the first
/// rename on (before it, the number of writes of a download depends on the network).
pub const MUTATING: &[&str] = &[
    "openat",
    "write",
    "pwrite64",
    "fsync",
    "fdatasync",
    "rename",
    "renameat",
    "renameat2",
    "unlink",
    "unlinkat",
    "symlinkat",
    "mkdirat",
    "fchmod",
    "ftruncate",
    "linkat",
];

/// One traced call of the main thread: the syscall, its ordinal among that thread's calls of
/// the same syscall (strace's `when=`), and strace's line.
#[derive(Debug, Clone)]
pub struct Call {
    pub syscall: String,
    pub nth: u32,
    pub line: String,
}

impl Call {
    pub fn is_rename(&self) -> bool {
        self.syscall.starts_with("rename")
    }
}

fn strace(cmd: &Command, extra: &[String]) -> Command {
    let mut c = Command::new("strace");
    c.args(["-f", "-qq", "-s", "256"]).args(extra);
    c.arg("--").arg(cmd.get_program()).args(cmd.get_args());
    c.env_clear();
    for (k, v) in cmd.get_envs() {
        if let Some(v) = v {
            c.env(k, v);
        }
    }
    if let Some(d) = cmd.get_current_dir() {
        c.current_dir(d);
    }
    c
}

/// The mutating calls of `cmd`'s main thread that come at or after its first rename, in order,
/// and the run itself.
pub fn trace(cmd: &Command, out: &Path) -> (Vec<Call>, Run) {
    let run = Run::from(
        strace(
            cmd,
            &[
                "-o".into(),
                out.display().to_string(),
                "-e".into(),
                format!("trace={}", MUTATING.join(",")),
            ],
        )
        .output()
        .expect("strace (.ci/setup installs it)"),
    );
    let text = std::fs::read_to_string(out).unwrap();
    let mut main_pid = None;
    let mut seen: BTreeMap<String, u32> = BTreeMap::new();
    let mut calls = Vec::new();
    let mut renamed = false;
    for line in text.lines() {
        let Some((pid, rest)) = line.split_once(' ') else {
            continue;
        };
        let rest = rest.trim_start();
        let Some((name, _)) = rest.split_once('(') else {
            continue;
        };
        if !MUTATING.contains(&name) {
            continue;
        }
        let main = main_pid.get_or_insert_with(|| pid.to_string()).clone();
        if pid != main {
            continue;
        }
        let nth = seen.entry(name.to_string()).or_default();
        *nth += 1;
        renamed |= name.starts_with("rename");
        if !renamed && name.contains("write") {
            continue;
        }
        let creates = name != "openat" || rest.contains("O_CREAT");
        if creates {
            calls.push(Call {
                syscall: name.to_string(),
                nth: *nth,
                line: rest.to_string(),
            });
        }
    }
    (calls, run)
}

/// `cmd` with `inject` (strace's `-e inject=` expression for one call); panics unless strace
/// reports the injection, so a case can never pass without its fault.
pub fn injected(cmd: &Command, syscall: &str, inject: &str, out: &Path) -> Run {
    let run = Run::from(
        strace(
            cmd,
            &[
                "-o".into(),
                out.display().to_string(),
                "-e".into(),
                format!("trace={syscall}"),
                "-e".into(),
                format!("inject={syscall}:{inject}"),
            ],
        )
        .output()
        .unwrap(),
    );
    let text = std::fs::read_to_string(out).unwrap_or_default();
    assert!(
        text.contains("INJECTED") || text.contains("+++ killed by SIGKILL"),
        "strace did not inject {syscall}:{inject}:\n{text}"
    );
    run
}

/// `snapshot` of a node but for nodestrap's status records of its runs (`var/lib/nodestrap`,
/// and `var/lib` and `var` when they hold nothing else): what a failed run may leave is its
/// record, which says it failed (docs/status.md).
pub fn snapshot_but_records(root: &Path) -> BTreeMap<String, String> {
    let mut s = snapshot(root, &["var/lib/nodestrap"]);
    for d in ["var/lib", "var"] {
        if !s.keys().any(|k| k.starts_with(&format!("{d}/"))) {
            s.remove(d);
        }
    }
    s
}

/// Every entry under `root` (relative path → kind, mode, content digest or link target), but
/// the paths in `skip` and what is below them.
pub fn snapshot(root: &Path, skip: &[&str]) -> BTreeMap<String, String> {
    use sha2::Digest as _;
    use std::os::unix::fs::PermissionsExt;
    let mut out = BTreeMap::new();
    fn walk(base: &Path, d: &Path, skip: &[&str], out: &mut BTreeMap<String, String>) {
        let Ok(rd) = std::fs::read_dir(d) else {
            return;
        };
        for e in rd.flatten() {
            let p = e.path();
            let rel = p.strip_prefix(base).unwrap().display().to_string();
            if skip
                .iter()
                .any(|s| rel == *s || rel.starts_with(&format!("{s}/")))
            {
                continue;
            }
            let m = std::fs::symlink_metadata(&p).unwrap();
            let mode = m.permissions().mode() & 0o7777;
            let v = if m.file_type().is_symlink() {
                format!("link -> {}", std::fs::read_link(&p).unwrap().display())
            } else if m.is_dir() {
                walk(base, &p, skip, out);
                format!("dir {mode:o}")
            } else {
                let data = std::fs::read(&p).unwrap();
                format!(
                    "file {mode:o} {} bytes sha256:{:x}",
                    data.len(),
                    sha2::Sha256::digest(&data)
                )
            };
            out.insert(rel, v);
        }
    }
    walk(root, root, skip, &mut out);
    out
}

/// What differs between two snapshots, one line per path.
pub fn diff(a: &BTreeMap<String, String>, b: &BTreeMap<String, String>) -> String {
    let mut lines = Vec::new();
    for k in a.keys().chain(b.keys().filter(|k| !a.contains_key(*k))) {
        let (x, y) = (a.get(k), b.get(k));
        if x != y {
            lines.push(format!(
                "{k}: {} => {}",
                x.map_or("(none)", String::as_str),
                y.map_or("(none)", String::as_str)
            ));
        }
    }
    lines.join("\n")
}

/// `cp -a` of a tree onto a fresh `to`.
pub fn copy_tree(from: &Path, to: &Path) {
    let _ = std::fs::remove_dir_all(to);
    let st = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(st.success());
}

/// How one faulted run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[allow(clippy::enum_variant_names)] // As the node is left: the prefix is the point.
pub enum Outcome {
    /// Failed, and the node is as it was.
    AsItWas,
    /// Succeeded despite the fault (a failed write of the status record, a log line), and the
    /// node is as a clean run leaves it.
    AsClean,
    /// Succeeded, as a clean run leaves the node, but a file the run set aside (a version
    /// pruned, an image replaced) could not be deleted at its end: it stays under its hidden
    /// temp name, which nothing reads, until a later run sweeps it (docs/bootstrap.md says so).
    AsCleanSetAsideLeft,
    /// Succeeded, as a clean run leaves the node but for what it removes on a best-effort
    /// basis (the hook's collection of old stores): a removal that failed left those paths as
    /// they were, and the run said so.
    AsCleanRemovalSkipped,
}

/// What a matrix takes as a success besides a clean run's tree.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Removals {
    /// Everything a clean run removes must be gone.
    Required,
    /// A removal that failed may leave its paths as they were (logged as skipped).
    BestEffort,
}

/// The matrix's verdict on one run: `Err` with the differences when the node is in between.
pub fn judge(
    run: &Run,
    now: &BTreeMap<String, String>,
    before: &BTreeMap<String, String>,
    after: &BTreeMap<String, String>,
    removals: Removals,
) -> Result<Outcome, String> {
    // Every path as the clean run leaves it, or one it removes still as it was.
    let removal_skipped = || {
        removals == Removals::BestEffort
            && run.stderr.contains("skipped")
            && now.keys().chain(after.keys()).all(|k| {
                now.get(k) == after.get(k)
                    || (!after.contains_key(k) && now.get(k) == before.get(k))
            })
    };
    // A file the clean run deleted (a version pruned) or replaced, the same bytes and mode.
    let set_aside = |v: &String| {
        before
            .iter()
            .any(|(k, b)| b == v && after.get(k) != Some(b))
    };
    let only_temps_more = || {
        after.iter().all(|(k, v)| now.get(k) == Some(v))
            && now
                .iter()
                .filter(|(k, _)| !after.contains_key(*k))
                .all(|(k, v)| temp_name(k) && v.starts_with("file ") && set_aside(v))
    };
    match run.code {
        0 if now == after => Ok(Outcome::AsClean),
        0 if only_temps_more() => Ok(Outcome::AsCleanSetAsideLeft),
        0 if removal_skipped() => Ok(Outcome::AsCleanRemovalSkipped),
        0 => Err(format!(
            "exit 0, but not as a clean run leaves it:\n{}",
            diff(after, now)
        )),
        _ if now == before => Ok(Outcome::AsItWas),
        c => Err(format!(
            "exit {c}, but not as it was:\n{}\nstderr:\n{}",
            diff(before, now),
            run.stderr
        )),
    }
}

/// Whether a name is one of nodestrap's temp files or links (`.<name>.nodestrap-<hex>`).
pub fn temp_name(rel: &str) -> bool {
    let base = rel.rsplit('/').next().unwrap_or(rel);
    base.starts_with('.') && base.contains(".nodestrap-")
}

/// Whether the matrix can run here: under `NODESTRAP_RUNNER` (CI's qemu-user for the arm64
/// build) strace would count the emulator's system calls, not the binary's. The logic under test
/// is the same on both architectures; the amd64 run covers it.
pub fn native() -> bool {
    match super::vars::runner() {
        Some(runner) => {
            eprintln!(
                "fault matrix skipped under {runner}: strace would count the emulator's calls"
            );
            false
        }
        None => true,
    }
}

/// The whole matrix over `calls` (from `trace`), each case from `pristine` copied onto `root`;
/// prints the counts and panics with every case that left the node in between.
pub fn matrix(
    root: &Path,
    pristine: &Path,
    work: &Path,
    cmd: &dyn Fn() -> Command,
    calls: &[Call],
    before: &BTreeMap<String, String>,
    after: &BTreeMap<String, String>,
) {
    matrix_with(
        root,
        pristine,
        work,
        cmd,
        calls,
        (before, after),
        Removals::Required,
    );
}

/// `matrix`, with what a run may leave of what it removes.
pub fn matrix_with(
    root: &Path,
    pristine: &Path,
    work: &Path,
    cmd: &dyn Fn() -> Command,
    calls: &[Call],
    (before, after): (&BTreeMap<String, String>, &BTreeMap<String, String>),
    removals: Removals,
) {
    let skip = ["var/lib/nodestrap"];
    let mut counts: BTreeMap<String, u32> = BTreeMap::new();
    let mut bad = Vec::new();
    let out = work.join("inject");
    for c in calls {
        for errno in ["EIO", "ENOSPC"] {
            copy_tree(pristine, root);
            let inject = format!("error={errno}:when={}", c.nth);
            let run = injected(&cmd(), &c.syscall, &inject, &out);
            let now = snapshot(root, &skip);
            match judge(&run, &now, before, after, removals) {
                Ok(o) => *counts.entry(format!("{errno}: {o:?}")).or_default() += 1,
                Err(e) => bad.push(format!(
                    "{errno} at {} #{}: {}\n{e}",
                    c.syscall, c.nth, c.line
                )),
            }
        }
    }
    for c in calls
        .iter()
        .filter(|c| c.is_rename() || c.syscall == "fsync")
    {
        copy_tree(pristine, root);
        let inject = format!("signal=SIGKILL:when={}", c.nth);
        let run = injected(&cmd(), &c.syscall, &inject, &out);
        let now = snapshot(root, &skip);
        let between: Vec<String> = now
            .keys()
            .chain(before.keys())
            .chain(after.keys())
            .filter(|k| !temp_name(k))
            .filter(|k| now.get(*k) != before.get(*k) && now.get(*k) != after.get(*k))
            .map(|k| {
                format!(
                    "{k}: {:?} (before {:?}, after {:?})",
                    now.get(k),
                    before.get(k),
                    after.get(k)
                )
            })
            .collect();
        let killed = run.code != 0;
        if !killed || !between.is_empty() {
            bad.push(format!(
                "SIGKILL at {} #{}: {}\nexit {}; paths in between:\n{}",
                c.syscall,
                c.nth,
                c.line,
                run.code,
                between.join("\n")
            ));
            continue;
        }
        // The next run (the unit's restart) finishes the job and sweeps the killed run's
        // temp files and links.
        let again = Run::from(cmd().output().unwrap());
        let now = snapshot(root, &skip);
        if again.code != 0 || now != *after {
            bad.push(format!(
                "SIGKILL at {} #{}: the next run did not finish the job (exit {}):\n{}\n{}",
                c.syscall,
                c.nth,
                again.code,
                diff(after, &now),
                again.stderr
            ));
        } else {
            *counts
                .entry("SIGKILL: finished by the next run".into())
                .or_default() += 1;
        }
    }
    eprintln!(
        "fault matrix: {} mutating calls; {}",
        calls.len(),
        counts
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    assert!(
        bad.is_empty(),
        "{} cases left the node in between:\n{}",
        bad.len(),
        bad.join("\n\n")
    );
}
