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
// Not every test file uses every concern.
#[allow(unused_imports)]
pub use {bus::*, http::*, pgp::*, pki::*};

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The binary under test: `NODESTRAP_BIN` (CI points it at the static release build, or at
/// another architecture's build run through qemu-user) or cargo's own build.
pub fn bin() -> String {
    std::env::var("NODESTRAP_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_nodestrap").to_string())
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

/// nodestrap with a clean environment: the given bus address (or none that exists), no
/// proxies, no system trust store.
pub fn command(args: &[String], bus: Option<&str>) -> Command {
    command_as(None, args, bus)
}

/// `command` with argv[0] set (the multicall names). With `NODESTRAP_RUNNER` (CI's qemu-user
/// for another architecture's build) the binary runs under it, argv[0] passed with `-0`.
pub fn command_as(argv0: Option<&str>, args: &[String], bus: Option<&str>) -> Command {
    let mut c = match std::env::var("NODESTRAP_RUNNER")
        .ok()
        .filter(|r| !r.is_empty())
    {
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
        // Never the host's /run/nodestrap: one folder per test binary, unless a test names
        // its own.
        .env(
            "NODESTRAP_RUN_DIR",
            std::env::temp_dir().join(format!("nodestrap-tests-{}/run", std::process::id())),
        )
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
