//! The one way nodestrap runs another program: no shell, stdin from `/dev/null`, a process
//! group of its own, and one deadline for the whole group (SIGTERM, then SIGKILL after a
//! grace). Two ways to take its output:
//! - `stream`: each line as it comes (a payload's entry script, the machine-config daemon),
//!   stdout at info and stderr at warn with `stream_to_log`;
//! - `capture`: stdout up to a cap and a bounded tail of stderr then stdout, for programs whose
//!   answer we read (kubeadm, a token command, a kubeconfig's exec plugin).
//!
//! No threads: both pipes and a pidfd of the child are watched with `poll(2)`. The child is
//! reaped only after the last signal to its group, so the group id can't have been reused.

use std::os::fd::OwnedFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::io::Errno;
use rustix::process::{Pid, PidfdFlags, Signal};

use crate::error::{Error, Result};

/// A program to run, with everything it gets from us.
#[derive(Debug, Clone)]
pub(crate) struct Command {
    /// Looked up in `PATH` when it has no `/`.
    pub(crate) program: PathBuf,
    pub(crate) args: Vec<String>,
    pub(crate) cwd: PathBuf,
    pub(crate) env: Env,
    /// For the whole run, from start to the end of its output.
    pub(crate) timeout: Duration,
    /// After the timeout the group gets SIGTERM, then SIGKILL this much later.
    pub(crate) grace: Duration,
}

/// The environment a program gets. Values are never logged.
#[derive(Debug, Clone)]
pub(crate) enum Env {
    /// Ours, plus these.
    Inherit(Vec<(String, String)>),
    /// Only these (a payload's script must not see the pod's secrets).
    Only(Vec<(String, String)>),
}

impl Command {
    /// `argv[0]` with the rest as arguments; our environment, `/` as working directory, and a
    /// grace of 5 s after `timeout`.
    pub(crate) fn new(argv: &[String], timeout: Duration) -> Result<Command> {
        let (program, args) = argv
            .split_first()
            .ok_or_else(|| Error::config("empty command"))?;
        Ok(Command {
            program: PathBuf::from(program),
            args: args.to_vec(),
            cwd: PathBuf::from("/"),
            env: Env::Inherit(Vec::new()),
            timeout,
            grace: Duration::from_secs(5),
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stream {
    Stdout,
    Stderr,
}

/// How a program ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exit {
    Code(i32),
    Signal { number: i32, core: bool },
}

impl Exit {
    fn of(st: ExitStatus) -> Exit {
        match st.code() {
            Some(c) => Exit::Code(c),
            None => Exit::Signal {
                number: st.signal().unwrap_or(0),
                core: st.core_dumped(),
            },
        }
    }

    pub(crate) fn success(self) -> bool {
        self == Exit::Code(0)
    }
}

/// `exit status 1`, `killed by signal SIGKILL (9)`.
impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Exit::Code(c) => write!(f, "exit status {c}"),
            Exit::Signal { number, core } => write!(
                f,
                "killed by signal {} ({number}{})",
                signal_name(number),
                if core { ", core dumped" } else { "" }
            ),
        }
    }
}

/// What `capture` keeps of a run.
#[derive(Debug)]
pub(crate) struct Captured {
    pub(crate) exit: Exit,
    /// Stdout, at most the cap given.
    pub(crate) stdout: Vec<u8>,
    /// The last `TAIL` bytes of stderr, then of stdout: for messages.
    pub(crate) tail: String,
}

/// How much of each stream `capture` keeps for messages (its end).
pub(crate) const TAIL: usize = 16 << 10;
/// Longer lines are streamed in pieces of this many bytes.
const MAX_LINE: usize = 4096;
/// How long the output is still read once the program exited (`capture`) or its group was
/// killed (both).
const DRAIN: Duration = Duration::from_millis(200);

/// Run `c`, logging each line of its stdout (info) and stderr (warn) as `{label}: {line}`.
/// `Ok` only when it exits with status 0 within its timeout.
pub(crate) fn stream_to_log(c: &Command, label: &str) -> Result<()> {
    stream(c, label, &mut |stream, line| match stream {
        Stream::Stdout => crate::info!("{label}: {line}"),
        Stream::Stderr => crate::warn!("{label}: {line}"),
    })
}

/// Run `c`, handing each output line to `sink`. It runs until it exits and its output ends:
/// processes it leaves behind holding its output count against its timeout.
pub(crate) fn stream(c: &Command, label: &str, sink: &mut dyn FnMut(Stream, &str)) -> Result<()> {
    let mut out = LineSink {
        lines: [Lines::new(Stream::Stdout), Lines::new(Stream::Stderr)],
        sink,
    };
    match run(c, label, &mut out, true)? {
        Exit::Code(0) => Ok(()),
        Exit::Code(code) => Err(Error::failed(format!("{label}: exited with status {code}"))),
        e => Err(Error::failed(format!("{label}: {e}"))),
    }
}

/// Run `c` and keep at most `stdout_cap` bytes of its stdout (more is an error) and a tail
/// of both streams. Once it exits, what it started is killed with its group. An error only
/// when it cannot be started, runs too long or writes too much; a failing exit is in
/// `Captured::exit`.
pub(crate) fn capture(c: &Command, label: &str, stdout_cap: usize) -> Result<Captured> {
    let mut out = Capture {
        stdout: Vec::new(),
        cap: stdout_cap,
        over: false,
        tails: [Vec::new(), Vec::new()],
    };
    let exit = run(c, label, &mut out, false)?;
    if out.over {
        return Err(Error::failed(format!(
            "{label}: output over the {stdout_cap}-byte limit"
        )));
    }
    let [out_tail, err_tail] = out.tails;
    let mut tail = String::from_utf8_lossy(&err_tail).into_owned();
    tail.push_str(&String::from_utf8_lossy(&out_tail));
    Ok(Captured {
        exit,
        stdout: out.stdout,
        tail,
    })
}

/// Where a run's output goes.
trait Output {
    fn data(&mut self, stream: Stream, data: &[u8]);
    /// The stream ended (or the run did).
    fn end(&mut self, stream: Stream);
    /// Stop reading: a capture has seen too much.
    fn full(&self) -> bool {
        false
    }
}

struct LineSink<'a> {
    lines: [Lines; 2],
    sink: &'a mut dyn FnMut(Stream, &str),
}

impl Output for LineSink<'_> {
    fn data(&mut self, stream: Stream, data: &[u8]) {
        self.lines[stream as usize].feed(data, self.sink);
    }
    fn end(&mut self, stream: Stream) {
        self.lines[stream as usize].flush(self.sink);
    }
}

struct Capture {
    stdout: Vec<u8>,
    cap: usize,
    over: bool,
    /// The end of stdout and stderr, each at most `TAIL` bytes.
    tails: [Vec<u8>; 2],
}

impl Output for Capture {
    fn data(&mut self, stream: Stream, data: &[u8]) {
        if stream == Stream::Stdout {
            let room = self.cap.saturating_sub(self.stdout.len());
            self.stdout.extend_from_slice(&data[..data.len().min(room)]);
            self.over |= data.len() > room;
        }
        let tail = &mut self.tails[stream as usize];
        tail.extend_from_slice(data);
        if tail.len() > TAIL {
            let mut cut = tail.len() - TAIL;
            // Not inside a UTF-8 character.
            while cut < tail.len() && (tail[cut] & 0xc0) == 0x80 {
                cut += 1;
            }
            tail.drain(..cut);
        }
    }
    fn end(&mut self, _: Stream) {}
    fn full(&self) -> bool {
        self.over
    }
}

/// Start `c` and pump its output into `out` until it is done; `to_eof`: wait for the end of
/// its output too (else only drain it briefly once the program exited, then kill its group).
fn run(c: &Command, label: &str, out: &mut dyn Output, to_eof: bool) -> Result<Exit> {
    // 1. Say what runs: the names of its environment, never the values.
    log_start(c, label);
    // 2. Start it in a process group of its own.
    let child = spawn(c, label)?;
    // 3. Watch its pipes and its pidfd.
    let mut run = Running::watch(child, label, out)?;
    // 4. Its output until it is done, its deadline passes or a capture is full; then the end
    //    each of these calls for.
    let pumped = run.pump(Instant::now() + c.timeout, to_eof);
    run.settle(pumped, c, label, to_eof)?;
    // 5. How it ended.
    run.reap(label)
}

fn log_start(c: &Command, label: &str) {
    let (names, env) = match &c.env {
        Env::Inherit(e) => ("our environment plus", e),
        Env::Only(e) => ("only", e),
    };
    crate::debug!(
        "{label}: running {} in {} with {names} {}",
        c.program.display(),
        c.cwd.display(),
        if env.is_empty() {
            "nothing".to_string()
        } else {
            env.iter()
                .map(|(k, _)| k.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        }
    );
}

/// No shell, stdin from `/dev/null`, both outputs piped, a process group of its own.
fn spawn(c: &Command, label: &str) -> Result<Child> {
    let env = match &c.env {
        Env::Inherit(e) | Env::Only(e) => e,
    };
    let mut cmd = std::process::Command::new(&c.program);
    cmd.args(&c.args)
        .current_dir(&c.cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    if let Env::Only(_) = c.env {
        cmd.env_clear();
    }
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
    cmd.spawn().map_err(|e| {
        Error::failed(format!(
            "{label}: cannot run it ({}): {e}",
            c.program.display()
        ))
    })
}

struct Running<'a> {
    /// Stdout and stderr, `None` once at EOF.
    pipes: [Option<OwnedFd>; 2],
    pidfd: OwnedFd,
    /// The child has exited (it is not reaped yet).
    exited: bool,
    out: &'a mut dyn Output,
    child: Child,
    /// The child's process group: its pid.
    pgid: Pid,
}

impl<'a> Running<'a> {
    /// Take the child's pipes and open its pidfd; when that fails, the group is killed and
    /// the child reaped.
    fn watch(mut child: Child, label: &str, out: &'a mut dyn Output) -> Result<Running<'a>> {
        let pipes = [
            child.stdout.take().map(OwnedFd::from),
            child.stderr.take().map(OwnedFd::from),
        ];
        let pgid = Pid::from_child(&child);
        let pidfd = match rustix::process::pidfd_open(pgid, PidfdFlags::empty()) {
            Ok(fd) => fd,
            Err(e) => {
                kill_and_reap(&mut child, pgid);
                return Err(Error::failed(format!(
                    "{label}: watching process {}: {}",
                    pgid.as_raw_nonzero(),
                    std::io::Error::from(e)
                )));
            }
        };
        Ok(Running {
            pipes,
            pidfd,
            exited: false,
            out,
            child,
            pgid,
        })
    }

    /// After the first `pump`: what it wrote last once it exited, or its stop at the deadline
    /// or a full capture, or its end when its output could not be read.
    fn settle(
        &mut self,
        pumped: std::io::Result<bool>,
        c: &Command,
        label: &str,
        to_eof: bool,
    ) -> Result<()> {
        match pumped {
            Ok(true) if to_eof => Ok(()),
            Ok(true) => {
                // Exited: what it wrote last, then nothing it started may linger.
                let _ = self.pump(Instant::now() + DRAIN, true);
                kill_group(self.pgid);
                self.end();
                Ok(())
            }
            Ok(false) => self.timed_out(c, label),
            Err(e) => {
                kill_and_reap(&mut self.child, self.pgid);
                self.end();
                Err(Error::failed(format!("{label}: reading its output: {e}")))
            }
        }
    }

    /// The deadline passed or a capture is full: the group is stopped; an error for the
    /// deadline only (`capture` names the limit).
    fn timed_out(&mut self, c: &Command, label: &str) -> Result<()> {
        let exited = self.exited;
        let full = self.out.full();
        self.stop(c.grace);
        if full {
            return Ok(());
        }
        let why = if exited {
            " (the script exited, but processes it started kept its output open)"
        } else {
            ""
        };
        Err(Error::failed(format!(
            "{label}: timed out after {}{why}",
            secs(c.timeout)
        )))
    }

    /// Its exit status (reaped here, or already by `stop`).
    fn reap(&mut self, label: &str) -> Result<Exit> {
        let status = self
            .child
            .wait()
            .map_err(|e| Error::failed(format!("{label}: waiting for it: {e}")))?;
        Ok(Exit::of(status))
    }

    /// Read output until the child has exited and, with `to_eof`, both pipes are at EOF
    /// (`true`), or until `until` or a full capture (`false`).
    fn pump(&mut self, until: Instant, to_eof: bool) -> std::io::Result<bool> {
        let mut buf = [0u8; 16 << 10];
        loop {
            if self.exited && (!to_eof || self.pipes.iter().all(Option::is_none)) {
                return Ok(true);
            }
            let now = Instant::now();
            if now >= until || self.out.full() {
                return Ok(false);
            }
            let left = Timespec::try_from(until - now).unwrap_or(Timespec {
                tv_sec: i64::MAX,
                tv_nsec: 0,
            });
            // Which of stdout (0), stderr (1) and the pidfd (2) are ready.
            let mut ready = [false; 3];
            {
                let mut fds = Vec::with_capacity(3);
                let mut which = Vec::with_capacity(3);
                for (i, p) in self.pipes.iter().enumerate() {
                    if let Some(p) = p {
                        fds.push(PollFd::new(p, PollFlags::IN));
                        which.push(i);
                    }
                }
                if !self.exited {
                    fds.push(PollFd::new(&self.pidfd, PollFlags::IN));
                    which.push(2);
                }
                match rustix::event::poll(&mut fds, Some(&left)) {
                    Ok(_) => {}
                    Err(Errno::INTR) => continue,
                    Err(e) => return Err(e.into()),
                }
                for (fd, i) in fds.iter().zip(which) {
                    ready[i] = !fd.revents().is_empty();
                }
            }
            if ready[2] {
                self.exited = true;
            }
            for (i, stream) in [Stream::Stdout, Stream::Stderr].into_iter().enumerate() {
                if !ready[i] {
                    continue;
                }
                let Some(fd) = &self.pipes[i] else { continue };
                match rustix::io::read(fd, &mut buf) {
                    Ok(0) => {
                        self.pipes[i] = None;
                        self.out.end(stream);
                    }
                    Ok(n) => self.out.data(stream, &buf[..n]),
                    Err(Errno::INTR) | Err(Errno::AGAIN) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }

    /// After the timeout: SIGTERM to the group, up to `grace` for the child to go (its output
    /// still read), SIGKILL to whatever is left of the group, then reap.
    fn stop(&mut self, grace: Duration) {
        let _ = rustix::process::kill_process_group(self.pgid, Signal::TERM);
        // Reading errors don't matter any more: the group is killed next.
        let _ = self.pump(Instant::now() + grace, false);
        kill_and_reap(&mut self.child, self.pgid);
        // What the group wrote before it died; a process outside it may hold the pipes.
        let _ = self.pump(Instant::now() + DRAIN, true);
        self.end();
    }

    fn end(&mut self) {
        self.out.end(Stream::Stdout);
        self.out.end(Stream::Stderr);
    }
}

/// SIGKILL to the whole group (the leader not reaped yet, so `pgid` is still ours), then reap.
fn kill_and_reap(child: &mut Child, pgid: Pid) {
    kill_group(pgid);
    let _ = child.wait();
}

/// SIGKILL to the whole group.
fn kill_group(pgid: Pid) {
    let _ = rustix::process::kill_process_group(pgid, Signal::KILL);
}

/// Bytes of one stream, cut into lines.
struct Lines {
    stream: Stream,
    buf: Vec<u8>,
}

impl Lines {
    fn new(stream: Stream) -> Lines {
        Lines {
            stream,
            buf: Vec::new(),
        }
    }

    fn feed(&mut self, data: &[u8], sink: &mut dyn FnMut(Stream, &str)) {
        self.buf.extend_from_slice(data);
        let mut start = 0;
        loop {
            let rest = &self.buf[start..];
            let head = &rest[..rest.len().min(MAX_LINE + 1)];
            if let Some(i) = head.iter().position(|b| *b == b'\n') {
                self.emit(start, start + i, sink);
                start += i + 1;
            } else if rest.len() > MAX_LINE {
                let cut = utf8_cut(&rest[..MAX_LINE]);
                self.emit(start, start + cut, sink);
                start += cut;
            } else {
                break;
            }
        }
        self.buf.drain(..start);
    }

    /// The last line, when the stream ends without a newline.
    fn flush(&mut self, sink: &mut dyn FnMut(Stream, &str)) {
        if !self.buf.is_empty() {
            self.emit(0, self.buf.len(), sink);
            self.buf.clear();
        }
    }

    fn emit(&self, from: usize, to: usize, sink: &mut dyn FnMut(Stream, &str)) {
        let mut line = &self.buf[from..to];
        if let [head @ .., b'\r'] = line {
            line = head;
        }
        sink(self.stream, &String::from_utf8_lossy(line));
    }
}

/// Where to cut a too-long line: before a UTF-8 character split by the limit, if any.
fn utf8_cut(piece: &[u8]) -> usize {
    match std::str::from_utf8(piece) {
        Err(e) if e.error_len().is_none() && e.valid_up_to() > 0 => e.valid_up_to(),
        _ => piece.len(),
    }
}

fn signal_name(sig: i32) -> &'static str {
    const NAMES: [&str; 16] = [
        "?", "SIGHUP", "SIGINT", "SIGQUIT", "SIGILL", "SIGTRAP", "SIGABRT", "SIGBUS", "SIGFPE",
        "SIGKILL", "SIGUSR1", "SIGSEGV", "SIGUSR2", "SIGPIPE", "SIGALRM", "SIGTERM",
    ];
    match sig {
        1..=15 => NAMES[sig as usize],
        _ => "?",
    }
}

/// What `argv` (a `--version` probe) prints first, or why it printed nothing.
pub(crate) fn version_line(argv: &[String]) -> std::result::Result<String, String> {
    let run = || -> Result<String> {
        let c = Command::new(argv, Duration::from_secs(30))?;
        let out = capture(&c, &argv[0], 64 << 10)?;
        let text = String::from_utf8_lossy(&out.stdout);
        let first = text.lines().next().unwrap_or("").trim().to_string();
        if out.exit.success() {
            Ok(first)
        } else {
            Err(Error::failed(format!("{} ({})", out.tail.trim(), out.exit)))
        }
    };
    run().map_err(|e| e.to_string())
}

/// Whether a `--version` line names `version` as a whole word (`v` before it, a `-`, `+` or
/// `~` suffix after it allowed, as Debian's `1.7.24~ds1`): `1.7.2` is not `1.7.24`.
pub(crate) fn says_version(line: &str, version: &str) -> bool {
    line.split(|c: char| c.is_whitespace() || c == ',' || c == '"')
        .map(|w| w.trim_start_matches('v'))
        .any(|w| {
            w == version
                || w.strip_prefix(version)
                    .is_some_and(|rest| rest.starts_with(['-', '+', '~']))
        })
}

/// `1 s`, `1.5 s`: how a log line says a duration.
pub(crate) fn secs(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Stream::{Stderr, Stdout};

    fn sh(script: &str, timeout: Duration, grace: Duration) -> Command {
        Command {
            program: "/bin/sh".into(),
            args: vec!["-c".into(), script.into()],
            cwd: "/".into(),
            env: Env::Only(vec![("PATH".into(), "/usr/bin:/bin".into())]),
            timeout,
            grace,
        }
    }

    fn quick(script: &str) -> Command {
        sh(script, Duration::from_secs(20), Duration::from_secs(1))
    }

    /// Runs `s` and returns its result as text and the lines it logged.
    fn collect(s: &Command) -> (Result<(), String>, Vec<(Stream, String)>) {
        let mut got = Vec::new();
        let r = stream(s, "t", &mut |st, l| got.push((st, l.to_string())));
        (r.map_err(|e| e.to_string()), got)
    }

    fn lines(v: &[(Stream, &str)]) -> Vec<(Stream, String)> {
        v.iter().map(|(s, l)| (*s, l.to_string())).collect()
    }

    /// Gone, or a zombie nobody reaps (our pid 1 may not).
    fn gone(pid: &str) -> bool {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => true,
            Ok(st) => st.rsplit_once(") ").map(|(_, r)| r.starts_with('Z')) == Some(true),
        }
    }

    #[test]
    fn lines_arrive_in_order_per_stream_and_interleaved() {
        let (r, got) = collect(&quick(
            "echo o1; sleep 0.2; echo e1 >&2; sleep 0.2; echo o2; echo o3; sleep 0.2; \
             printf 'e2\\r\\ne3\\n' >&2; sleep 0.2; echo o4",
        ));
        assert_eq!(r, Ok(()));
        assert_eq!(
            got,
            lines(&[
                (Stdout, "o1"),
                (Stderr, "e1"),
                (Stdout, "o2"),
                (Stdout, "o3"),
                (Stderr, "e2"),
                (Stderr, "e3"),
                (Stdout, "o4"),
            ])
        );
    }

    #[test]
    fn environment_is_only_what_is_given() {
        let s = Command {
            program: "/usr/bin/env".into(),
            args: vec![],
            cwd: "/".into(),
            env: Env::Only(vec![
                ("PATH".into(), "/usr/bin:/bin".into()),
                ("NODESTRAP_X".into(), "a value with spaces".into()),
            ]),
            timeout: Duration::from_secs(20),
            grace: Duration::from_secs(1),
        };
        let (r, mut got) = collect(&s);
        assert_eq!(r, Ok(()));
        got.sort_by(|a, b| a.1.cmp(&b.1));
        assert_eq!(
            got,
            lines(&[
                (Stdout, "NODESTRAP_X=a value with spaces"),
                (Stdout, "PATH=/usr/bin:/bin"),
            ])
        );
        // stdin is /dev/null, the working directory is the one given.
        let mut s = quick("cat; pwd");
        s.cwd = "/tmp".into();
        assert_eq!(collect(&s), (Ok(()), lines(&[(Stdout, "/tmp")])));
    }

    #[test]
    fn failures_name_the_status_or_signal() {
        let (r, got) = collect(&quick("echo before; exit 3"));
        assert_eq!(r, Err("t: exited with status 3".to_string()));
        assert_eq!(got, lines(&[(Stdout, "before")]));
        let (r, _) = collect(&quick("kill -USR1 $$"));
        assert_eq!(r, Err("t: killed by signal SIGUSR1 (10)".to_string()));
        let mut s = quick("true");
        s.program = "/nonexistent/entry.sh".into();
        let (r, _) = collect(&s);
        let e = r.unwrap_err();
        assert!(
            e.starts_with("t: cannot run it (/nonexistent/entry.sh): No such file"),
            "{e}"
        );
    }

    #[test]
    fn timeout_kills_the_whole_group_after_the_grace() {
        // The script and its background child both ignore SIGTERM.
        let start = Instant::now();
        let (r, got) = collect(&sh(
            "trap '' TERM; sleep 30 & echo $!; wait; echo never",
            Duration::from_secs(1),
            Duration::from_secs(1),
        ));
        let took = start.elapsed();
        assert_eq!(r, Err("t: timed out after 1 s".to_string()));
        assert!(took >= Duration::from_millis(1900), "{took:?}");
        assert!(took < Duration::from_millis(3500), "{took:?}");
        assert_eq!(got.len(), 1, "{got:?}");
        let pid = &got[0].1;
        let t = Instant::now();
        while !gone(pid) && t.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(gone(pid), "grandchild {pid} still runs");
    }

    #[test]
    fn sigterm_that_works_ends_the_grace_early() {
        let start = Instant::now();
        let (r, _) = collect(&sh(
            "sleep 30",
            Duration::from_secs(1),
            Duration::from_secs(10),
        ));
        assert_eq!(r, Err("t: timed out after 1 s".to_string()));
        assert!(start.elapsed() < Duration::from_millis(2500));
    }

    #[test]
    fn output_held_open_by_a_leftover_process_times_out() {
        let start = Instant::now();
        let (r, got) = collect(&sh(
            "trap '' TERM; sleep 30 & echo $!; exit 0",
            Duration::from_secs(1),
            Duration::from_secs(1),
        ));
        assert_eq!(
            r,
            Err(
                "t: timed out after 1 s (the script exited, but processes it started \
                 kept its output open)"
                    .to_string()
            )
        );
        // The script is gone already: SIGKILL goes out without waiting for the grace.
        assert!(start.elapsed() < Duration::from_millis(1900));
        let pid = &got[0].1;
        let t = Instant::now();
        while !gone(pid) && t.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(gone(pid), "leftover {pid} still runs");
    }

    #[test]
    fn long_lines_are_split_and_the_last_one_is_flushed() {
        let (r, got) = collect(&quick(
            "head -c 10000 /dev/zero | tr '\\0' a; echo; \
             head -c 4095 /dev/zero | tr '\\0' b; printf '\\303\\251\\n'; \
             printf 'x\\377y\\n'; printf 'err' >&2; printf 'one\\ntwo'",
        ));
        assert_eq!(r, Ok(()));
        let want = vec![
            (Stdout, "a".repeat(4096)),
            (Stdout, "a".repeat(4096)),
            (Stdout, "a".repeat(10000 - 8192)),
            // Not cut inside the two-byte é.
            (Stdout, "b".repeat(4095)),
            (Stdout, "é".to_string()),
            (Stdout, "x\u{fffd}y".to_string()),
            (Stdout, "one".to_string()),
            (Stdout, "two".to_string()),
        ];
        let err: Vec<_> = got.iter().filter(|(s, _)| *s == Stderr).cloned().collect();
        assert_eq!(err, lines(&[(Stderr, "err")]));
        let out: Vec<_> = got.into_iter().filter(|(s, _)| *s == Stdout).collect();
        assert_eq!(out, want);
    }

    fn argv(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn capture_keeps_the_tail_and_bounds_stdout() {
        let t = |timeout| Command::new(&argv(&["/bin/sh"]), timeout).unwrap();
        let sh = |s: &str, timeout| Command {
            args: argv(&["-c", s]),
            ..t(timeout)
        };
        let ten = Duration::from_secs(10);
        let r = capture(&sh("echo out; echo err >&2; exit 3", ten), "t", 1 << 20).unwrap();
        assert_eq!((r.exit, r.tail.as_str()), (Exit::Code(3), "err\nout\n"));
        assert_eq!(r.exit.to_string(), "exit status 3");
        // A child that outlives the shell is killed with the group once the shell exits.
        let start = Instant::now();
        let r = capture(&sh("sleep 30 & echo done", ten), "t", 1 << 20).unwrap();
        assert!(r.exit.success() && r.stdout == b"done\n");
        assert!(start.elapsed() < Duration::from_secs(2));
        // A program that runs too long.
        let e = capture(&sh("sleep 30", Duration::from_millis(300)), "t", 100).unwrap_err();
        assert_eq!(e.to_string(), "t: timed out after 0.3 s");
        // Too much output is refused; the tail stays bounded.
        let big = "head -c 100000 /dev/zero | tr '\\0' x";
        let e = capture(&sh(big, ten), "t", 1000).unwrap_err();
        assert_eq!(e.to_string(), "t: output over the 1000-byte limit");
        let r = capture(&sh(big, ten), "t", 1 << 20).unwrap();
        assert!(r.stdout.len() == 100_000 && r.tail.len() == TAIL);
        // Found through PATH; a closed pipe kills quietly (SIGPIPE back to its default,
        // though Rust ignores it in this process); stdin is empty; our environment is kept.
        let mut c = Command::new(
            &argv(&[
                "sh",
                "-c",
                "yes | head -c 1 >/dev/null; cat; echo $NODESTRAP_T $HOME",
            ]),
            ten,
        )
        .unwrap();
        c.env = Env::Inherit(vec![("NODESTRAP_T".into(), "added".into())]);
        let r = capture(&c, "t", 100).unwrap();
        let home = std::env::var("HOME").unwrap_or_default();
        assert_eq!(
            String::from_utf8_lossy(&r.stdout),
            format!("added {home}\n")
        );
        let e = capture(&t(ten), "t", 1).map(|_| ()).and_then(|_| {
            capture(
                &Command::new(&argv(&["/nonexistent/x"]), ten).unwrap(),
                "t",
                1,
            )
            .map(|_| ())
        });
        assert!(e
            .unwrap_err()
            .to_string()
            .starts_with("t: cannot run it (/nonexistent/x)"));
        assert!(Command::new(&[], ten).is_err());
    }

    #[test]
    fn line_splitting_by_pieces() {
        let mut got = Vec::new();
        let mut sink = |s: Stream, l: &str| got.push((s, l.to_string()));
        let mut l = Lines::new(Stdout);
        l.feed(b"ab", &mut sink);
        l.feed(b"c\nd", &mut sink);
        l.feed(&[b'x'; MAX_LINE], &mut sink);
        l.feed(b"\n", &mut sink);
        l.flush(&mut sink);
        assert_eq!(
            got,
            vec![
                (Stdout, "abc".to_string()),
                (Stdout, format!("d{}", "x".repeat(MAX_LINE - 1))),
                (Stdout, "x".to_string()),
            ]
        );
    }
}
