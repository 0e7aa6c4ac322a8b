//! HTTPS client: ureq over rustls, trust anchors we choose, retries with `curl --retry`
//! semantics (transport errors, 408, 429 and 5xx are retried; 404 and other 4xx are final),
//! exponential backoff with full jitter, size caps, and progress lines on long downloads
//! (TLS itself: `net/tls.rs`; the verified write a download ends in: `node/verified.rs`).

use std::borrow::Cow;
use std::io::Read;
use std::time::Duration;

use ureq::tls::{RootCerts, TlsConfig};
use ureq::Agent;

use crate::error::{Error, Result};

use crate::net::retry::{After, Load, Retry};
use crate::net::tls::{tls_provider, Check, Tls};

mod answer;
mod attempts;
mod reader;
mod stream;

pub(crate) use answer::server_message;
use answer::{capped, classify_transport, over_limit, read_failure, status_failure, verdict};
pub use attempts::{Retrying, Start};
use reader::RateFloor;
pub use stream::content_range;

/// Why a request failed for good, for callers that decide differently on each (the cluster
/// version's fallback, docs/bootstrap.md "The cluster's version").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// No answer: connection refused, name not resolved, TLS or transfer broken, or no
    /// answer in time; tried up to the attempts or the deadline.
    Unreachable,
    /// The server answered busy (408, 429, 5xx) until the deadline.
    Busy,
    /// An answer that trying again cannot change: 404 and other 4xx, a certificate the trust
    /// anchors reject, a body over its limit, a digest mismatch, a write that failed.
    Final,
    /// 401 or 403: the server answered that these credentials may not do this: the identity is
    /// wrong, so older data stands in only where the operator said so for every failure
    /// (`--version-fallback always-after-deadline`).
    Denied,
    /// An answer with a status the caller named (`fetch_passing`), handed back at once for the
    /// caller's own rule: 404 for a file that may be absent, 409 for a patch to read again.
    Passed(u16),
}

/// Why a request did not give its answer: the class a caller decides on, and the error that
/// says what and why (zincati's `FleetLockError` shape). A caller with nothing to decide uses
/// `?` and gets the error.
#[derive(Debug)]
pub struct FetchError {
    pub class: Failure,
    pub(crate) error: Error,
}

impl FetchError {
    pub(crate) fn new(class: Failure, error: Error) -> FetchError {
        FetchError { class, error }
    }
}

impl From<FetchError> for Error {
    fn from(f: FetchError) -> Error {
        f.error
    }
}

impl std::fmt::Display for FetchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

/// The `Retry-After` of a 429 or 503 answer: delay-seconds or an HTTP-date (RFC 9110 §10.2.3),
/// the date as the wait from `now` (the server's clock: [`server_now`]). A date in the past
/// means now; a value that is neither is ignored.
pub fn retry_after(value: &str, now: std::time::SystemTime) -> Option<After> {
    let v = value.trim();
    if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
        return Some(After::Delay(Duration::from_secs(
            v.parse().unwrap_or(u64::MAX),
        )));
    }
    let at = httpdate::parse_http_date(v).ok()?;
    Some(After::Date(at.duration_since(now).unwrap_or_default()))
}

/// The moment an answer was sent, on the server's clock: its `Date` where it sent one that
/// reads, else this node's clock. A `Retry-After` date is measured from it, so that a node
/// whose clock is off (an initramfs before time sync) waits what the server meant.
pub(crate) fn server_now(date: Option<&str>) -> std::time::SystemTime {
    date.and_then(|d| httpdate::parse_http_date(d.trim()).ok())
        .unwrap_or_else(std::time::SystemTime::now)
}

/// A connection not accepted within this is an attempt without an answer: a server whose
/// listen queue is full drops the SYN, and the kernel sends it again 1, 3, 7 and 15 s after the
/// first, so this waits out four of its resends (bench/herd_sim.rs models that).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// Bounds on one attempt, so that a server that trickles bytes cannot hold a run for ever
/// (curl's `--max-time`, `--speed-limit` and `--speed-time`).
#[derive(Debug, Clone, Copy)]
pub struct AttemptLimits {
    /// No attempt lasts longer, from connecting to the body's last byte. The retry budget's
    /// remainder shortens it, so the budget ends a run even in the middle of an attempt.
    pub deadline: Duration,
    /// Bytes per second that every `window` of a transfer must reach on average; 0: no floor.
    pub(crate) min_rate: u64,
    pub(crate) window: Duration,
}

impl Default for AttemptLimits {
    fn default() -> Self {
        AttemptLimits {
            deadline: Duration::from_secs(DEFAULT_ATTEMPT_SECS),
            min_rate: DEFAULT_MIN_RATE,
            window: Duration::from_secs(DEFAULT_RATE_WINDOW_SECS),
        }
    }
}

impl AttemptLimits {
    /// From `--fetch-timeout`, `--fetch-min-rate` and `--fetch-min-rate-window`, checked: a
    /// value out of bounds is a configuration error naming the option.
    pub(crate) fn from_options(timeout: u64, min_rate: u64, window: u64) -> Result<AttemptLimits> {
        for (flag, v, lo, hi) in [
            ("--fetch-timeout", timeout, 1, 24 * 3600),
            ("--fetch-min-rate", min_rate, 0, 1 << 30),
            ("--fetch-min-rate-window", window, 1, 3600),
        ] {
            if v < lo {
                return Err(Error::config(format!("{flag} {v}: at least {lo}")));
            }
            if v > hi {
                return Err(Error::config(format!("{flag} {v}: at most {hi}")));
            }
        }
        Ok(AttemptLimits {
            deadline: Duration::from_secs(timeout),
            min_rate,
            window: Duration::from_secs(window),
        })
    }
}

/// Defaults of `--fetch-timeout`, `--fetch-min-rate` and `--fetch-min-rate-window` (docs/bootstrap.md, "Deadlines").
pub(crate) const DEFAULT_ATTEMPT_SECS: u64 = 300;
pub(crate) const DEFAULT_MIN_RATE: u64 = 1024;
pub(crate) const DEFAULT_RATE_WINDOW_SECS: u64 = 30;

/// Resolves one host name as another host (`tls-server-name`): the certificate is checked
/// against the alias while the connection goes to the real server.
#[derive(Debug, Clone)]
struct Alias {
    alias: String,
    /// The real host (a name or an address, IPv6 in brackets).
    real: String,
}

impl ureq::unversioned::resolver::Resolver for Alias {
    fn resolve(
        &self,
        uri: &ureq::http::Uri,
        config: &ureq::config::Config,
        timeout: ureq::unversioned::transport::NextTimeout,
    ) -> std::result::Result<ureq::unversioned::resolver::ResolvedSocketAddrs, ureq::Error> {
        use ureq::unversioned::resolver::DefaultResolver;
        if uri.host() != Some(self.alias.as_str()) {
            return DefaultResolver::default().resolve(uri, config, timeout);
        }
        let port = uri.port_u16().unwrap_or(443);
        let real: ureq::http::Uri = format!("https://{}:{port}/", self.real)
            .parse()
            .map_err(|_| ureq::Error::HostNotFound)?;
        DefaultResolver::default().resolve(&real, config, timeout)
    }
}

fn new_agent(config: &ureq::config::Config, alias: &Option<Alias>) -> Agent {
    match alias {
        Some(a) => Agent::with_parts(
            config.clone(),
            ureq::unversioned::transport::DefaultConnector::new(),
            a.clone(),
        ),
        None => config.new_agent(),
    }
}

/// What one attempt says about trying again.
pub enum Attempt<T> {
    Done(T),
    /// No answer, or a broken one: counts against the attempts.
    Retry(Error),
    /// 408, 429 or 5xx (the status), with the server's `Retry-After`: bounded by time only.
    Busy(Error, u16, Option<After>),
    Final(Error),
    /// 401 or 403.
    Denied(Error),
    /// A status the caller named: its answer, at once.
    Passed(u16, Error),
}

pub(crate) struct Http {
    /// Replaced after a failed attempt: the old one's pool goes with it, so no idle
    /// connection is held at a struggling server through the pause (a herd of nodes would
    /// hold one each).
    agent: std::sync::Mutex<Agent>,
    config: ureq::config::Config,
    alias: Option<Alias>,
    retry: Retry,
    /// What this client's requests learned of their server's load (`retry::Load`).
    load: std::sync::Mutex<Load>,
    /// The server whose load the run before left (`net::handover`) was last taken for.
    handed: std::sync::Mutex<Option<String>>,
    limits: AttemptLimits,
    /// Kept to build the same client through another proxy.
    tls: Tls,
}

pub(crate) struct Request<'a> {
    pub(crate) method: &'static str,
    pub(crate) url: &'a str,
    /// Header values may be secrets: they are never logged.
    pub(crate) headers: Vec<(Cow<'static, str>, String)>,
    /// Content type and body.
    pub(crate) body: Option<(&'static str, Vec<u8>)>,
}

impl<'a> Request<'a> {
    pub(crate) fn get(url: &'a str) -> Self {
        Request {
            method: "GET",
            url,
            headers: Vec::new(),
            body: None,
        }
    }
}

impl Http {
    pub(crate) fn new(tls: &Tls, retry: Retry) -> Http {
        Http::build(tls, retry, ureq::Proxy::try_from_env())
    }

    /// The same client, with `alias` resolved as `real`'s address: requests then go to `alias`,
    /// so TLS sends it as the server name and checks the certificate against it (a
    /// kubeconfig's `tls-server-name`), while the connection goes where `real` points.
    pub(crate) fn with_server_name(self, alias: &str, real: &str) -> Http {
        let mut h = Http::build_with(
            &self.tls,
            self.retry,
            None,
            Some(Alias {
                alias: alias.to_string(),
                real: real.to_string(),
            }),
        );
        h.limits = self.limits;
        h
    }

    /// The same client, reaching every server through the proxy at `url` (http or https).
    pub(crate) fn via_proxy(self, url: &str) -> Result<Http> {
        let proxy = ureq::Proxy::new(url)
            .map_err(|e| Error::config(format!("{url:?}: not a proxy URL: {e}")))?;
        let mut h = Http::build(&self.tls, self.retry, Some(proxy));
        h.limits = self.limits;
        Ok(h)
    }

    /// The same client (proxy, server alias, bounds per attempt) with other TLS settings and
    /// retries: a registry mirror's (net::mirrors).
    pub(crate) fn derived(&self, tls: &Tls, retry: Retry) -> Http {
        let mut h = Http::build_with(tls, retry, self.config.proxy().cloned(), self.alias.clone());
        h.limits = self.limits;
        h
    }

    pub(crate) fn tls(&self) -> &Tls {
        &self.tls
    }

    pub(crate) fn retry(&self) -> Retry {
        self.retry
    }

    fn build(tls: &Tls, retry: Retry, proxy: Option<ureq::Proxy>) -> Http {
        Http::build_with(tls, retry, proxy, None)
    }

    fn build_with(
        tls: &Tls,
        retry: Retry,
        proxy: Option<ureq::Proxy>,
        alias: Option<Alias>,
    ) -> Http {
        let provider = tls_provider();
        let tls_config = TlsConfig::builder()
            .root_certs(RootCerts::new_with_certs(&tls.roots))
            .client_cert(tls.client.clone())
            .disable_verification(tls.check == Check::PinnedAfter)
            .unversioned_rustls_crypto_provider(provider)
            .build();
        let config = Agent::config_builder()
            .tls_config(tls_config)
            .http_status_as_error(false)
            .https_only(false)
            .proxy(proxy)
            .user_agent(concat!("nodestrap/", env!("NODESTRAP_VERSION")))
            .timeout_connect(Some(CONNECT_TIMEOUT))
            .timeout_recv_response(Some(Duration::from_secs(60)))
            .timeout_per_read(Some(Duration::from_secs(60)))
            .max_redirects(5)
            // A redirect (a registry's blob in object storage) never carries our
            // `Authorization`: ureq's `SameHost` would send it to another port of the same host.
            .redirect_auth_headers(ureq::config::RedirectAuthHeaders::Never)
            .build();
        Http {
            agent: std::sync::Mutex::new(new_agent(&config, &alias)),
            config,
            alias,
            retry,
            load: std::sync::Mutex::new(Load::default()),
            handed: std::sync::Mutex::new(None),
            limits: AttemptLimits::default(),
            tls: tls.clone(),
        }
    }

    fn agent(&self) -> Agent {
        self.agent.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// A fresh agent, its predecessor's idle connections closed.
    fn renew(&self) {
        let fresh = new_agent(&self.config, &self.alias);
        *self.agent.lock().unwrap_or_else(|e| e.into_inner()) = fresh;
    }

    /// The same client with other bounds per attempt.
    pub(crate) fn with_limits(self, limits: AttemptLimits) -> Http {
        Http { limits, ..self }
    }

    /// One request that must be over, body included, within `deadline`; a response of any
    /// status is `Ok`. A read that waits a whole rate window for a byte is below any floor.
    fn call(
        &self,
        req: &Request,
        deadline: Duration,
        from: u64,
    ) -> std::result::Result<ureq::http::Response<ureq::Body>, ureq::Error> {
        let mut b = ureq::http::Request::builder()
            .method(req.method)
            .uri(req.url);
        for (k, v) in &req.headers {
            b = b.header(k.as_ref(), v.as_str());
        }
        if from > 0 {
            b = b.header("Range", format!("bytes={from}-"));
        }
        let per_read = Some(self.limits.window.min(Duration::from_secs(60)));
        let agent = self.agent();
        match &req.body {
            Some((ctype, body)) => {
                let r = b
                    .header("Content-Type", *ctype)
                    .body(body.clone())
                    .map_err(ureq::Error::Http)?;
                let r = agent
                    .configure_request(r)
                    .timeout_global(Some(deadline))
                    .timeout_per_read(per_read)
                    .build();
                agent.run(r)
            }
            None => {
                let r = agent
                    .configure_request(b.body(()).map_err(ureq::Error::Http)?)
                    .timeout_global(Some(deadline))
                    .timeout_per_read(per_read)
                    .build();
                agent.run(r)
            }
        }
    }

    /// A request whose body is read whole (at most `cap` bytes), retried as a unit.
    pub(crate) fn fetch(
        &self,
        req: &Request,
        cap: u64,
    ) -> std::result::Result<Vec<u8>, FetchError> {
        self.fetch_passing(req, cap, &[])
    }

    /// `fetch`, but an answer with a status in `pass` is handed back at once as
    /// `Failure::Passed`, for the caller's own rule (409 Conflict on a patch).
    pub(crate) fn fetch_passing(
        &self,
        req: &Request,
        cap: u64,
        pass: &[u16],
    ) -> std::result::Result<Vec<u8>, FetchError> {
        let what = format!("{} {}", req.method, req.url);
        self.retrying(&what, req.url, |deadline| {
            let mut resp = match self.call(req, deadline, 0) {
                Ok(r) => r,
                Err(e) => return classify_transport(&what, e, deadline, &self.tls),
            };
            match status_failure(&what, &mut resp) {
                None => {}
                Some(r) if pass.contains(&r.status) => return Attempt::Passed(r.status, r.error),
                Some(r) => return verdict(r),
            }
            if let Some(t) = resp.body().content_length().filter(|t| *t > cap) {
                return Attempt::Final(Error::failed(format!(
                    "{what}: response larger than the {cap}-byte limit ({t} bytes declared)"
                )));
            }
            let body = capped(&mut resp, cap);
            let mut v = Vec::new();
            match RateFloor::new(body, self.limits).read_to_end(&mut v) {
                Ok(_) => Attempt::Done(v),
                Err(e) if over_limit(&e) => Attempt::Final(Error::failed(format!(
                    "{what}: response larger than the {cap}-byte limit"
                ))),
                Err(e) => Attempt::Retry(Error::failed(format!(
                    "{what}: reading body: {}",
                    read_failure(&e, deadline)
                ))),
            }
        })
    }

    /// A request for its answer's status and one header, body dropped (a registry's `/v2/`
    /// probe and its `WWW-Authenticate`): every 2xx and 4xx answer is the result; no answer and
    /// a busy one are tried again as `fetch` tries them.
    pub(crate) fn probe(
        &self,
        req: &Request,
        header: &'static str,
    ) -> std::result::Result<(u16, Option<String>), FetchError> {
        let what = format!("{} {}", req.method, req.url);
        self.retrying(&what, req.url, |deadline| {
            let mut resp = match self.call(req, deadline, 0) {
                Ok(r) => r,
                Err(e) => return classify_transport(&what, e, deadline, &self.tls),
            };
            let status = resp.status().as_u16();
            let value = resp
                .headers()
                .get(header)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            match status_failure(&what, &mut resp) {
                Some(r) if matches!(r.status, 408 | 429 | 500..) => verdict(r),
                _ => Attempt::Done((status, value)),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn retry_after_takes_seconds_and_the_three_http_date_forms() {
        let now = std::time::UNIX_EPOCH + Duration::from_secs(784_111_777); // Sun, 06 Nov 1994 08:49:37 GMT
        let secs = |s| Some(After::Delay(Duration::from_secs(s)));
        assert_eq!(retry_after("120", now), secs(120));
        assert_eq!(retry_after(" 0 ", now), secs(0));
        for later in [
            "Sun, 06 Nov 1994 08:50:07 GMT",
            "Sunday, 06-Nov-94 08:50:07 GMT",
            "Sun Nov  6 08:50:07 1994",
        ] {
            assert_eq!(
                retry_after(later, now),
                Some(After::Date(Duration::from_secs(30))),
                "{later}"
            );
        }
        // A date already past means now; what is neither form is ignored.
        assert_eq!(
            retry_after("Sat, 05 Nov 1994 08:49:37 GMT", now),
            Some(After::Date(Duration::ZERO))
        );
        // The server's clock where it sent its Date, else this node's.
        assert_eq!(server_now(Some(" Sun, 06 Nov 1994 08:49:37 GMT")), now);
        let ours = std::time::SystemTime::now();
        assert!(server_now(Some("yesterday")) >= ours && server_now(None) >= ours);
        for bad in ["", "-5", "1.5", "soon", "Sun, 06 Nov 1994 25:00:00 GMT"] {
            assert_eq!(retry_after(bad, now), None, "{bad:?}");
        }
    }

    /// A plain-HTTP server on loopback that answers every connection with `reply`'s bytes,
    /// then (for `hold`) keeps the connection open without a word.
    fn server(reply: &'static [u8], endless: bool) -> String {
        use std::net::TcpListener;
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/x", l.local_addr().unwrap());
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(mut c) = c else { continue };
                std::thread::spawn(move || {
                    let mut req = [0u8; 4096];
                    let _ = c.read(&mut req);
                    let _ = c.write_all(reply);
                    while endless && c.write_all(&[b'x'; 4096]).is_ok() {}
                    std::thread::sleep(Duration::from_secs(30));
                });
            }
        });
        url
    }

    fn client(budget: Duration) -> Http {
        Http::new(
            &Tls::default(),
            Retry::exponential(5, Duration::from_millis(10))
                .capped_at(Duration::from_millis(10))
                .within(budget),
        )
    }

    /// A plain-HTTP server on loopback that answers the first `busy` requests 503 with
    /// `Retry-After: 1`, then 200; it counts the requests.
    fn busy_server(busy: usize) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        use std::net::TcpListener;
        use std::sync::atomic::{AtomicUsize, Ordering};
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/x", l.local_addr().unwrap());
        let seen = Arc::new(AtomicUsize::new(0));
        let count = seen.clone();
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(mut c) = c else { continue };
                let mut req = [0u8; 4096];
                let _ = c.read(&mut req);
                let reply: &[u8] = if count.fetch_add(1, Ordering::SeqCst) < busy {
                    b"HTTP/1.1 503 Busy\r\nRetry-After: 1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                } else {
                    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
                };
                let _ = c.write_all(reply);
            }
        });
        (url, seen)
    }

    #[test]
    fn busy_answers_wait_for_retry_after_and_do_not_use_up_the_attempts() {
        // One attempt without an answer allowed, three busy answers first: time, not the
        // count, bounds busy answers, and each pause lasts at least the Retry-After.
        let (url, seen) = busy_server(3);
        let http = Http::new(
            &Tls::default(),
            Retry::exponential(1, Duration::from_millis(10)).within(Duration::from_secs(30)),
        );
        let start = Instant::now();
        let body = http.fetch(&Request::get(&url), 1 << 20).unwrap();
        assert_eq!(body, b"ok");
        assert_eq!(seen.load(std::sync::atomic::Ordering::SeqCst), 4);
        assert!(
            start.elapsed() >= Duration::from_secs(3),
            "{:?}",
            start.elapsed()
        );
        // Three of the same Retry-After (a streak of 2), then an answer: the client's next
        // request starts one step lower, from what this one learned.
        let learned = format!("{:?}", *http.load.lock().unwrap());
        assert!(learned.contains("streak: 1,"), "{learned}");
    }

    #[test]
    fn a_server_busy_until_the_deadline_is_busy_not_unreachable() {
        let (url, _) = busy_server(usize::MAX);
        let http = Http::new(
            &Tls::default(),
            Retry::exponential(1, Duration::from_millis(10))
                .until(Instant::now() + Duration::from_millis(2500)),
        );
        let FetchError {
            error: e,
            class: why,
        } = http.fetch(&Request::get(&url), 1 << 20).unwrap_err();
        assert_eq!(why, Failure::Busy, "{e}");
        assert!(e.to_string().contains("HTTP 503"), "{e}");
        // Nothing listens: unreachable, after the attempts.
        let dead = format!("http://127.0.0.1:{}/x", {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        });
        let FetchError {
            error: e,
            class: why,
        } = http.fetch(&Request::get(&dead), 1 << 20).unwrap_err();
        assert_eq!(why, Failure::Unreachable, "{e}");
    }

    #[test]
    fn an_attempt_the_deadline_cuts_short_keeps_the_busy_answer_as_the_reason() {
        // The first request is answered 503 with Retry-After 1, the second never: the run's
        // deadline ends it, and the error still says the server was busy.
        use std::net::TcpListener;
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/x", l.local_addr().unwrap());
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for (i, c) in l.incoming().enumerate() {
                let Ok(mut c) = c else { continue };
                let _ = c.read(&mut [0u8; 4096]);
                if i == 0 {
                    let _ = c.write_all(b"HTTP/1.1 503 Busy\r\nRetry-After: 1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
                } else {
                    held.push(c);
                }
            }
        });
        let http = Http::new(
            &Tls::default(),
            Retry::exponential(3, Duration::from_millis(10))
                .until(Instant::now() + Duration::from_secs(5)),
        );
        let FetchError {
            error: e,
            class: why,
        } = http.fetch(&Request::get(&url), 1 << 20).unwrap_err();
        assert_eq!(why, Failure::Busy, "{e}");
        assert!(e.to_string().contains("busy: 503, Retry-After 1;"), "{e}");
    }

    #[test]
    fn the_budget_ends_an_attempt_in_progress() {
        // Headers never come; the per-read timeout (30 s) and the attempt deadline (300 s)
        // are far away: only the 1 s budget can end this.
        let url = server(b"", false);
        let start = Instant::now();
        let e = client(Duration::from_secs(1))
            .fetch(&Request::get(&url), 1 << 20)
            .unwrap_err();
        let took = start.elapsed();
        assert!(took < Duration::from_secs(5), "{took:?}: {e}");
        assert!(e.to_string().contains("giving up"), "{e}");
    }

    #[test]
    fn content_range_gives_the_first_byte_of_a_whole_range_only() {
        assert_eq!(content_range("bytes 280000-307199/307200"), Some(280_000));
        assert_eq!(content_range("bytes 0-0/*"), Some(0));
        for bad in [
            "",
            "bytes 5-4/10",
            "bytes 0-9/9",
            "bytes */10",
            "bytes=0-9/10",
            "bytes 0-9",
            "bytes -1-9/10",
            "items 0-9/10",
            "bytes 0-9/x",
        ] {
            assert_eq!(content_range(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_body_stops_at_its_declared_length_or_the_cap() {
        // More bytes than Content-Length says: the body ends where it was declared to.
        let url = server(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", true);
        let body = client(Duration::from_secs(10))
            .fetch(&Request::get(&url), 1 << 20)
            .unwrap();
        assert_eq!(body, b"hello");
        // A body of exactly the cap is within it.
        let url = server(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", false);
        let body = client(Duration::from_secs(10))
            .fetch(&Request::get(&url), 5)
            .unwrap();
        assert_eq!(body, b"hello");
        // No length and no end: refused at the caller's cap, at once and for good.
        let url = server(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n", true);
        let start = Instant::now();
        let e = client(Duration::from_secs(10))
            .fetch(&Request::get(&url), 64 << 10)
            .unwrap_err();
        assert!(
            e.to_string().contains("larger than the 65536-byte limit"),
            "{e}"
        );
        assert!(start.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn a_declared_length_over_the_cap_is_refused_before_reading() {
        let url = server(
            b"HTTP/1.1 200 OK\r\nContent-Length: 999999999\r\n\r\n",
            true,
        );
        let e = client(Duration::from_secs(10))
            .fetch(&Request::get(&url), 1 << 20)
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("larger than the 1048576-byte limit (999999999 bytes declared)"),
            "{e}"
        );
    }

    #[test]
    fn kubernetes_status_message_is_used() {
        let b = br#"{"kind":"Status","status":"Failure","message":"configmaps \"x\" is forbidden","code":403}"#;
        assert_eq!(server_message(b).unwrap(), "configmaps \"x\" is forbidden");
        assert_eq!(
            server_message(b"\n<!DOCTYPE HTML>\n<html>oops</html>\n"),
            None
        );
        assert_eq!(
            server_message(b"\nno such bucket\n").unwrap(),
            "no such bucket"
        );
    }
}
