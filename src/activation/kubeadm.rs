//! kubeadm as activate and join-service use it: a bounded runner for external commands (time
//! limit, output kept as a bounded tail, the whole process group killed on timeout), kubeadm
//! configuration files, and bootstrap tokens (format check, and scrubbing them from any text
//! that could reach a log or an answer).

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::mem::MaybeUninit;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use crate::activation::nodelock::Role;
use crate::error::{Error, Result};

/// How much of a command's output is kept (its end).
const TAIL: usize = 16 << 10;

#[derive(Debug)]
pub struct Ran {
    pub ok: bool,
    /// `exit status 1`, `killed by signal 9`…
    pub status: String,
    pub stdout: Vec<u8>,
    /// The end of stderr then stdout, tokens scrubbed.
    pub tail: String,
}

/// An anonymous in-memory file for a child's output: no reader threads, and nothing the child
/// leaves behind can block us by holding a pipe open.
fn capture() -> Result<File> {
    rustix::fs::memfd_create("nodestrap-output", rustix::fs::MemfdFlags::CLOEXEC)
        .map(File::from)
        .map_err(|e| Error::failed(format!("memfd_create: {e}")))
}

/// The last `TAIL` bytes written to `f`.
fn tail_of(f: &mut File) -> Vec<u8> {
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let mut keep = Vec::new();
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(TAIL as u64)));
    let _ = f.read_to_end(&mut keep);
    keep
}

extern "C" {
    /// The process environment (musl and glibc define it), handed on to commands as it is.
    static environ: *const *mut libc::c_char;
}

/// Start `argv` (the program looked up in PATH) in a process group of its own, stdin from
/// /dev/null, stdout and stderr into `out` and `err`, SIGPIPE back to its default. Through
/// posix_spawnp rather than std's `Command`: the same for about 35 KB less in this
/// size-capped static binary.
fn spawn(argv: &[String], out: &File, err: &File) -> io::Result<libc::pid_t> {
    let mut cargs = Vec::with_capacity(argv.len());
    for a in argv {
        cargs.push(CString::new(a.as_bytes()).map_err(io::Error::other)?);
    }
    let mut ptrs: Vec<*mut libc::c_char> = cargs.iter().map(|c| c.as_ptr().cast_mut()).collect();
    ptrs.push(std::ptr::null_mut());
    let mut pid = 0;
    // SAFETY: the action and attribute objects are initialised before use and destroyed
    // after; every pointer given to posix_spawnp (argv, the fds, environ) outlives the call.
    let rc = unsafe {
        let mut fa = MaybeUninit::<libc::posix_spawn_file_actions_t>::uninit();
        let mut at = MaybeUninit::<libc::posix_spawnattr_t>::uninit();
        let mut sigs = MaybeUninit::<libc::sigset_t>::uninit();
        libc::posix_spawn_file_actions_init(fa.as_mut_ptr());
        libc::posix_spawnattr_init(at.as_mut_ptr());
        libc::sigemptyset(sigs.as_mut_ptr());
        libc::sigaddset(sigs.as_mut_ptr(), libc::SIGPIPE);
        let (fa, at) = (fa.as_mut_ptr(), at.as_mut_ptr());
        let flags = libc::POSIX_SPAWN_SETPGROUP | libc::POSIX_SPAWN_SETSIGDEF;
        let steps = [
            libc::posix_spawn_file_actions_addopen(fa, 0, c"/dev/null".as_ptr(), libc::O_RDONLY, 0),
            libc::posix_spawn_file_actions_adddup2(fa, out.as_raw_fd(), 1),
            libc::posix_spawn_file_actions_adddup2(fa, err.as_raw_fd(), 2),
            libc::posix_spawnattr_setsigdefault(at, sigs.as_ptr()),
            libc::posix_spawnattr_setpgroup(at, 0),
            libc::posix_spawnattr_setflags(at, flags as libc::c_short),
        ];
        let rc = match steps.iter().find(|&&r| r != 0) {
            Some(&r) => r,
            None => libc::posix_spawnp(&mut pid, ptrs[0], fa, at, ptrs.as_ptr(), environ),
        };
        libc::posix_spawn_file_actions_destroy(fa);
        libc::posix_spawnattr_destroy(at);
        rc
    };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(pid)
}

/// `waitpid`: the raw status once `pid` has exited (`None` while it runs, with `hang` false).
fn reap(pid: libc::pid_t, hang: bool) -> io::Result<Option<libc::c_int>> {
    let mut status = 0;
    loop {
        // SAFETY: waiting for our own child.
        let r = unsafe { libc::waitpid(pid, &mut status, if hang { 0 } else { libc::WNOHANG }) };
        match r {
            0 => return Ok(None),
            r if r > 0 => return Ok(Some(status)),
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
}

/// Run `argv` (no shell), at most `timeout`. An error only when it cannot be started or runs
/// too long; a failing exit is `Ran { ok: false, .. }`.
pub fn run(argv: &[String], timeout: Duration) -> Result<Ran> {
    let (prog, args) = argv
        .split_first()
        .ok_or_else(|| Error::config("empty command"))?;
    let (mut out, mut err) = (capture()?, capture()?);
    let pid =
        spawn(argv, &out, &err).map_err(|e| Error::failed(format!("{prog}: cannot start: {e}")))?;
    let start = Instant::now();
    let status = loop {
        match reap(pid, false) {
            Ok(Some(s)) => break Some(s),
            Ok(None) if start.elapsed() >= timeout => break None,
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => return Err(Error::failed(format!("{prog}: waiting: {e}"))),
        }
    };
    // Also after a normal exit: nothing it started may linger.
    // SAFETY: signalling the process group our child leads.
    unsafe { libc::kill(-pid, libc::SIGKILL) };
    let Some(status) = status else {
        let _ = reap(pid, true);
        return Err(Error::failed(format!(
            "{prog} {}: killed after {} s (time limit)",
            args.first().map(String::as_str).unwrap_or(""),
            timeout.as_secs()
        )));
    };
    let stdout = tail_of(&mut out);
    let mut text = String::from_utf8_lossy(&tail_of(&mut err)).into_owned();
    text.push_str(&String::from_utf8_lossy(&stdout));
    let tail = scrub(&text);
    let mut cut = tail.len().saturating_sub(TAIL);
    while !tail.is_char_boundary(cut) {
        cut += 1;
    }
    let tail = tail[cut..].to_string();
    let (ok, status) = if libc::WIFEXITED(status) {
        let c = libc::WEXITSTATUS(status);
        (c == 0, format!("exit status {c}"))
    } else {
        (
            false,
            format!("killed by signal {}", libc::WTERMSIG(status)),
        )
    };
    Ok(Ran {
        ok,
        status,
        stdout,
        tail,
    })
}

/// Split a configured command line on white space (no shell, no quoting).
pub fn argv(cmd: &str, flag: &str) -> Result<Vec<String>> {
    let v: Vec<String> = cmd.split_whitespace().map(str::to_string).collect();
    if v.is_empty() {
        return Err(Error::config(format!("{flag}: empty command")));
    }
    Ok(v)
}

/// The last `n` non-empty lines of a command's output tail, on one line: enough to say why it
/// failed in a log line or an error.
pub fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

// ---------------------------------------------------------------------------------------------
// Bootstrap tokens: `[a-z0-9]{6}.[a-z0-9]{16}` (kubeadm's format).

fn token_char(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}

pub fn valid_token(t: &str) -> bool {
    let b = t.as_bytes();
    b.len() == 23 && b[6] == b'.' && b[..6].iter().chain(&b[7..]).all(|&c| token_char(c))
}

/// Replace anything shaped like a bootstrap token: command output can carry one (kubeadm
/// prints join commands), and neither logs nor answers may.
pub fn scrub(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let mut copied = 0;
    while i + 23 <= b.len() {
        let starts_word = i == 0 || !token_char(b[i - 1]);
        let ends_word = i + 23 == b.len() || !token_char(b[i + 23]);
        if starts_word && ends_word && text.is_char_boundary(i) && valid_token(&text[i..i + 23]) {
            out.push_str(&text[copied..i]);
            out.push_str("[token]");
            i += 23;
            copied = i;
        } else {
            i += 1;
        }
    }
    out.push_str(&text[copied..]);
    out
}

// ---------------------------------------------------------------------------------------------
// Configuration files

/// kubeadm's config API for a Kubernetes version: v1beta4 from 1.31 (where it appeared), else
/// v1beta3 (1.22 on). Unknown versions get v1beta3, which kubeadm still reads.
fn api_version(k8s: Option<&str>) -> &'static str {
    let minor = k8s
        .and_then(|v| v.trim_start_matches('v').split('.').nth(1))
        .and_then(|m| m.parse::<u32>().ok());
    match minor {
        Some(m) if m >= 31 => "kubeadm.k8s.io/v1beta4",
        _ => "kubeadm.k8s.io/v1beta3",
    }
}

pub struct InitSpec<'a> {
    pub cluster_name: &'a str,
    pub kubernetes_version: &'a str,
    pub pod_cidr: &'a str,
    pub service_cidr: &'a str,
    pub sans: &'a [String],
}

/// InitConfiguration + ClusterConfiguration. Every value was validated (names, CIDRs,
/// versions), so double-quoted scalars are enough.
pub fn init_config(s: &InitSpec) -> String {
    let api = api_version(Some(s.kubernetes_version));
    let mut y = format!(
        "apiVersion: {api}\nkind: InitConfiguration\n---\napiVersion: {api}\nkind: ClusterConfiguration\n\
         clusterName: \"{}\"\nkubernetesVersion: \"{}\"\nnetworking:\n  podSubnet: \"{}\"\n  serviceSubnet: \"{}\"\n",
        s.cluster_name, s.kubernetes_version, s.pod_cidr, s.service_cidr
    );
    if !s.sans.is_empty() {
        y.push_str("apiServer:\n  certSANs:\n");
        for san in s.sans {
            y.push_str(&format!("  - \"{san}\"\n"));
        }
    }
    y
}

pub struct JoinSpec<'a> {
    pub api_server_endpoint: &'a str,
    pub token: &'a str,
    pub ca_cert_hash: &'a str,
    pub role: Role,
    pub kubernetes_version: Option<&'a str>,
}

/// JoinConfiguration with bootstrap-token discovery: the token stays in a 0600 file, out of
/// argv (where `ps` shows it). A control-plane join uses the certificates placed in
/// /etc/kubernetes/pki beforehand, so nothing is downloaded.
pub fn join_config(s: &JoinSpec) -> String {
    let mut y = format!(
        "apiVersion: {}\nkind: JoinConfiguration\ndiscovery:\n  bootstrapToken:\n    apiServerEndpoint: \"{}\"\n    \
         token: \"{}\"\n    caCertHashes:\n    - \"{}\"\n",
        api_version(s.kubernetes_version),
        s.api_server_endpoint,
        s.token,
        s.ca_cert_hash
    );
    if s.role == Role::ControlPlane {
        y.push_str("controlPlane: {}\n");
    }
    y
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens() {
        assert!(valid_token("abcdef.0123456789abcdef"));
        for bad in [
            "abcdef0123456789abcdef0",
            "ABCDEF.0123456789abcdef",
            "abcde.0123456789abcdefg",
            "abcdef.0123456789abcde",
            "",
        ] {
            assert!(!valid_token(bad), "{bad}");
        }
        assert_eq!(
            scrub("kubeadm join 1.2.3.4:6443 --token abcdef.0123456789abcdef --x\nabcdef.0123456789abcdef"),
            "kubeadm join 1.2.3.4:6443 --token [token] --x\n[token]"
        );
        // Longer runs of the same characters are not tokens; text around survives (UTF-8 too).
        assert_eq!(
            scrub("xabcdef.0123456789abcdef ü"),
            "xabcdef.0123456789abcdef ü"
        );
    }

    #[test]
    fn configs() {
        let sans = vec!["10.0.0.1".to_string(), "api.example.com".to_string()];
        let c = init_config(&InitSpec {
            cluster_name: "demo",
            kubernetes_version: "v1.31.2",
            pod_cidr: "10.244.0.0/16",
            service_cidr: "10.96.0.0/12",
            sans: &sans,
        });
        assert!(
            c.starts_with("apiVersion: kubeadm.k8s.io/v1beta4\nkind: InitConfiguration\n---\n"),
            "{c}"
        );
        assert!(
            c.contains("  podSubnet: \"10.244.0.0/16\"\n")
                && c.contains("  - \"api.example.com\"\n"),
            "{c}"
        );
        let j = join_config(&JoinSpec {
            api_server_endpoint: "10.0.0.1:6443",
            token: "abcdef.0123456789abcdef",
            ca_cert_hash: "sha256:00",
            role: Role::Worker,
            kubernetes_version: Some("1.29.0"),
        });
        assert!(
            j.starts_with("apiVersion: kubeadm.k8s.io/v1beta3\n") && !j.contains("controlPlane"),
            "{j}"
        );
    }

    #[test]
    fn runner_bounds_time_and_keeps_the_tail() {
        let sh = |s: &str| vec!["/bin/sh".to_string(), "-c".to_string(), s.to_string()];
        let r = run(
            &sh("echo out; echo err >&2; exit 3"),
            Duration::from_secs(10),
        )
        .unwrap();
        assert!(
            !r.ok && r.status == "exit status 3" && r.tail == "err\nout\n",
            "{} {:?}",
            r.status,
            r.tail
        );
        let t = Instant::now();
        // A child that outlives the shell keeps the pipe open: the group is killed too.
        let e = run(&sh("sleep 30 & sleep 30"), Duration::from_millis(300)).unwrap_err();
        assert!(e.to_string().contains("time limit"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(10));
        let r = run(
            &sh("head -c 100000 /dev/zero | tr '\\0' x"),
            Duration::from_secs(10),
        )
        .unwrap();
        assert!(r.ok && r.stdout.len() == TAIL && r.tail.len() <= TAIL);
        assert!(run(
            &["/nonexistent/kubeadm".to_string()],
            Duration::from_secs(1)
        )
        .is_err());
        // Found through PATH from the environment; a closed pipe kills quietly (SIGPIPE is
        // back to its default, though Rust ignores it in this process); stdin is empty.
        let argv: Vec<String> = ["sh", "-c", "yes | head -c 1 >/dev/null; cat; echo done"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let r = run(&argv, Duration::from_secs(10)).unwrap();
        assert!(r.ok && r.tail == "done\n", "{:?}", r.tail);
        assert_eq!(last_lines("a\n\nb\n  \nc\nd\n", 3), "b | c | d");
        assert_eq!(last_lines("only\n", 3), "only");
    }
}
