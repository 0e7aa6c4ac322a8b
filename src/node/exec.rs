//! Running a payload's entry script: a clean environment, stdin from `/dev/null`, its output
//! logged line by line as it comes (stdout at info, stderr at warn), and one deadline for the
//! whole process group, enforced with SIGTERM and then SIGKILL.
//!
//! No threads: both pipes and a pidfd of the child are watched with `poll(2)`. The child leads
//! its own process group and is reaped only after the last signal to that group, so the group
//! id can't have been reused by then.

use std::os::fd::OwnedFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::io::Errno;
use rustix::process::{Pid, PidfdFlags, Signal};

use crate::error::{Error, Result};

/// A program to run, with everything it gets from us.
#[derive(Debug, Clone)]
pub struct Script {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub cwd: PathBuf,
    /// Its whole environment (nothing is inherited). Values are never logged.
    pub env: Vec<(String, String)>,
    /// For the whole run, from start to the end of its output.
    pub timeout: Duration,
    /// After the timeout the group gets SIGTERM, then SIGKILL this much later.
    pub grace: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// Longer lines are logged in pieces of this many bytes.
const MAX_LINE: usize = 4096;
/// How long the output is still read once the group was killed.
const DRAIN: Duration = Duration::from_millis(200);

/// Run `s`, logging each line of its stdout (info) and stderr (warn) as `{label}: {line}`.
/// `Ok` only when it exits with status 0 within its timeout.
pub fn run(s: &Script, label: &str) -> Result<()> {
    run_with(s, label, &mut |stream, line| match stream {
        Stream::Stdout => log::info!("{label}: {line}"),
        Stream::Stderr => log::warn!("{label}: {line}"),
    })
}

/// `run`, handing each output line to `sink` instead of the log.
pub fn run_with(s: &Script, label: &str, sink: &mut dyn FnMut(Stream, &str)) -> Result<()> {
    let names: Vec<&str> = s.env.iter().map(|(k, _)| k.as_str()).collect();
    log::debug!(
        "{label}: running {} in {} with {}",
        s.program.display(),
        s.cwd.display(),
        if names.is_empty() {
            "no environment".to_string()
        } else {
            format!("environment {}", names.join(", "))
        }
    );
    let mut child = Command::new(&s.program)
        .args(&s.args)
        .current_dir(&s.cwd)
        .env_clear()
        .envs(s.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|e| Error::failed(format!("{label}: starting {}: {e}", s.program.display())))?;
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
    let mut run = Running {
        pipes,
        lines: [Lines::new(Stream::Stdout), Lines::new(Stream::Stderr)],
        pidfd,
        exited: false,
        sink,
    };
    let deadline = Instant::now() + s.timeout;
    match run.pump(deadline, true) {
        Ok(true) => {}
        Ok(false) => {
            let exited = run.exited;
            run.stop(&mut child, pgid, s.grace);
            let why = if exited {
                " (the script exited, but processes it started kept its output open)"
            } else {
                ""
            };
            return Err(Error::failed(format!(
                "{label}: timed out after {}{why}",
                secs(s.timeout)
            )));
        }
        Err(e) => {
            kill_and_reap(&mut child, pgid);
            run.flush();
            return Err(Error::failed(format!("{label}: reading its output: {e}")));
        }
    }
    let status = child
        .wait()
        .map_err(|e| Error::failed(format!("{label}: waiting for it: {e}")))?;
    match failure(status) {
        None => Ok(()),
        Some(why) => Err(Error::failed(format!("{label}: {why}"))),
    }
}

struct Running<'a> {
    /// Stdout and stderr, `None` once at EOF.
    pipes: [Option<OwnedFd>; 2],
    lines: [Lines; 2],
    pidfd: OwnedFd,
    /// The child has exited (it is not reaped yet).
    exited: bool,
    sink: &'a mut dyn FnMut(Stream, &str),
}

impl Running<'_> {
    /// Log output until the child has exited and, with `to_eof`, both pipes are at EOF
    /// (`true`), or until `until` (`false`).
    fn pump(&mut self, until: Instant, to_eof: bool) -> std::io::Result<bool> {
        let mut buf = [0u8; 16 << 10];
        loop {
            if self.exited && (!to_eof || self.pipes.iter().all(Option::is_none)) {
                return Ok(true);
            }
            let now = Instant::now();
            if now >= until {
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
            for (i, &r) in ready[..2].iter().enumerate() {
                if !r {
                    continue;
                }
                let Some(fd) = &self.pipes[i] else { continue };
                match rustix::io::read(fd, &mut buf) {
                    Ok(0) => {
                        self.pipes[i] = None;
                        self.lines[i].flush(self.sink);
                    }
                    Ok(n) => self.lines[i].feed(&buf[..n], self.sink),
                    Err(Errno::INTR) | Err(Errno::AGAIN) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }

    /// After the timeout: SIGTERM to the group, up to `grace` for the child to go (its output
    /// still logged), SIGKILL to whatever is left of the group, then reap.
    fn stop(&mut self, child: &mut Child, pgid: Pid, grace: Duration) {
        let _ = rustix::process::kill_process_group(pgid, Signal::TERM);
        // Reading errors don't matter any more: the group is killed next.
        let _ = self.pump(Instant::now() + grace, false);
        kill_and_reap(child, pgid);
        // What the group wrote before it died; a process outside it may hold the pipes.
        let _ = self.pump(Instant::now() + DRAIN, true);
        self.flush();
    }

    fn flush(&mut self) {
        for l in &mut self.lines {
            l.flush(self.sink);
        }
    }
}

/// SIGKILL to the whole group (the leader not reaped yet, so `pgid` is still ours), then reap.
fn kill_and_reap(child: &mut Child, pgid: Pid) {
    let _ = rustix::process::kill_process_group(pgid, Signal::KILL);
    let _ = child.wait();
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

/// Why an exit status is a failure; `None` for status 0.
fn failure(st: ExitStatus) -> Option<String> {
    if let Some(code) = st.code() {
        return (code != 0).then(|| format!("exited with status {code}"));
    }
    let sig = st.signal().unwrap_or(0);
    let core = if st.core_dumped() {
        ", core dumped"
    } else {
        ""
    };
    Some(format!(
        "killed by signal {} ({sig}{core})",
        signal_name(sig)
    ))
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

/// `1 s`, `1.5 s`.
fn secs(d: Duration) -> String {
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

    fn sh(script: &str, timeout: Duration, grace: Duration) -> Script {
        Script {
            program: "/bin/sh".into(),
            args: vec!["-c".into(), script.into()],
            cwd: "/".into(),
            env: vec![("PATH".into(), "/usr/bin:/bin".into())],
            timeout,
            grace,
        }
    }

    fn quick(script: &str) -> Script {
        sh(script, Duration::from_secs(20), Duration::from_secs(1))
    }

    /// Runs `s` and returns its result as text and the lines it logged.
    fn collect(s: &Script) -> (Result<(), String>, Vec<(Stream, String)>) {
        let mut got = Vec::new();
        let r = run_with(s, "t", &mut |st, l| got.push((st, l.to_string())));
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
        let s = Script {
            program: "/usr/bin/env".into(),
            args: vec![],
            cwd: "/".into(),
            env: vec![
                ("PATH".into(), "/usr/bin:/bin".into()),
                ("NODESTRAP_X".into(), "a value with spaces".into()),
            ],
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
            e.starts_with("t: starting /nonexistent/entry.sh: No such file"),
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
