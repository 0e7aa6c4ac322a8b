//! Test world for the nodestrap binary: a temp node root and running the binary (here); a CA
//! made at test time (pki.rs), HTTPS servers including the stand-in API server that checks
//! client certificates (http.rs), OpenPGP keys made with sequoia (pgp.rs), and a private
//! dbus-daemon with stand-ins for update_engine and systemd (bus.rs). Nothing here touches the host's real bus,
//! trust store or root.
#![allow(dead_code)]

mod bus;
pub mod cluster;
pub mod faults;
mod http;
mod pgp;
mod pki;
mod registry;
pub mod vars;
// Not every test file uses every concern.
#[allow(unused_imports)]
pub use {bus::*, http::*, pgp::*, pki::*, registry::*};

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The binary under test (`vars::bin`).
pub fn bin() -> String {
    vars::bin()
}

/// The Container Linux board of the binary under test, from its ELF header's e_machine: what
/// nodestrap falls back to when os-release has no COREOS_BOARD.
pub fn bin_board() -> &'static str {
    let mut head = [0u8; 20];
    std::io::Read::read_exact(&mut std::fs::File::open(bin()).unwrap(), &mut head).unwrap();
    assert_eq!(&head[..4], b"\x7fELF", "{} is not an ELF file", bin());
    match u16::from_le_bytes([head[18], head[19]]) {
        62 => "amd64-usr",
        183 => "arm64-usr",
        m => panic!("{}: unexpected ELF machine {m}", bin()),
    }
}

/// Now, UTC, as the API server writes times (`2026-11-27T01:02:03Z`): from date(1).
pub fn utc_now() -> String {
    let out = Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

pub fn unique_dir(tag: &str) -> PathBuf {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let p = std::env::temp_dir().join(format!("nodestrap-test-{}-{tag}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    std::fs::create_dir_all(&p).unwrap();
    p
}

/// A node path under a test root.
pub fn under(root: &Path, node_path: &str) -> PathBuf {
    root.join(node_path.trim_start_matches('/'))
}

/// Write a node file under a test root, making its folders.
pub fn write_under(root: &Path, node_path: &str, content: &str) {
    let p = under(root, node_path);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, content).unwrap();
}

/// A test world with a node root: node paths resolved, written and read under it, one way for
/// every test binary.
pub trait NodeRoot {
    fn root(&self) -> &Path;

    fn path(&self, node_path: &str) -> PathBuf {
        under(self.root(), node_path)
    }

    fn write(&self, node_path: &str, content: &str) {
        write_under(self.root(), node_path, content);
    }

    fn read(&self, node_path: &str) -> Option<String> {
        std::fs::read_to_string(self.path(node_path)).ok()
    }
}

// ---------------------------------------------------------------------------------------------
// Running the binary

pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn assert_ok(&self) -> &Self {
        assert_eq!(
            self.code, 0,
            "expected success\nstdout:\n{}\nstderr:\n{}",
            self.stdout, self.stderr
        );
        self
    }
    /// Failure with exit `code` whose error line mentions `needle`.
    pub fn assert_fails(&self, code: i32, needle: &str) -> &Self {
        assert_eq!(
            self.code, code,
            "expected exit {code}\nstdout:\n{}\nstderr:\n{}",
            self.stdout, self.stderr
        );
        let last = self
            .stderr
            .lines()
            .rfind(|l| l.starts_with("error") || l.starts_with("<3>"))
            .unwrap_or("");
        assert!(
            last.contains(needle),
            "error line does not mention {needle:?}:\n{}",
            self.stderr
        );
        self
    }
}

thread_local! {
    /// This thread's own run folder, once it has one (`own_run_dir`).
    static OWN_RUN_DIR: std::cell::RefCell<Option<PathBuf>> = const { std::cell::RefCell::new(None) };
}

/// Where the binary under test keeps the records of its runs (`/run/nodestrap` on a node): one
/// folder per test binary, never the host's, or the thread's own (`own_run_dir`).
pub fn run_dir() -> PathBuf {
    OWN_RUN_DIR
        .with_borrow(|d| d.clone())
        .unwrap_or_else(shared_run_dir)
}

/// The run folder the test binary's tests share.
pub fn shared_run_dir() -> PathBuf {
    std::env::temp_dir().join(format!("nodestrap-tests-{}/run", std::process::id()))
}

/// A run folder for this thread alone, from now on (`run_dir`). A fault matrix needs one: in a
/// shared folder the other tests' runs of the same command sweep and take its temp files, and
/// each retry moves the numbered calls its cases name.
pub fn own_run_dir() -> PathBuf {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    OWN_RUN_DIR.with_borrow_mut(|d| {
        d.get_or_insert_with(|| {
            let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            shared_run_dir().with_file_name(format!("run-{n}"))
        })
        .clone()
    })
}

/// nodestrap with a clean environment: the given bus address (or none that exists), no
/// proxies, no system trust store.
pub fn command(args: &[String], bus: Option<&str>) -> Command {
    command_as(None, args, bus)
}

/// `command` with argv[0] set (the multicall names). With `NODESTRAP_RUNNER` (CI's qemu-user
/// for another architecture's build) the binary runs under it, argv[0] passed with `-0`.
pub fn command_as(argv0: Option<&str>, args: &[String], bus: Option<&str>) -> Command {
    let mut c = match vars::runner() {
        Some(runner) => {
            let mut c = Command::new(runner);
            if let Some(a) = argv0 {
                c.args(["-0", a]);
            }
            c.arg(bin());
            c
        }
        None => {
            let mut c = Command::new(bin());
            if let Some(a) = argv0 {
                std::os::unix::process::CommandExt::arg0(&mut c, a);
            }
            c
        }
    };
    c.args(args)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        // Never the host's /run/nodestrap: one folder per test binary (or thread), unless a
        // test names its own.
        .env("NODESTRAP_RUN_DIR", run_dir())
        // Whether this machine's clock is synchronised is not the test's business.
        .env(
            "NODESTRAP_TIMESYNC_FILE",
            "/nonexistent/timesync/synchronized",
        )
        .env("SSL_CERT_FILE", "/nonexistent/ca-bundle")
        .env(
            "DBUS_SYSTEM_BUS_ADDRESS",
            bus.unwrap_or("unix:path=/nonexistent/system_bus_socket"),
        );
    c
}

pub fn nodestrap(args: &[String], bus: Option<&str>, env: &[(&str, &str)]) -> Run {
    Run::from(
        command(args, bus)
            .envs(env.iter().copied())
            .output()
            .unwrap(),
    )
}

impl From<Output> for Run {
    fn from(out: Output) -> Run {
        Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

/// A ticket request's body from the node's run `session`: that letter 32 times (lowercase hex).
pub fn session_body(session: char) -> String {
    format!("{{\"session\": \"{}\"}}", session.to_string().repeat(32))
}

/// POST `body` to `path` on 127.0.0.1:`port` over mutual TLS as `leaf`, trusting `ca`, with
/// `meanwhile` run between the handshake and the request: (status, head, JSON body).
pub fn mtls_post(
    port: u16,
    ca: &Ca,
    leaf: &Leaf,
    path: &str,
    body: &str,
    meanwhile: &dyn Fn(),
) -> Result<(u16, String, serde_json::Value), String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    use std::io::{Read, Write};
    use std::sync::Arc;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca.pem.as_bytes()).unwrap())
        .unwrap();
    let chain = vec![CertificateDer::from_pem_slice(leaf.cert_pem.as_bytes()).unwrap()];
    let key = PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).unwrap();
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .unwrap();
    let conn =
        rustls::ClientConnection::new(Arc::new(cfg), ServerName::try_from("127.0.0.1").unwrap())
            .unwrap();
    let tcp = std::net::TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    tcp.set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .unwrap();
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    while tls.conn.is_handshaking() {
        tls.conn
            .complete_io(&mut tls.sock)
            .map_err(|e| e.to_string())?;
    }
    meanwhile();
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    tls.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    match tls.read_to_end(&mut out) {
        Ok(_) => {}
        Err(e) if out.is_empty() => return Err(e.to_string()),
        Err(_) => {}
    }
    let text = String::from_utf8_lossy(&out);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no HTTP answer: {text:?}"))?;
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    Ok((
        status,
        head.to_string(),
        serde_json::from_str(body).unwrap(),
    ))
}

/// The child's exit status, once it exits within `secs`; past that it is killed and the test
/// fails with `what()` (the watchdog: a hang fails the test instead of blocking it).
pub fn exit_within(
    child: &mut std::process::Child,
    secs: u64,
    what: impl FnOnce() -> String,
) -> std::process::ExitStatus {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if std::time::Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            panic!("still running after {secs} s: {}", what());
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// kubeadm's discovery hash the way its documentation computes it, with openssl.
pub fn openssl_spki_hash(pem_file: &Path) -> String {
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "openssl x509 -pubkey -noout -in '{}' | openssl pkey -pubin -outform der | sha256sum",
            pem_file.display()
        ))
        .output()
        .unwrap();
    assert!(out.status.success());
    format!(
        "sha256:{}",
        String::from_utf8(out.stdout)
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
    )
}
