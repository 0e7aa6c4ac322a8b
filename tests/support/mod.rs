//! Test world for the nodestrap binary: a temp node root, a TLS server with a CA made at test
//! time, a fake API server that checks client certificates, OpenPGP keys made with sequoia, and
//! a private dbus-daemon with a test update_engine. Nothing here touches the host's real bus,
//! trust store or root.
#![allow(dead_code)]

use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};

use openpgp::cert::prelude::*;
use openpgp::policy::StandardPolicy;
use openpgp::serialize::stream::{Armorer, Message, Signer};
use openpgp::serialize::SerializeInto;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, ExtendedKeyUsagePurpose, IsCa, KeyPair,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use sequoia_openpgp as openpgp;

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
// PKI

pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
    pub pem: String,
}

pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name.push(rcgen::DnType::CommonName, name);
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        let issuer = CertifiedIssuer::self_signed(p, KeyPair::generate().unwrap()).unwrap();
        let pem = issuer.pem();
        Ca { issuer, pem }
    }

    pub fn server(&self) -> Leaf {
        let mut p =
            CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.leaf(p)
    }

    pub fn client(&self, cn: &str) -> Leaf {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name.push(rcgen::DnType::CommonName, cn);
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.leaf(p)
    }

    fn leaf(&self, p: CertificateParams) -> Leaf {
        let key = KeyPair::generate().unwrap();
        let cert = p.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// HTTPS server

#[derive(Clone, Debug)]
pub struct Reply {
    pub status: u16,
    pub body: Vec<u8>,
    /// Send only this many body bytes, then drop the connection (Content-Length stays full).
    pub truncate: Option<usize>,
    /// Send only this many body bytes, then go silent for a while (a stalled transfer).
    pub stall: Option<usize>,
    /// Send the body one byte at a time, this far apart (a server that trickles).
    pub trickle: Option<std::time::Duration>,
}

impl Reply {
    pub fn ok(body: impl Into<Vec<u8>>) -> Reply {
        Reply {
            status: 200,
            body: body.into(),
            truncate: None,
            stall: None,
            trickle: None,
        }
    }
    pub fn stalled(body: impl Into<Vec<u8>>, at: usize) -> Reply {
        Reply {
            stall: Some(at),
            ..Reply::ok(body)
        }
    }
    pub fn trickled(body: impl Into<Vec<u8>>, every: std::time::Duration) -> Reply {
        Reply {
            trickle: Some(every),
            ..Reply::ok(body)
        }
    }
    pub fn status(status: u16) -> Reply {
        Reply {
            status,
            body: format!(
                "{{\"kind\":\"Status\",\"message\":\"status {status} from the test server\"}}"
            )
            .into_bytes(),
            truncate: None,
            stall: None,
            trickle: None,
        }
    }
    pub fn truncated(body: impl Into<Vec<u8>>, at: usize) -> Reply {
        Reply {
            status: 200,
            body: body.into(),
            truncate: Some(at),
            stall: None,
            trickle: None,
        }
    }
}

#[derive(Clone, Debug)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub client_cert: bool,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Default)]
struct Routes {
    /// Keyed by path, or by `METHOD path` (which wins) for a reply to one method only.
    /// Replies used once each, in order, before the standing one.
    queued: HashMap<String, VecDeque<Reply>>,
    standing: HashMap<String, Reply>,
    bearer: Option<String>,
}

pub struct Server {
    pub port: u16,
    /// TCP connections accepted (a refused TLS handshake counts, unlike `seen`).
    pub connections: Arc<std::sync::atomic::AtomicUsize>,
    routes: Arc<Mutex<Routes>>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Server {
    /// Serve HTTPS on 127.0.0.1 with `leaf`; with `client_ca`, a client certificate from it
    /// is required.
    pub fn start(leaf: &Leaf, client_ca: Option<&Ca>) -> Server {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let certs: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(leaf.cert_pem.as_bytes())
                .collect::<Result<_, _>>()
                .unwrap();
        let key = PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).unwrap();
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap();
        let config = match client_ca {
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                for c in CertificateDer::pem_slice_iter(ca.pem.as_bytes()) {
                    roots.add(c.unwrap()).unwrap();
                }
                let v = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider,
                )
                .build()
                .unwrap();
                builder
                    .with_client_cert_verifier(v)
                    .with_single_cert(certs, key)
                    .unwrap()
            }
            None => builder
                .with_no_client_auth()
                .with_single_cert(certs, key)
                .unwrap(),
        };
        let config = Arc::new(config);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let routes: Arc<Mutex<Routes>> = Default::default();
        let seen: Arc<Mutex<Vec<Seen>>> = Default::default();
        let (r2, s2) = (routes.clone(), seen.clone());
        let connections: Arc<std::sync::atomic::AtomicUsize> = Default::default();
        let c2 = connections.clone();
        std::thread::spawn(move || {
            for tcp in listener.incoming() {
                let Ok(tcp) = tcp else { continue };
                c2.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let (config, routes, seen) = (config.clone(), r2.clone(), s2.clone());
                std::thread::spawn(move || {
                    let _ = handle(tcp, config, routes, seen);
                });
            }
        });
        Server {
            port,
            connections,
            routes,
            seen,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("https://127.0.0.1:{}{path}", self.port)
    }

    pub fn set(&self, path: &str, reply: Reply) {
        self.routes
            .lock()
            .unwrap()
            .standing
            .insert(path.to_string(), reply);
    }

    pub fn queue(&self, path: &str, reply: Reply) {
        self.routes
            .lock()
            .unwrap()
            .queued
            .entry(path.to_string())
            .or_default()
            .push_back(reply);
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// Answer 401 to any request without `Authorization: Bearer <token>`.
    pub fn require_bearer(&self, token: &str) {
        self.routes.lock().unwrap().bearer = Some(token.to_string());
    }

    /// Requests with this method and path, in order.
    pub fn requests(&self, method: &str, path: &str) -> Vec<Seen> {
        self.seen()
            .into_iter()
            .filter(|s| s.method == method && s.path == path)
            .collect()
    }

    pub fn hits(&self, path: &str) -> usize {
        self.seen().iter().filter(|s| s.path == path).count()
    }
}

fn handle(
    tcp: TcpStream,
    config: Arc<rustls::ServerConfig>,
    routes: Arc<Mutex<Routes>>,
    seen: Arc<Mutex<Vec<Seen>>>,
) -> std::io::Result<()> {
    tcp.set_read_timeout(Some(std::time::Duration::from_secs(20)))?;
    let conn = rustls::ServerConnection::new(config).map_err(std::io::Error::other)?;
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    loop {
        let mut reader = BufReader::new(&mut tls);
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let mut parts = line.split_whitespace();
        let method = parts.next().unwrap_or_default().to_string();
        let path = parts.next().unwrap_or_default().to_string();
        let mut headers = Vec::new();
        loop {
            let mut h = String::new();
            reader.read_line(&mut h)?;
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                headers.push((k.trim().to_string(), v.trim().to_string()));
            }
        }
        let len = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0);
        let mut body = vec![0; len];
        reader.read_exact(&mut body)?;
        drop(reader);
        let client_cert = tls.conn.peer_certificates().is_some_and(|c| !c.is_empty());
        let s = Seen {
            method,
            path: path.clone(),
            headers,
            body,
            client_cert,
        };
        seen.lock().unwrap().push(s.clone());
        let reply = {
            let mut r = routes.lock().unwrap();
            let authorized = match &r.bearer {
                None => true,
                Some(t) => s.header("authorization") == Some(format!("Bearer {t}").as_str()),
            };
            let by_method = format!("{} {path}", s.method);
            let q = if authorized {
                [&by_method, &path]
                    .into_iter()
                    .find_map(|k| r.queued.get_mut(k).and_then(|q| q.pop_front()))
            } else {
                Some(Reply::status(401))
            };
            q.or_else(|| r.standing.get(&by_method).cloned())
                .or_else(|| r.standing.get(&path).cloned())
                .unwrap_or_else(|| Reply::status(404))
        };
        let head = format!(
            "HTTP/1.1 {} X\r\nContent-Length: {}\r\nContent-Type: application/octet-stream\r\n\r\n",
            reply.status,
            reply.body.len()
        );
        tls.write_all(head.as_bytes())?;
        if let Some(every) = reply.trickle {
            for b in &reply.body {
                tls.write_all(std::slice::from_ref(b))?;
                tls.flush()?;
                std::thread::sleep(every);
            }
            continue;
        }
        if let Some(n) = reply.stall {
            tls.write_all(&reply.body[..n])?;
            tls.flush()?;
            std::thread::sleep(std::time::Duration::from_secs(30));
            return Ok(());
        }
        match reply.truncate {
            Some(n) => {
                tls.write_all(&reply.body[..n])?;
                tls.flush()?;
                // Drop the TCP connection without close_notify: a broken transfer.
                let _ = tls.sock.shutdown(std::net::Shutdown::Both);
                return Ok(());
            }
            None => {
                tls.write_all(&reply.body)?;
                tls.flush()?;
            }
        }
    }
}

/// An HTTP CONNECT proxy on 127.0.0.1 that records the targets it tunnels to.
pub struct Proxy {
    pub port: u16,
    pub targets: Arc<Mutex<Vec<String>>>,
}

impl Proxy {
    pub fn start() -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let targets: Arc<Mutex<Vec<String>>> = Default::default();
        let t2 = targets.clone();
        std::thread::spawn(move || {
            for c in listener.incoming() {
                let Ok(mut c) = c else { continue };
                let targets = t2.clone();
                std::thread::spawn(move || {
                    let mut r = BufReader::new(c.try_clone().unwrap());
                    let mut line = String::new();
                    r.read_line(&mut line).unwrap();
                    loop {
                        let mut h = String::new();
                        if r.read_line(&mut h).unwrap() == 0 || h.trim().is_empty() {
                            break;
                        }
                    }
                    let target = line
                        .split_whitespace()
                        .nth(1)
                        .unwrap_or_default()
                        .to_string();
                    targets.lock().unwrap().push(target.clone());
                    let Ok(up) = TcpStream::connect(&target) else {
                        return;
                    };
                    c.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                        .unwrap();
                    let (mut up_r, mut c_w) = (up.try_clone().unwrap(), c.try_clone().unwrap());
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut up_r, &mut c_w);
                        let _ = c_w.shutdown(std::net::Shutdown::Write);
                    });
                    let mut up_w = up;
                    let _ = std::io::copy(&mut r, &mut up_w);
                    let _ = up_w.shutdown(std::net::Shutdown::Write);
                });
            }
        });
        Proxy { port, targets }
    }
}

/// A port on 127.0.0.1 where nothing listens (connections are refused).
pub fn dead_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

// ---------------------------------------------------------------------------------------------
// OpenPGP

pub struct Signer_ {
    pub cert: Cert,
}

impl Signer_ {
    pub fn new(uid: &str) -> Signer_ {
        let (cert, _) = CertBuilder::general_purpose(Some(uid)).generate().unwrap();
        Signer_ { cert }
    }

    /// The public keyring, armored.
    pub fn keyring(&self) -> Vec<u8> {
        self.cert.armored().to_vec().unwrap()
    }

    /// An armored detached signature over `data`.
    pub fn sign(&self, data: &[u8]) -> Vec<u8> {
        let p = StandardPolicy::new();
        let keypair = self
            .cert
            .keys()
            .with_policy(&p, None)
            .supported()
            .alive()
            .revoked(false)
            .for_signing()
            .next()
            .unwrap()
            .key()
            .clone()
            .parts_into_secret()
            .unwrap()
            .into_keypair()
            .unwrap();
        let mut sink = Vec::new();
        {
            let m = Message::new(&mut sink);
            let m = Armorer::new(m)
                .kind(openpgp::armor::Kind::Signature)
                .build()
                .unwrap();
            let mut s = Signer::new(m, keypair).unwrap().detached().build().unwrap();
            s.write_all(data).unwrap();
            s.finalize().unwrap();
        }
        sink
    }
}

// ---------------------------------------------------------------------------------------------
// D-Bus: a private bus and the test update_engine

pub struct Bus {
    pub address: String,
    daemon: Child,
    services: Vec<Child>,
    dir: PathBuf,
}

impl Bus {
    pub fn start() -> Bus {
        let dir = unique_dir("bus");
        let sock = dir.join("system_bus_socket");
        let conf = dir.join("bus.conf");
        std::fs::write(&conf, format!(r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-BUS Bus Configuration 1.0//EN" "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path={}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_destination="*"/>
    <allow receive_sender="*"/>
  </policy>
</busconfig>
"#, sock.display())).unwrap();
        let mut daemon = Command::new("dbus-daemon")
            .arg(format!("--config-file={}", conf.display()))
            .args(["--nofork", "--nopidfile", "--print-address"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("dbus-daemon (Debian package dbus-daemon) must be installed");
        let mut line = String::new();
        BufReader::new(daemon.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        Bus {
            address: format!("unix:path={}", sock.display()),
            daemon,
            services: Vec::new(),
            dir,
        }
    }

    /// Start the test update_engine; `args` configure its states (see the script).
    pub fn update_engine(&mut self, args: &[&str]) {
        self.service("fake_update_engine.py", args);
    }

    /// The stand-in for systemd's manager (tests/support/fake_systemd.py).
    pub fn systemd(&mut self, args: &[&str]) {
        self.service("fake_systemd.py", args);
    }

    fn service(&mut self, file: &str, args: &[&str]) {
        let script = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/support")
            .join(file);
        let mut child = Command::new("/usr/bin/python3")
            .arg(script)
            .args(args)
            .env("DBUS_SYSTEM_BUS_ADDRESS", &self.address)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready", "{file} did not start");
        self.services.push(child);
    }
}

impl Drop for Bus {
    fn drop(&mut self) {
        for s in &mut self.services {
            let _ = s.kill();
            let _ = s.wait();
        }
        let _ = self.daemon.kill();
        let _ = self.daemon.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
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
            .filter(|l| l.starts_with("error") || l.starts_with("<3>"))
            .last()
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

// ---------------------------------------------------------------------------------------------
// Activation (tests/activate.rs)

impl Ca {
    /// A leaf with the caller's parameters: several usages, an organisation, names.
    pub fn issue(&self, p: CertificateParams) -> Leaf {
        self.leaf(p)
    }
}
