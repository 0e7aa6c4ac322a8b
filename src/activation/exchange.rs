//! The small HTTP/1.1 the activation exchanges speak over mutual TLS (`mtls.rs`): one JSON
//! request and one JSON answer per connection, sizes and times bounded; the server loop that
//! keeps slow or idle peers from holding anyone up, and the client's call.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ServerConfig, StreamOwned};

use crate::activation::mtls::{peer, Peer};
use crate::error::{Error, Result};
use crate::net::retry::After;

/// Largest request or answer body read (a ticket with control-plane keys is a few KiB).
const BODY_CAP: usize = 1 << 20;
const HEAD_CAP: usize = 16 << 10;

pub(crate) type ServerStream = StreamOwned<rustls::ServerConnection, Timed>;

/// A TCP stream under one deadline: every socket read and write gets only the time left, and
/// fails once it is gone. A per-operation timeout alone lets a peer that trickles a byte now
/// and then hold the connection (and a one-at-a-time server) for ever.
pub(crate) struct Timed {
    tcp: TcpStream,
    limit: Duration,
    end: Instant,
}

impl Timed {
    pub(crate) fn new(tcp: TcpStream, limit: Duration) -> Timed {
        Timed {
            tcp,
            limit,
            end: Instant::now() + limit,
        }
    }

    /// The full limit again from now: for the answer, after work that had its own bound.
    pub(crate) fn restart(&mut self) {
        self.end = Instant::now() + self.limit;
    }

    /// Whether the peer is still waiting for the answer: it sent its whole request, so
    /// anything more from it (its FIN, a TLS close_notify) means it gave up. A node that timed
    /// out in the queue must not be handed a ticket nobody will read.
    pub(crate) fn peer_waiting(&self) -> bool {
        if self.tcp.set_nonblocking(true).is_err() {
            return true;
        }
        let waiting = matches!(
            self.tcp.peek(&mut [0u8; 1]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock
        );
        let _ = self.tcp.set_nonblocking(false);
        waiting
    }

    fn expired(&self) -> io::Error {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "the connection's {} s deadline has passed",
                self.limit.as_secs_f32()
            ),
        )
    }

    /// The time left, or the error once there is none (a zero socket timeout would mean
    /// "no timeout", and the kernel refuses it anyway).
    fn left(&self) -> io::Result<Duration> {
        let left = self.end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(self.expired());
        }
        Ok(left)
    }

    /// A socket timeout here is the deadline: say so rather than "temporarily unavailable".
    fn timed<T>(&self, r: io::Result<T>) -> io::Result<T> {
        r.map_err(|e| match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => self.expired(),
            _ => e,
        })
    }
}

impl Read for Timed {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.tcp.set_read_timeout(Some(self.left()?))?;
        let r = self.tcp.read(buf);
        self.timed(r)
    }
}

impl Write for Timed {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.tcp.set_write_timeout(Some(self.left()?))?;
        let r = self.tcp.write(buf);
        self.timed(r)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.tcp.flush()
    }
}

/// Connections in their handshake and request at once, at most; more are closed at once.
pub(crate) const MAX_UNAUTHENTICATED: usize = 128;
/// Time for the TLS handshake and the request before anyone is known (the answer gets its own).
pub(crate) const PREAUTH_TIMEOUT: Duration = Duration::from_secs(10);

/// Serve until `stopping()` or until `handle` returns false. Each accepted connection gets its
/// own thread for `preauth` (TLS handshake, authentication, reading and checking the request),
/// so idle or slow peers never hold anyone else up; at most `MAX_UNAUTHENTICATED` are in that
/// stage, and a connection beyond them is closed unanswered rather than queued. What `preauth`
/// lets through reaches `handle` one at a time, in this thread: the work that must not run
/// twice at once (the node lock, a ticket) stays serialized. A stop is noticed between
/// handled requests. What is on its way by then is still answered, by `late`, never dropped:
/// connections waiting in the listen queue are accepted, and requests in their
/// pre-authentication finish (each bounded by its deadline) and go to `late`.
pub(crate) fn serve<T: Send>(
    listener: &TcpListener,
    stopping: impl Fn() -> bool,
    preauth: impl Fn(TcpStream, SocketAddr) -> Option<T> + Sync,
    mut handle: impl FnMut(T) -> bool,
    late: impl Fn(T),
) -> Result<()> {
    // 1. Non-blocking: the loop waits for a connection only a short tick at a time.
    listener
        .set_nonblocking(true)
        .map_err(|e| Error::failed(format!("listener: {e}")))?;
    let in_flight = AtomicUsize::new(0);
    let (tx, rx) = mpsc::channel::<T>();
    std::thread::scope(|scope| {
        let accepting = Accepting {
            listener,
            scope,
            preauth: &preauth,
            in_flight: &in_flight,
            tx,
        };
        // 2. Serve until the stop, or until `handle` says no more.
        accepting.serve(&rx, &stopping, &mut handle);
        // 3. Stopped: the listen queue.
        accepting.accept_queued();
        // 4. Every request still on its way, once the last pre-authentication has sent it.
        drop(accepting);
        for t in rx.iter() {
            late(t);
        }
    });
    Ok(())
}

/// The accept loop's state: the listener, the connections in their pre-authentication (each in
/// a thread of `scope`) and the channel by which those that pass reach the serving thread.
struct Accepting<'scope, 'env, T, P> {
    listener: &'env TcpListener,
    scope: &'scope std::thread::Scope<'scope, 'env>,
    preauth: &'env P,
    in_flight: &'env AtomicUsize,
    tx: mpsc::Sender<T>,
}

impl<'scope, 'env, T, P> Accepting<'scope, 'env, T, P>
where
    T: Send + 'scope,
    P: Fn(TcpStream, SocketAddr) -> Option<T> + Sync,
{
    /// Hand what passed its pre-authentication to `handle` and take in new connections, until
    /// `stopping()` or until `handle` returns false.
    fn serve(
        &self,
        rx: &mpsc::Receiver<T>,
        stopping: &impl Fn() -> bool,
        handle: &mut impl FnMut(T) -> bool,
    ) {
        while !stopping() {
            while let Ok(t) = rx.try_recv() {
                if !handle(t) || stopping() {
                    return;
                }
            }
            self.accept_one();
        }
    }

    /// A connection taken in, if one comes within a tick.
    fn accept_one(&self) {
        // Short, so that requests that passed their pre-authentication are handled
        // promptly.
        let mut pfd = [rustix::event::PollFd::new(
            self.listener,
            rustix::event::PollFlags::IN,
        )];
        let tick = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 20_000_000,
        };
        if !matches!(rustix::event::poll(&mut pfd, Some(&tick)), Ok(n) if n > 0) {
            return;
        }
        match self.listener.accept() {
            Ok((tcp, addr)) => self.start(tcp, addr),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => crate::warn!("accepting a connection: {e}"),
        }
    }

    /// After the stop. The listen queue holds clients the kernel already took in: they are
    /// answered too. A client that gave up while queued (ECONNABORTED) is skipped; one that
    /// cannot be taken in at all (EMFILE) stops it after a few tries.
    fn accept_queued(&self) {
        let mut failed = 0;
        loop {
            match self.listener.accept() {
                Ok((tcp, addr)) => self.start(tcp, addr),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if failed < 8 => {
                    failed += 1;
                    crate::warn!("accepting a queued connection after the stop: {e}");
                }
                Err(e) => {
                    crate::error!("accepting a queued connection after the stop: {e}; the rest of the queue goes unanswered");
                    break;
                }
            }
        }
    }

    /// `preauth` of a connection in a thread of its own, unless `MAX_UNAUTHENTICATED` are in
    /// theirs: then it is closed unanswered.
    fn start(&self, tcp: TcpStream, addr: SocketAddr) {
        if self.in_flight.load(Ordering::SeqCst) >= MAX_UNAUTHENTICATED {
            crate::warn!(
                "refused a connection from {addr}: {MAX_UNAUTHENTICATED} connections are already in their handshake"
            );
            return;
        }
        let _ = tcp.set_nonblocking(false);
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let (tx, preauth, in_flight) = (self.tx.clone(), self.preauth, self.in_flight);
        let spawned = std::thread::Builder::new()
            .name("preauth".into())
            .spawn_scoped(self.scope, move || {
                let passed = preauth(tcp, addr);
                in_flight.fetch_sub(1, Ordering::SeqCst);
                if let Some(t) = passed {
                    let _ = tx.send(t);
                }
            });
        if let Err(e) = spawned {
            // The closure (and the connection) is dropped: nothing is left in flight.
            in_flight.fetch_sub(1, Ordering::SeqCst);
            crate::warn!("refused a connection from {addr}: no thread for it: {e}");
        }
    }
}

/// The TLS handshake on an accepted connection; the client's identity. `timeout` bounds the
/// whole connection, handshake and request together (see [`Timed::restart`] for the answer).
pub(crate) fn accept(
    tcp: TcpStream,
    cfg: &Arc<ServerConfig>,
    timeout: Duration,
) -> Result<(ServerStream, Peer)> {
    let conn = rustls::ServerConnection::new(cfg.clone())
        .map_err(|e| Error::failed(format!("TLS: {e}")))?;
    let mut s = StreamOwned::new(conn, Timed::new(tcp, timeout));
    while s.conn.is_handshaking() {
        s.conn
            .complete_io(&mut s.sock)
            .map_err(|e| Error::failed(format!("TLS handshake: {e}")))?;
    }
    let der = s
        .conn
        .peer_certificates()
        .and_then(|c| c.first())
        .ok_or_else(|| Error::failed("TLS: no client certificate"))?;
    let p = peer(der).ok_or_else(|| Error::failed("TLS: client certificate does not parse"))?;
    Ok((s, p))
}

pub struct Request {
    pub(crate) method: String,
    pub(crate) path: String,
    pub body: Vec<u8>,
}

/// A message as read: its status or request line, its body and its `Retry-After`.
pub(crate) struct Message {
    pub(crate) first: String,
    pub(crate) body: Vec<u8>,
    pub(crate) retry_after: Option<After>,
}

/// Status line or request line, headers, and a Content-Length body of at most `BODY_CAP`.
pub(crate) fn read_message(r: &mut impl BufRead, to_eof: bool) -> io::Result<Message> {
    let mut head = Vec::new();
    let mut first = String::new();
    let mut len: Option<usize> = None;
    let (mut retry_after, mut date) = (None, None);
    loop {
        let mut line = Vec::new();
        r.by_ref()
            .take(HEAD_CAP as u64)
            .read_until(b'\n', &mut line)?;
        head.extend_from_slice(&line);
        if head.len() >= HEAD_CAP {
            return Err(io::Error::other("header larger than 16 KiB"));
        }
        if line.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed in the header",
            ));
        }
        let text = String::from_utf8_lossy(&line);
        let text = text.trim_end();
        if first.is_empty() {
            first = text.to_string();
            continue;
        }
        if text.is_empty() {
            break;
        }
        if let Some((k, v)) = text.split_once(':') {
            if k.trim().eq_ignore_ascii_case("retry-after") {
                retry_after = Some(v.to_string());
            }
            if k.trim().eq_ignore_ascii_case("date") {
                date = Some(v.to_string());
            }
            if k.trim().eq_ignore_ascii_case("content-length") {
                len = Some(
                    v.trim()
                        .parse()
                        .map_err(|_| io::Error::other("bad Content-Length"))?,
                );
            }
        }
    }
    let body = match len {
        Some(n) if n > BODY_CAP => {
            return Err(io::Error::other(format!(
                "body of {n} bytes is over the {BODY_CAP}-byte limit"
            )))
        }
        Some(n) => {
            let mut b = vec![0; n];
            r.read_exact(&mut b)?;
            b
        }
        None if to_eof => crate::node::root::read_capped(r, BODY_CAP as u64)?,
        None => Vec::new(),
    };
    // A Retry-After date is measured on the server's clock, from its Date.
    let now = crate::net::fetch::server_now(date.as_deref());
    let retry_after = retry_after.and_then(|v| crate::net::fetch::retry_after(&v, now));
    Ok(Message {
        first,
        body,
        retry_after,
    })
}

pub fn read_request(s: &mut impl Read) -> io::Result<Request> {
    let Message {
        first: line, body, ..
    } = read_message(&mut BufReader::new(s), false)?;
    let mut parts = line.split_whitespace();
    let (Some(method), Some(path)) = (parts.next(), parts.next()) else {
        return Err(io::Error::other("not an HTTP request"));
    };
    Ok(Request {
        method: method.to_string(),
        path: path.to_string(),
        body,
    })
}

pub(crate) fn respond(s: &mut impl Write, status: u16, body: &serde_json::Value) -> io::Result<()> {
    respond_with(s, status, body, "")
}

/// 503 Service Unavailable with `Retry-After: secs`: ask again, not sooner.
pub(crate) fn respond_later(
    s: &mut impl Write,
    body: &serde_json::Value,
    secs: u64,
) -> io::Result<()> {
    respond_with(s, 503, body, &format!("Retry-After: {secs}\r\n"))
}

/// `503` with an appointment: `Retry-After` the moment `at` (an HTTP-date, which clients keep
/// to the second), and `Date` now, so that a node measures the wait on the server's clock.
pub(crate) fn respond_at(
    s: &mut impl Write,
    body: &serde_json::Value,
    at: std::time::SystemTime,
) -> io::Result<()> {
    let extra = format!(
        "Retry-After: {}\r\nDate: {}\r\n",
        httpdate::fmt_http_date(at),
        httpdate::fmt_http_date(std::time::SystemTime::now())
    );
    respond_with(s, 503, body, &extra)
}

fn respond_with(
    s: &mut impl Write,
    status: u16,
    body: &serde_json::Value,
    extra: &str,
) -> io::Result<()> {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        503 => "Service Unavailable",
        _ => "Error",
    };
    let body = serde_json::to_vec(body).map_err(io::Error::other)?;
    write!(
        s,
        "HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{extra}Connection: close\r\n\r\n",
        body.len()
    )?;
    s.write_all(&body)?;
    s.flush()
}

/// `{"error": message, "code": code}`, plus what the caller adds.
pub(crate) fn error_body(code: &str, message: &str) -> serde_json::Value {
    serde_json::json!({"error": message, "code": code})
}

// ---------------------------------------------------------------------------------------------
// Calling

/// `https://host:port`, as given for an init server or a join service.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Endpoint {
    pub(crate) url: String,
    pub(crate) host: String,
    pub(crate) port: u16,
}

impl Endpoint {
    pub(crate) fn parse(url: &str, flag: &str) -> Result<Endpoint> {
        let bad = |why: &str| Error::config(format!("{flag} {url:?}: {why}"));
        let rest = url
            .strip_prefix("https://")
            .ok_or_else(|| bad("expected https://HOST:PORT"))?
            .trim_end_matches('/');
        let (host, port) = match rest.strip_prefix('[') {
            Some(v6) => {
                let (h, p) = v6
                    .split_once("]:")
                    .ok_or_else(|| bad("expected https://[IPv6]:PORT"))?;
                (h, p)
            }
            None => rest.rsplit_once(':').ok_or_else(|| bad("no port"))?,
        };
        let port: u16 = port
            .parse()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| bad("bad port"))?;
        if host.is_empty() || host.contains(['/', '@', '?', '#']) {
            return Err(bad("bad host"));
        }
        ServerName::try_from(host.to_string())
            .map_err(|_| bad("host is not a DNS name or IP address"))?;
        Ok(Endpoint {
            url: url.trim_end_matches('/').to_string(),
            host: host.to_string(),
            port,
        })
    }
}

/// Why a call failed: worth trying again later, or not.
pub(crate) enum CallError {
    /// Could not reach the server (refused, unreachable, timed out).
    Unreachable(Error),
    /// Reached it, but the exchange failed (TLS refused, bad answer).
    Failed(Error),
}

impl CallError {
    pub(crate) fn into_error(self) -> Error {
        match self {
            CallError::Unreachable(e) | CallError::Failed(e) => e,
        }
    }
}

/// POST `body` (JSON) to `path` on `ep` over mutual TLS, verifying the server's certificate
/// for `server_name` (default: the endpoint's host). Everything after the connection is made,
/// handshake to the last byte of the answer, is bounded by `io_timeout` together.
pub(crate) fn post(
    cfg: &Arc<ClientConfig>,
    ep: &Endpoint,
    server_name: Option<&str>,
    path: &str,
    body: &[u8],
    connect_timeout: Duration,
    io_timeout: Duration,
) -> std::result::Result<Answer, CallError> {
    let what = format!("POST {}{path}", ep.url);
    let failed = |m: String| CallError::Failed(Error::failed(format!("{what}: {m}")));
    let name = server_name.unwrap_or(&ep.host).to_string();
    let sn = ServerName::try_from(name.clone())
        .map_err(|_| failed(format!("bad server name {name:?}")))?;
    let addrs: Vec<SocketAddr> = (ep.host.as_str(), ep.port)
        .to_socket_addrs()
        .map_err(|e| {
            CallError::Unreachable(Error::failed(format!("{what}: resolving {}: {e}", ep.host)))
        })?
        .collect();
    let mut last = None;
    let mut tcp = None;
    for a in &addrs {
        match TcpStream::connect_timeout(a, connect_timeout) {
            Ok(t) => {
                tcp = Some(t);
                break;
            }
            Err(e) => last = Some(e),
        }
    }
    let tcp = tcp.ok_or_else(|| {
        CallError::Unreachable(Error::failed(format!(
            "{what}: {}",
            last.map(|e| e.to_string())
                .unwrap_or_else(|| "no address".into())
        )))
    })?;
    let conn =
        rustls::ClientConnection::new(cfg.clone(), sn).map_err(|e| failed(format!("TLS: {e}")))?;
    let mut s = StreamOwned::new(conn, Timed::new(tcp, io_timeout));
    while s.conn.is_handshaking() {
        s.conn
            .complete_io(&mut s.sock)
            .map_err(|e| failed(format!("TLS handshake: {e}")))?;
    }
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {}:{}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        ep.host,
        ep.port,
        body.len()
    );
    s.write_all(head.as_bytes())
        .and_then(|_| s.write_all(body))
        .and_then(|_| s.flush())
        .map_err(|e| failed(format!("sending: {e}")))?;
    let Message {
        first: status_line,
        body,
        retry_after,
    } = read_message(&mut BufReader::new(&mut s), true)
        .map_err(|e| failed(format!("reading the answer: {e}")))?;
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .filter(|_| status_line.starts_with("HTTP/1."))
        .ok_or_else(|| failed(format!("not an HTTP answer: {status_line:?}")))?;
    Ok(Answer {
        status,
        body,
        retry_after,
    })
}

/// What a server answered a `post`.
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) body: Vec<u8>,
    /// Its `Retry-After` (seconds or an HTTP date), if it sent one: ask again, not sooner.
    pub(crate) retry_after: Option<After>,
}

/// The `error` (and `code`) of a JSON error answer, or its first line.
pub fn answer_error(status: u16, body: &[u8]) -> (String, String) {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    let code = v["code"].as_str().unwrap_or("").to_string();
    let msg = v["error"]
        .as_str()
        .map(str::to_string)
        .or_else(|| crate::net::fetch::server_message(body))
        .unwrap_or_default();
    (code, format!("HTTP {status}: {msg}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        let e = Endpoint::parse("https://10.0.0.5:9090/", "--x").unwrap();
        assert_eq!(
            (e.host.as_str(), e.port, e.url.as_str()),
            ("10.0.0.5", 9090, "https://10.0.0.5:9090")
        );
        let e = Endpoint::parse("https://[fd00::1]:9000", "--x").unwrap();
        assert_eq!((e.host.as_str(), e.port), ("fd00::1", 9000));
        for bad in [
            "http://a:1",
            "https://a",
            "https://a:0",
            "https://a:x",
            "https://u@a:1",
            "https://:1",
        ] {
            let e = Endpoint::parse(bad, "--join-endpoints").unwrap_err();
            assert_eq!(e.exit_code(), 2);
            assert!(e.to_string().starts_with("--join-endpoints"), "{e}");
        }
    }

    #[test]
    fn a_trickling_peer_is_cut_off_at_the_deadline() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        // A byte every 50 ms: each read returns in time, the request never ends.
        let trickler = std::thread::spawn(move || {
            let mut c = TcpStream::connect(addr).unwrap();
            for _ in 0..100 {
                if c.write_all(b"P").is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let (tcp, _) = l.accept().unwrap();
        let start = Instant::now();
        let e = read_request(&mut Timed::new(tcp, Duration::from_millis(400)))
            .err()
            .expect("a request that never ends");
        assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
        assert!(e.to_string().contains("0.4 s deadline"), "{e}");
        let took = start.elapsed();
        assert!(
            took >= Duration::from_millis(350) && took < Duration::from_secs(2),
            "{took:?}"
        );
        trickler.join().unwrap();
    }

    #[test]
    fn a_silent_peer_gets_the_deadline_error() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let _c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (tcp, _) = l.accept().unwrap();
        let e = read_request(&mut Timed::new(tcp, Duration::from_millis(200)))
            .err()
            .expect("nothing was sent");
        assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
        assert!(e.to_string().contains("0.2 s deadline has passed"), "{e}");
    }

    #[test]
    fn http_messages_are_bounded() {
        let mut ok: &[u8] = b"POST /v1/init HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}";
        let r = read_request(&mut ok).unwrap();
        assert_eq!(
            (r.method.as_str(), r.path.as_str(), r.body.as_slice()),
            ("POST", "/v1/init", &b"{}"[..])
        );
        let big = format!(
            "POST / HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
            BODY_CAP + 1
        );
        assert!(read_request(&mut big.as_bytes()).is_err());
        let long = format!("POST / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(HEAD_CAP));
        assert!(read_request(&mut long.as_bytes()).is_err());
        let mut cut: &[u8] = b"POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\n{}";
        assert!(read_request(&mut cut).is_err());
    }
}
