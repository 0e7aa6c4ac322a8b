//! HTTPS servers: the release server and the stand-in API server, a proxy.

use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::*;

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
    /// Headers beyond Content-Length and Content-Type (`Retry-After`).
    pub headers: Vec<(&'static str, String)>,
    /// Send the body chunked, its length not declared.
    pub chunked: bool,
    /// Answer `Range: bytes=N-` with 206 and the rest, as Go's and nginx's file servers do
    /// (`truncate` then counts within the rest).
    pub ranges: bool,
}

impl Reply {
    pub fn ok(body: impl Into<Vec<u8>>) -> Reply {
        Reply {
            status: 200,
            body: body.into(),
            truncate: None,
            stall: None,
            trickle: None,
            headers: Vec::new(),
            chunked: false,
            ranges: false,
        }
    }
    /// `Transfer-Encoding: chunked`: the client learns the length only at the end.
    pub fn chunked(body: impl Into<Vec<u8>>) -> Reply {
        Reply {
            chunked: true,
            ..Reply::ok(body)
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
            headers: Vec::new(),
            chunked: false,
            ranges: false,
        }
    }
    /// A busy server's answer: `status` (429, 503) with `Retry-After: retry_after`.
    pub fn busy(status: u16, retry_after: &str) -> Reply {
        Reply {
            headers: vec![("Retry-After", retry_after.to_string())],
            ..Reply::status(status)
        }
    }
    /// The same reply, and a `Range: bytes=N-` request gets the rest (206).
    pub fn ranged(self) -> Reply {
        Reply {
            ranges: true,
            ..self
        }
    }
    pub fn truncated(body: impl Into<Vec<u8>>, at: usize) -> Reply {
        Reply {
            status: 200,
            body: body.into(),
            truncate: Some(at),
            stall: None,
            trickle: None,
            headers: Vec::new(),
            chunked: false,
            ranges: false,
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
    /// When the request arrived.
    pub at: std::time::Instant,
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
    // As Go's net/http and most servers: a reply's head and body, written apart, go out at once
    // rather than the body waiting up to 40 ms for the client's delayed ACK of the head.
    tcp.set_nodelay(true)?;
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
            at: std::time::Instant::now(),
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
        let mut reply = reply;
        let from = s.header("range").and_then(|r| {
            r.strip_prefix("bytes=")?
                .strip_suffix('-')?
                .parse::<usize>()
                .ok()
        });
        if let Some(n) =
            from.filter(|n| reply.ranges && reply.status == 200 && *n < reply.body.len())
        {
            let len = reply.body.len();
            reply.status = 206;
            reply
                .headers
                .push(("Content-Range", format!("bytes {n}-{}/{len}", len - 1)));
            reply.body.drain(..n);
        }
        let extra: String = reply
            .headers
            .iter()
            .map(|(k, v)| format!("{k}: {v}\r\n"))
            .collect();
        let length = if reply.chunked {
            "Transfer-Encoding: chunked".to_string()
        } else {
            format!("Content-Length: {}", reply.body.len())
        };
        let head = format!(
            "HTTP/1.1 {} X\r\n{length}\r\nContent-Type: application/octet-stream\r\n{extra}\r\n",
            reply.status,
        );
        tls.write_all(head.as_bytes())?;
        if reply.chunked {
            for c in reply.body.chunks(64 << 10) {
                tls.write_all(format!("{:x}\r\n", c.len()).as_bytes())?;
                tls.write_all(c)?;
                tls.write_all(b"\r\n")?;
            }
            tls.write_all(b"0\r\n\r\n")?;
            tls.flush()?;
            continue;
        }
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

/// A TCP forwarder on 127.0.0.1 to `target`'s port that cuts the first connection whose answers
/// pass `cut_at` bytes there (both directions shut, no TLS close_notify: a transfer broken
/// mid-body); every other connection passes whole.
pub struct Cutter {
    pub port: u16,
    /// Connections cut so far (at most one).
    pub cuts: Arc<std::sync::atomic::AtomicUsize>,
}

impl Cutter {
    pub fn start(target: u16, cut_at: u64) -> Cutter {
        use std::sync::atomic::Ordering::SeqCst;
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let cuts: Arc<std::sync::atomic::AtomicUsize> = Default::default();
        let c2 = cuts.clone();
        std::thread::spawn(move || {
            for c in listener.incoming() {
                let Ok(down) = c else { continue };
                let Ok(up) = TcpStream::connect(("127.0.0.1", target)) else {
                    continue;
                };
                let cuts = c2.clone();
                let (mut up_r, mut down_w) = (up.try_clone().unwrap(), down.try_clone().unwrap());
                let (up_c, down_c) = (up.try_clone().unwrap(), down.try_clone().unwrap());
                std::thread::spawn(move || {
                    let mut passed = 0u64;
                    let mut buf = vec![0u8; 16 << 10];
                    loop {
                        let n = match up_r.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        let mut n = n;
                        let cut = passed + n as u64 > cut_at && cuts.load(SeqCst) == 0;
                        if cut {
                            n = (cut_at - passed) as usize;
                        }
                        if down_w.write_all(&buf[..n]).is_err() {
                            break;
                        }
                        passed += n as u64;
                        if cut {
                            cuts.fetch_add(1, SeqCst);
                            let _ = down_c.shutdown(std::net::Shutdown::Both);
                            let _ = up_c.shutdown(std::net::Shutdown::Both);
                            return;
                        }
                    }
                    let _ = down_w.shutdown(std::net::Shutdown::Write);
                });
                let (mut down_r, mut up_w) = (down, up);
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut down_r, &mut up_w);
                    let _ = up_w.shutdown(std::net::Shutdown::Write);
                });
            }
        });
        Cutter { port, cuts }
    }
}

/// A port on 127.0.0.1 where nothing listens (connections are refused).
pub fn dead_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}
