//! kubeadm as activate and join-service use it: a bounded runner for external commands (time
//! limit, output kept as a bounded tail, the whole process group killed on timeout), kubeadm
//! configuration files, and bootstrap tokens (format check, and scrubbing them from any text
//! that could reach a log or an answer).

use std::io::{Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::nodelock::Role;

/// How much of a command's output is kept (its end).
pub const TAIL: usize = 16 << 10;

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
fn capture() -> Result<std::fs::File> {
    rustix::fs::memfd_create("nodestrap-output", rustix::fs::MemfdFlags::CLOEXEC)
        .map(std::fs::File::from)
        .map_err(|e| Error::failed(format!("memfd_create: {e}")))
}

/// The last `TAIL` bytes written to `f`.
fn tail_of(f: &mut std::fs::File) -> Vec<u8> {
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let mut keep = Vec::new();
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(TAIL as u64)));
    let _ = f.read_to_end(&mut keep);
    keep
}

/// Run `argv` (no shell), at most `timeout`. An error only when it cannot be started or runs
/// too long; a failing exit is `Ran { ok: false, .. }`.
pub fn run(argv: &[String], timeout: Duration) -> Result<Ran> {
    let (prog, args) = argv
        .split_first()
        .ok_or_else(|| Error::config("empty command"))?;
    let (mut out, mut err) = (capture()?, capture()?);
    let stdio = |f: &std::fs::File| f.try_clone().map(Stdio::from).map_err(Error::from);
    let mut child = Command::new(prog)
        .args(args)
        .stdin(Stdio::null())
        .stdout(stdio(&out)?)
        .stderr(stdio(&err)?)
        // Its own process group, so a timeout takes down whatever it started too.
        .process_group(0)
        .spawn()
        .map_err(|e| Error::failed(format!("{prog}: cannot start: {e}")))?;
    let pid = child.id() as libc::pid_t;
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if start.elapsed() >= timeout => break None,
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => return Err(Error::failed(format!("{prog}: waiting: {e}"))),
        }
    };
    // Also after a normal exit: nothing it started may linger.
    // SAFETY: signalling our own child's process group.
    unsafe { libc::kill(-pid, libc::SIGKILL) };
    let Some(status) = status else {
        let _ = child.wait();
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
    let status_text = match (
        status.code(),
        std::os::unix::process::ExitStatusExt::signal(&status),
    ) {
        (Some(c), _) => format!("exit status {c}"),
        (None, Some(s)) => format!("killed by signal {s}"),
        _ => status.to_string(),
    };
    Ok(Ran {
        ok: status.success(),
        status: status_text,
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
    }
}
