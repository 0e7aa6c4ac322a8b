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
    strace_of(cmd, extra, Follow::Children)
}

/// Which processes strace follows.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Follow {
    /// Threads and children (`-f`): each counts its own calls for `when=`.
    Children,
    /// Only the process it starts: a command whose children (a daemon it hands over to) must
    /// not get its faults, for a command that makes its changes on one thread.
    Main,
}

fn strace_of(cmd: &Command, extra: &[String], follow: Follow) -> Command {
    let mut c = Command::new("strace");
    if follow == Follow::Children {
        c.arg("-f");
    }
    c.args(["-qq", "-s", "256"]).args(extra);
    c.arg("--").arg(cmd.get_program()).args(cmd.get_args());
    c.env_clear();
    // The shared run folder becomes the thread's own, for this run and every later one.
    let shared = super::shared_run_dir();
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) if k == "NODESTRAP_RUN_DIR" && Path::new(v) == shared => {
                c.env(k, super::own_run_dir())
            }
            Some(v) => c.env(k, v),
            None => &mut c,
        };
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
        traced(cmd, out)
            .output()
            .expect("strace (.ci/setup installs it)"),
    );
    (calls_in(out, Threads::Main), run)
}

/// `cmd` under strace, its mutating calls written to `out` (read them with `calls_in`).
pub fn traced(cmd: &Command, out: &Path) -> Command {
    strace(
        cmd,
        &[
            "-o".into(),
            out.display().to_string(),
            "-e".into(),
            format!("trace={}", MUTATING.join(",")),
        ],
    )
}

/// Whose calls a trace lists.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Threads {
    /// The first thread that made a mutating call: a synchronous command's own.
    Main,
    /// Every thread's, each once by (syscall, ordinal): strace counts per thread (`when=` picks
    /// the Nth call of every thread that makes that many), so a server's case is the Nth call
    /// of that syscall in whichever of its threads (accept loop, connection, race) gets there.
    All,
}

/// The mutating calls of a trace `trace` or `traced` wrote, from the first rename on for
/// `write` (before it, the number of writes of a download depends on the network).
pub fn calls_in(out: &Path, threads: Threads) -> Vec<Call> {
    let text = std::fs::read_to_string(out).unwrap();
    let mut main_pid = None;
    let mut seen: BTreeMap<(String, String), u32> = BTreeMap::new();
    let mut calls: Vec<Call> = Vec::new();
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
        if threads == Threads::Main && pid != main {
            continue;
        }
        let nth = seen.entry((pid.to_string(), name.to_string())).or_default();
        *nth += 1;
        renamed |= name.starts_with("rename");
        if !renamed && name.contains("write") {
            continue;
        }
        let creates = name != "openat" || rest.contains("O_CREAT");
        let again = calls.iter().any(|c| c.syscall == name && c.nth == *nth);
        if creates && !again {
            calls.push(Call {
                syscall: name.to_string(),
                nth: *nth,
                line: rest.to_string(),
            });
        }
    }
    calls
}

/// `cmd` with `inject` (strace's `-e inject=` expression for one call); panics unless strace
/// reports the injection, so a case can never pass without its fault.
pub fn injected(cmd: &Command, syscall: &str, inject: &str, out: &Path) -> Run {
    let run = Run::from(injecting(cmd, syscall, inject, out).output().unwrap());
    assert!(
        was_injected(out),
        "strace did not inject {syscall}:{inject}:\n{}",
        std::fs::read_to_string(out).unwrap_or_default()
    );
    run
}

/// `cmd` under strace with `inject` for `syscall`, its trace to `out`: for a command that must
/// be talked to while it runs (a server). Check `was_injected` once it has ended.
pub fn injecting(cmd: &Command, syscall: &str, inject: &str, out: &Path) -> Command {
    injecting_in(cmd, syscall, inject, out, Follow::Children)
}

/// `injecting`, following `follow`.
fn injecting_in(cmd: &Command, syscall: &str, inject: &str, out: &Path, follow: Follow) -> Command {
    let mut extra = vec![
        "-o".into(),
        out.display().to_string(),
        "-e".into(),
        format!("trace={syscall}"),
        "-e".into(),
        format!("inject={syscall}:{inject}"),
    ];
    // An error's case stops the process only at the traced call (a seccomp filter, which needs
    // `-f`), not at every call. Not a kill's: under the filter, strace let the process run on
    // past the call it was to be killed at.
    if follow == Follow::Children && inject.starts_with("error=") {
        extra.push("--seccomp-bpf".into());
    }
    strace_of(cmd, &extra, follow)
}

/// The process strace (`pid`) runs, once it has started it.
pub fn tracee(pid: u32) -> Option<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Whether the ended run traced to `out` got its fault.
pub fn was_injected(out: &Path) -> bool {
    let text = std::fs::read_to_string(out).unwrap_or_default();
    text.contains("INJECTED") || text.contains("+++ killed by SIGKILL")
}

/// One fault of a matrix: the call, and what strace does there.
#[derive(Debug, Clone)]
pub struct Case {
    pub call: Call,
    pub fault: Fault,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    Eio,
    Enospc,
    /// SIGKILL on entry: a power cut as the process sees it.
    Kill,
}

impl Case {
    /// strace's `inject=` expression after the syscall.
    pub fn inject(&self) -> String {
        match self.fault {
            Fault::Eio => format!("error=EIO:when={}", self.call.nth),
            Fault::Enospc => format!("error=ENOSPC:when={}", self.call.nth),
            Fault::Kill => format!("signal=SIGKILL:when={}", self.call.nth),
        }
    }

    /// `cmd` with this case's fault (`injecting`).
    pub fn command(&self, cmd: &Command, out: &Path) -> Command {
        injecting(cmd, &self.call.syscall, &self.inject(), out)
    }

    /// `command`, the fault only in the process `cmd` starts (`Follow::Main`).
    pub fn command_of_main(&self, cmd: &Command, out: &Path) -> Command {
        injecting_in(cmd, &self.call.syscall, &self.inject(), out, Follow::Main)
    }
}

impl std::fmt::Display for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:?} at {} #{}: {}",
            self.fault, self.call.syscall, self.call.nth, self.call.line
        )
    }
}

/// The cases of a matrix over `calls`: with `NODESTRAP_FAULTS=all`, EIO, ENOSPC and SIGKILL
/// at each (a kill on entry: a power cut as the process sees it). Unset, CI's sample, about
/// half: SIGKILL at each rename and fsync (where a kill splits what is durable from what is
/// not) and at every third other call, and one error at each call, EIO and ENOSPC in turn
/// (the two have taken the same path at every call of every matrix run in full).
pub fn cases(calls: &[Call]) -> Vec<Case> {
    let all = super::vars::all_faults();
    let mut out = Vec::new();
    for (i, c) in calls.iter().enumerate() {
        let errors: &[Fault] = match (all, i % 2) {
            (true, _) => &[Fault::Eio, Fault::Enospc],
            (false, 0) => &[Fault::Eio],
            (false, _) => &[Fault::Enospc],
        };
        let kill = all || c.is_rename() || c.syscall == "fsync" || i % 3 == 0;
        let faults = errors.iter().copied().chain(kill.then_some(Fault::Kill));
        out.extend(faults.map(|fault| Case {
            call: c.clone(),
            fault,
        }));
    }
    out
}

/// Runs `judge` on every case: prints the count of each outcome it names and panics with every
/// case it failed, the case named.
pub fn each_case(
    what: &str,
    cases: &[Case],
    judge: &mut dyn FnMut(&Case) -> Result<String, String>,
) {
    let mut counts: BTreeMap<String, u32> = BTreeMap::new();
    let mut bad = Vec::new();
    for c in cases {
        eprintln!("case {c}");
        match judge(c) {
            Ok(o) => *counts.entry(format!("{:?}: {o}", c.fault)).or_default() += 1,
            Err(e) => bad.push(format!("{c}\n{e}")),
        }
    }
    eprintln!(
        "fault matrix of {what}: {} cases; {}",
        cases.len(),
        counts
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    assert!(
        bad.is_empty(),
        "{} of {} cases of {what} broke a rule:\n{}",
        bad.len(),
        cases.len(),
        bad.join("\n\n")
    );
}

/// Every status record, kept under `root` (`var/lib/nodestrap/status-*.json`) and of a run (the
/// tests' `run_dir`, or `root`'s `run/nodestrap`), is whole: a fault in its write leaves the
/// old record or the new one, never a part of one (docs/status.md). The count of records read.
pub fn records_whole(root: &Path) -> Result<usize, String> {
    let mut n = 0;
    let dirs = [
        root.join("var/lib/nodestrap"),
        root.join("run/nodestrap"),
        super::run_dir(),
    ];
    for path in &dirs {
        let Ok(rd) = std::fs::read_dir(path) else {
            continue;
        };
        let dir = path.display();
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !(name.starts_with("status-") && name.ends_with(".json")) {
                continue;
            }
            let bytes = std::fs::read(e.path()).map_err(|e| format!("{dir}/{name}: {e}"))?;
            let v: serde_json::Value = serde_json::from_slice(&bytes)
                .map_err(|e| format!("{dir}/{name}: not a whole record: {e}"))?;
            if v.get("state").and_then(|s| s.as_str()).is_none() {
                return Err(format!("{dir}/{name}: a record without its state: {v}"));
            }
            n += 1;
        }
    }
    Ok(n)
}

/// The temp files and links (`temp_name`) anywhere under `root`.
pub fn temps_under(root: &Path) -> Vec<String> {
    snapshot(root, &[])
        .into_keys()
        .filter(|k| temp_name(k))
        .collect()
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
                // ring's SHA-256 (assembly, even in a test build): every case hashes the whole
                // tree, and sha2's compact form, unoptimized, took most of a matrix's time. Only
                // equality counts here; the digests checked against nodestrap's are sha2's.
                let data = std::fs::read(&p).unwrap();
                let digest = ring::digest::digest(&ring::digest::SHA256, &data);
                let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
                format!("file {mode:o} {} bytes sha256:{hex}", data.len())
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

/// `matrix`, with what a run may leave of what it removes. Every case also leaves the status
/// records whole (`records_whole`).
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
    let out = work.join("inject");
    let mut judge_one = |c: &Case| -> Result<String, String> {
        copy_tree(pristine, root);
        let run = injected(&cmd(), &c.call.syscall, &c.inject(), &out);
        let now = snapshot(root, &skip);
        records_whole(root)?;
        if c.fault != Fault::Kill {
            return judge(&run, &now, before, after, removals).map(|o| format!("{o:?}"));
        }
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
        if run.code == 0 || !between.is_empty() {
            return Err(format!(
                "exit {}; paths in between:\n{}",
                run.code,
                between.join("\n")
            ));
        }
        // The next run (the unit's restart) finishes the job and sweeps the killed run's
        // temp files and links.
        let again = Run::from(cmd().output().unwrap());
        let now = snapshot(root, &skip);
        records_whole(root)?;
        if again.code != 0 || now != *after {
            return Err(format!(
                "the next run did not finish the job (exit {}):\n{}\n{}",
                again.code,
                diff(after, &now),
                again.stderr
            ));
        }
        Ok("finished by the next run".into())
    };
    eprintln!("{} mutating calls", calls.len());
    each_case("the command", &cases(calls), &mut judge_one);
}
