//! HTTPS client: ureq over rustls, trust anchors we choose, retries with `curl --retry`
//! semantics (transport errors, 408, 429 and 5xx are retried; 404 and other 4xx are final),
//! exponential backoff with full jitter, size caps, and progress lines on long downloads.

use std::io::{self, Read};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::crypto::CryptoProvider;

use ureq::tls::{Certificate, ClientCert, PemItem, RootCerts, TlsConfig};
use ureq::Agent;

use crate::crypto::digest::{copy_hashing, CopyError, Digest};
use crate::error::{Error, Kind, Result};
use crate::node::root::{read_host_file, Dir, Root};

/// CA bundles of the distributions we run on; the first that exists is the system trust store.
const SYSTEM_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

/// Trust anchors and an optional client identity for one endpoint family.
#[derive(Default, Clone)]
pub struct Tls {
    pub roots: Vec<Certificate<'static>>,
    pub client: Option<ClientCert>,
    /// Where the roots came from, for the log line.
    pub sources: Vec<String>,
}

impl Tls {
    /// The system trust store: the bundle `SSL_CERT_FILE` names, else the first distribution
    /// bundle found on the node `root` (where the bundle the node's admin curates lives; in the
    /// initramfs that is `/sysroot`), else on the system we run on.
    pub fn system(root: &Root) -> Result<Tls> {
        let mut tls = Tls::default();
        if let Some(b) = std::env::var_os("SSL_CERT_FILE") {
            let b = std::path::PathBuf::from(b);
            match std::fs::read(&b) {
                Ok(pem) => tls
                    .add_pem(&pem, &b.display().to_string())
                    .map_err(|e| e.with_kind(Kind::Config))?,
                Err(e) => log::warn!("SSL_CERT_FILE {}: {e}", b.display()),
            }
            return Ok(tls);
        }
        for p in SYSTEM_BUNDLES {
            if let Some(pem) = root.read(p, 64 << 20)? {
                tls.add_pem(&pem, &root.show(p))?;
                return Ok(tls);
            }
        }
        if !root.is_host() {
            if let Some(p) = SYSTEM_BUNDLES.iter().map(Path::new).find(|p| p.exists()) {
                let pem = read_host_file(p, 64 << 20, "system CA bundle")?;
                tls.add_pem(&pem, &p.display().to_string())?;
            }
        }
        Ok(tls)
    }

    /// Add the PEM file given on the command line (`--ca-file`).
    pub fn add_file(&mut self, p: &Path, flag: &str) -> Result<()> {
        let pem = read_host_file(p, 16 << 20, flag)?;
        self.add_pem(&pem, &format!("{flag} {}", p.display()))
            .map_err(|e| e.with_kind(Kind::Config))
    }

    /// Add every certificate of a PEM bundle; it must hold at least one.
    pub fn add_pem(&mut self, pem: &[u8], name: &str) -> Result<()> {
        let before = self.roots.len();
        for item in ureq::tls::parse_pem(pem) {
            match item {
                Ok(PemItem::Certificate(c)) => self.roots.push(c),
                Ok(_) => {}
                Err(e) => return Err(Error::failed(format!("{name}: bad PEM: {e}"))),
            }
        }
        if self.roots.len() == before {
            return Err(Error::failed(format!("{name}: no PEM certificate in it")));
        }
        self.sources.push(format!(
            "{name} ({} certificates)",
            self.roots.len() - before
        ));
        Ok(())
    }
}

#[derive(Debug, Clone, Copy)]
pub enum Backoff {
    /// Full jitter: sleep a random time in [0, min(cap, initial * 2^n)).
    Exponential { initial: Duration, cap: Duration },
    /// Always the same pause (tectonic-torcx's API-server rule: 3 tries 10 s apart).
    Fixed(Duration),
}

/// When to try again. Built one way for every retrying client: `Retry::exponential` (the
/// fetcher's default, with `capped_at` and `within` to adjust) or `Retry::fixed`
/// (tectonic-torcx's API-server rule).
#[derive(Debug, Clone, Copy)]
pub struct Retry {
    pub attempts: u32,
    pub backoff: Backoff,
    /// No new attempt starts once this much time has gone by.
    pub budget: Duration,
}

impl Retry {
    /// `attempts` (at least 1), pauses with full jitter below `initial`, doubling up to 60 s;
    /// no new attempt after 600 s (`--fetch-attempts`, `--fetch-backoff-ms`).
    pub fn exponential(attempts: u32, initial: Duration) -> Retry {
        Retry {
            attempts: attempts.max(1),
            backoff: Backoff::Exponential {
                initial,
                cap: Duration::from_secs(60),
            },
            budget: Duration::from_secs(600),
        }
    }

    /// `tries` (at least 1) exactly `delay` apart, without an overall budget (`--api-tries`,
    /// `--api-retry-delay`; tectonic-torcx: 3 tries, 10 s).
    pub fn fixed(tries: u32, delay: Duration) -> Retry {
        Retry {
            attempts: tries.max(1),
            backoff: Backoff::Fixed(delay),
            budget: Duration::MAX,
        }
    }

    /// Pauses of at most `cap` (exponential backoff only).
    pub fn capped_at(mut self, cap: Duration) -> Retry {
        if let Backoff::Exponential { initial, .. } = self.backoff {
            self.backoff = Backoff::Exponential { initial, cap };
        }
        self
    }

    /// No new attempt after `budget`.
    pub fn within(mut self, budget: Duration) -> Retry {
        self.budget = budget;
        self
    }

    fn delay(&self, failures: u32) -> Duration {
        match self.backoff {
            Backoff::Fixed(d) => d,
            Backoff::Exponential { initial, cap } => {
                let ceil = initial.saturating_mul(1u32 << failures.min(20)).min(cap);
                let mut r = [0u8; 8];
                rustix::rand::getrandom(&mut r, rustix::rand::GetRandomFlags::empty()).ok();
                let frac = (u64::from_le_bytes(r) >> 11) as f64 / (1u64 << 53) as f64;
                ceil.mul_f64(frac)
            }
        }
    }
}

/// Bounds on one attempt, so that a server that trickles bytes cannot hold a run for ever
/// (curl's `--max-time`, `--speed-limit` and `--speed-time`).
#[derive(Debug, Clone, Copy)]
pub struct AttemptLimits {
    /// No attempt lasts longer, from connecting to the body's last byte. The retry budget's
    /// remainder shortens it, so the budget ends a run even in the middle of an attempt.
    pub deadline: Duration,
    /// Bytes per second that every `window` of a transfer must reach on average; 0: no floor.
    pub min_rate: u64,
    pub window: Duration,
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
    pub fn from_options(timeout: u64, min_rate: u64, window: u64) -> Result<AttemptLimits> {
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
pub const DEFAULT_ATTEMPT_SECS: u64 = 300;
pub const DEFAULT_MIN_RATE: u64 = 1024;
pub const DEFAULT_RATE_WINDOW_SECS: u64 = 30;

/// Resolves one host name as another host (`tls-server-name`): the certificate is checked
/// against the alias while the connection goes to the real server.
#[derive(Debug)]
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

/// What one attempt says about trying again.
enum Attempt<T> {
    Done(T),
    Retry(Error),
    Final(Error),
}

pub struct Http {
    agent: Agent,
    retry: Retry,
    limits: AttemptLimits,
    /// Kept to build the same client through another proxy.
    tls: Tls,
}

pub struct Request<'a> {
    pub method: &'static str,
    pub url: &'a str,
    /// Header values may be secrets: they are never logged.
    pub headers: Vec<(&'static str, String)>,
    /// Content type and body.
    pub body: Option<(&'static str, Vec<u8>)>,
}

impl<'a> Request<'a> {
    pub fn get(url: &'a str) -> Self {
        Request {
            method: "GET",
            url,
            headers: Vec::new(),
            body: None,
        }
    }
}

impl Http {
    pub fn new(tls: &Tls, retry: Retry) -> Http {
        Http::build(tls, retry, ureq::Proxy::try_from_env())
    }

    /// The same client, with `alias` resolved as `real`'s address: requests then go to `alias`,
    /// so TLS sends it as the server name and checks the certificate against it (a
    /// kubeconfig's `tls-server-name`), while the connection goes where `real` points.
    pub fn with_server_name(self, alias: &str, real: &str) -> Http {
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
    pub fn via_proxy(self, url: &str) -> Result<Http> {
        let proxy = ureq::Proxy::new(url)
            .map_err(|e| Error::config(format!("{url:?}: not a proxy URL: {e}")))?;
        let mut h = Http::build(&self.tls, self.retry, Some(proxy));
        h.limits = self.limits;
        Ok(h)
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
            .unversioned_rustls_crypto_provider(provider)
            .build();
        let agent = Agent::config_builder()
            .tls_config(tls_config)
            .http_status_as_error(false)
            .https_only(false)
            .proxy(proxy)
            .user_agent(concat!("nodestrap/", env!("CARGO_PKG_VERSION")))
            .timeout_connect(Some(Duration::from_secs(30)))
            .timeout_recv_response(Some(Duration::from_secs(60)))
            .timeout_per_read(Some(Duration::from_secs(60)))
            .max_redirects(5)
            .build();
        let agent = match alias {
            Some(a) => Agent::with_parts(
                agent,
                ureq::unversioned::transport::DefaultConnector::new(),
                a,
            ),
            None => agent.new_agent(),
        };
        Http {
            agent,
            retry,
            limits: AttemptLimits::default(),
            tls: tls.clone(),
        }
    }

    /// The same client with other bounds per attempt.
    pub fn with_limits(self, limits: AttemptLimits) -> Http {
        Http { limits, ..self }
    }

    /// Run `op` until it is done, fails for good, or attempts or time run out. `op` gets the
    /// time its attempt may take: the per-attempt deadline or what is left of the budget.
    fn retrying<T>(&self, what: &str, mut op: impl FnMut(Duration) -> Attempt<T>) -> Result<T> {
        let start = Instant::now();
        let mut n = 0;
        loop {
            n += 1;
            let left = self.retry.budget.saturating_sub(start.elapsed());
            let e = match op(self.limits.deadline.min(left)) {
                Attempt::Done(t) => return Ok(t),
                Attempt::Final(e) => return Err(e),
                Attempt::Retry(e) => e,
            };
            let delay = self.retry.delay(n - 1);
            if n >= self.retry.attempts || start.elapsed() + delay >= self.retry.budget {
                return Err(e.context(format!("{what}: giving up after {n} attempts")));
            }
            log::warn!(
                "{what}: attempt {n}/{} failed: {e}; retrying in {:.1}s",
                self.retry.attempts,
                delay.as_secs_f64()
            );
            std::thread::sleep(delay);
        }
    }

    /// One request that must be over, body included, within `deadline`; a response of any
    /// status is `Ok`. A read that waits a whole rate window for a byte is below any floor.
    fn call(
        &self,
        req: &Request,
        deadline: Duration,
    ) -> std::result::Result<ureq::http::Response<ureq::Body>, ureq::Error> {
        let mut b = ureq::http::Request::builder()
            .method(req.method)
            .uri(req.url);
        for (k, v) in &req.headers {
            b = b.header(*k, v.as_str());
        }
        let per_read = Some(self.limits.window.min(Duration::from_secs(60)));
        match &req.body {
            Some((ctype, body)) => {
                let r = b
                    .header("Content-Type", *ctype)
                    .body(body.clone())
                    .map_err(ureq::Error::Http)?;
                let r = self
                    .agent
                    .configure_request(r)
                    .timeout_global(Some(deadline))
                    .timeout_per_read(per_read)
                    .build();
                self.agent.run(r)
            }
            None => {
                let r = self
                    .agent
                    .configure_request(b.body(()).map_err(ureq::Error::Http)?)
                    .timeout_global(Some(deadline))
                    .timeout_per_read(per_read)
                    .build();
                self.agent.run(r)
            }
        }
    }

    /// A request whose body is read whole (at most `cap` bytes), retried as a unit.
    pub fn fetch(&self, req: &Request, cap: u64) -> Result<Vec<u8>> {
        self.fetch_passing(req, cap, &[])?
    }

    /// `fetch`, but an answer with a status in `pass` is handed back as the inner `Err`
    /// at once, for the caller's own retry rule (409 Conflict on a patch).
    pub fn fetch_passing(&self, req: &Request, cap: u64, pass: &[u16]) -> Result<Result<Vec<u8>>> {
        let what = format!("{} {}", req.method, req.url);
        self.retrying(&what, |deadline| {
            let mut resp = match self.call(req, deadline) {
                Ok(r) => r,
                Err(e) => return classify_transport(&what, e, deadline),
            };
            match status_failure(&what, &mut resp) {
                None => {}
                Some((status, e)) if pass.contains(&status) => return Attempt::Done(Err(e)),
                Some((status, e)) => return verdict(status, e),
            }
            if let Some(t) = resp.body().content_length().filter(|t| *t > cap) {
                return Attempt::Final(Error::failed(format!(
                    "{what}: response larger than the {cap}-byte limit ({t} bytes declared)"
                )));
            }
            let body = resp.body_mut().with_config().limit(cap).reader();
            let mut v = Vec::new();
            match RateFloor::new(body, self.limits).read_to_end(&mut v) {
                Ok(_) => Attempt::Done(Ok(v)),
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

    /// Stream `url` into a temp file in `dir` while hashing; the file becomes `name` only if
    /// the digest matches. A broken transfer is retried from scratch in a fresh temp file.
    pub fn download(
        &self,
        url: &str,
        dir: &Dir,
        name: &str,
        digest: &Digest,
        cap: u64,
    ) -> Result<u64> {
        self.stream(&Request::get(url), cap, |body, _| {
            write_verified(dir, name, digest, &mut &mut *body)
        })
    }

    /// A request whose body is handed to `consume` as it arrives (with progress lines), with
    /// its length when the server declared one:
    /// transport errors and reading failures are tried again from scratch, a digest mismatch
    /// or a write failure is final.
    pub fn stream<T>(
        &self,
        req: &Request,
        cap: u64,
        mut consume: impl FnMut(&mut dyn Read, Option<u64>) -> std::result::Result<T, Staging>,
    ) -> Result<T> {
        let what = format!("{} {}", req.method, req.url);
        self.retrying(&what, |deadline| {
            let mut resp = match self.call(req, deadline) {
                Ok(r) => r,
                Err(e) => return classify_transport(&what, e, deadline),
            };
            if let Some((status, e)) = status_failure(&what, &mut resp) {
                return verdict(status, e);
            }
            let total = resp.body().content_length();
            if let Some(t) = total.filter(|t| *t > cap) {
                return Attempt::Final(Error::failed(format!(
                    "{what}: {t} bytes is over the {cap}-byte limit"
                )));
            }
            let body = resp.body_mut().with_config().limit(cap).reader();
            let mut progress = Progress::new(RateFloor::new(body, self.limits), req.url, total);
            match consume(&mut progress, total) {
                Ok(n) => Attempt::Done(n),
                Err(Staging::Read(e)) if over_limit(&e) => Attempt::Final(Error::failed(format!(
                    "{what}: body over the {cap}-byte limit"
                ))),
                Err(Staging::Read(e)) => Attempt::Retry(Error::failed(format!(
                    "{what}: reading body: {}",
                    read_failure(&e, deadline)
                ))),
                Err(Staging::Write(e)) => Attempt::Final(e),
                // The bytes arrived intact over TLS, so trying again would fetch the same ones.
                Err(Staging::Mismatch(got, want)) => Attempt::Final(Error::failed(format!(
                    "{what}: hash mismatch: computed {got} but {want}"
                ))),
            }
        })
    }
}

/// ureq's own words for a timeout ("timeout: global") say too little to an operator.
fn timeout_words(t: &ureq::Timeout, deadline: Duration) -> String {
    match t {
        ureq::Timeout::Global => format!(
            "the attempt's deadline of {:.0} s passed (--fetch-timeout, or the end of the retry budget)",
            deadline.as_secs_f64()
        ),
        ureq::Timeout::PerRead => "no byte arrived for a whole rate window (--fetch-min-rate-window)".into(),
        t => format!("timeout ({t})"),
    }
}

fn read_failure(e: &io::Error, deadline: Duration) -> String {
    match e.get_ref().and_then(|i| i.downcast_ref::<ureq::Error>()) {
        Some(ureq::Error::Timeout(t)) => timeout_words(t, deadline),
        _ => e.to_string(),
    }
}

fn classify_transport<T>(what: &str, e: ureq::Error, deadline: Duration) -> Attempt<T> {
    let msg = match &e {
        ureq::Error::Timeout(t) => format!("{what}: {}", timeout_words(t, deadline)),
        e => format!("{what}: {e}"),
    };
    match e {
        ureq::Error::BadUri(_)
        | ureq::Error::Http(_)
        | ureq::Error::RequireHttpsOnly(_)
        | ureq::Error::InvalidProxyUrl
        | ureq::Error::TooManyRedirects
        | ureq::Error::RedirectFailed
        | ureq::Error::Pem(_) => Attempt::Final(Error::failed(msg)),
        // A certificate the trust anchors reject will not become trusted by asking again.
        ureq::Error::Io(ref io) if io.to_string().contains("invalid peer certificate") => {
            Attempt::Final(Error::failed(msg))
        }
        ureq::Error::Rustls(rustls::Error::InvalidCertificate(_)) => {
            Attempt::Final(Error::failed(msg))
        }
        _ => Attempt::Retry(Error::failed(msg)),
    }
}

/// `None` for 2xx; otherwise the status and an error with the server's own message.
fn status_failure(what: &str, resp: &mut ureq::http::Response<ureq::Body>) -> Option<(u16, Error)> {
    let status = resp.status();
    if status.is_success() {
        return None;
    }
    let body = resp
        .body_mut()
        .with_config()
        .limit(64 << 10)
        .read_to_vec()
        .unwrap_or_default();
    let detail = server_message(&body);
    let msg = format!(
        "{what}: HTTP {}{}",
        status,
        detail.map(|d| format!(": {d}")).unwrap_or_default()
    );
    Some((status.as_u16(), Error::failed(msg)))
}

/// `curl --retry`: 408, 429 and 5xx may pass; other statuses are final.
fn verdict<T>(status: u16, e: Error) -> Attempt<T> {
    if status == 408 || status == 429 || status >= 500 {
        Attempt::Retry(e)
    } else {
        Attempt::Final(e)
    }
}

/// The Kubernetes `Status.message` of an error body, or its first line of text.
pub fn server_message(body: &[u8]) -> Option<String> {
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) {
        if let Some(m) = v.get("message").and_then(|m| m.as_str()) {
            return Some(m.to_string());
        }
    }
    let text = String::from_utf8_lossy(body);
    let line = text.lines().map(str::trim).find(|l| !l.is_empty())?;
    Some(line.chars().take(200).collect())
}

/// rustls on ring, every connection's: the default provider's key exchange groups, signature
/// algorithms and AES-GCM suites (TLS 1.3 and 1.2), without ChaCha20-Poly1305. Every TLS server
/// offers AES-GCM, and the ChaCha20 code (for CPUs without AES instructions) costs about 30 KB of
/// the 4 MiB budget; built field by field so the default suite list is never linked.
pub fn tls_provider() -> Arc<CryptoProvider> {
    use rustls::crypto::ring::cipher_suite as cs;
    Arc::new(CryptoProvider {
        cipher_suites: vec![
            cs::TLS13_AES_256_GCM_SHA384,
            cs::TLS13_AES_128_GCM_SHA256,
            cs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
            cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
            cs::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
            cs::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
        ],
        kx_groups: rustls::crypto::ring::ALL_KX_GROUPS.to_vec(),
        signature_verification_algorithms: SIG_ALGS,
        secure_random: &RingRandom,
        key_provider: &RingKeys,
    })
}

#[derive(Debug)]
struct RingRandom;

impl rustls::crypto::SecureRandom for RingRandom {
    fn fill(&self, buf: &mut [u8]) -> std::result::Result<(), rustls::crypto::GetRandomFailed> {
        use ring::rand::SecureRandom as _;
        ring::rand::SystemRandom::new()
            .fill(buf)
            .map_err(|_| rustls::crypto::GetRandomFailed)
    }
}

#[derive(Debug)]
struct RingKeys;

impl rustls::crypto::KeyProvider for RingKeys {
    fn load_private_key(
        &self,
        key: rustls::pki_types::PrivateKeyDer<'static>,
    ) -> std::result::Result<Arc<dyn rustls::sign::SigningKey>, rustls::Error> {
        rustls::crypto::ring::sign::any_supported_type(&key)
    }
}

/// The certificate signature algorithms webpki has on ring, by TLS signature scheme (the same
/// table rustls's ring provider uses).
static SIG_ALGS: rustls::crypto::WebPkiSupportedAlgorithms = {
    use rustls::SignatureScheme as S;
    use webpki::ring as w;
    rustls::crypto::WebPkiSupportedAlgorithms {
        all: &[
            w::ECDSA_P256_SHA256,
            w::ECDSA_P256_SHA384,
            w::ECDSA_P384_SHA256,
            w::ECDSA_P384_SHA384,
            w::ED25519,
            w::RSA_PSS_2048_8192_SHA256_LEGACY_KEY,
            w::RSA_PSS_2048_8192_SHA384_LEGACY_KEY,
            w::RSA_PSS_2048_8192_SHA512_LEGACY_KEY,
            w::RSA_PKCS1_2048_8192_SHA256,
            w::RSA_PKCS1_2048_8192_SHA384,
            w::RSA_PKCS1_2048_8192_SHA512,
            w::RSA_PKCS1_2048_8192_SHA256_ABSENT_PARAMS,
            w::RSA_PKCS1_2048_8192_SHA384_ABSENT_PARAMS,
            w::RSA_PKCS1_2048_8192_SHA512_ABSENT_PARAMS,
        ],
        mapping: &[
            // TLS 1.2 does not tie the curve to the scheme; TLS 1.3 does.
            (
                S::ECDSA_NISTP384_SHA384,
                &[w::ECDSA_P384_SHA384, w::ECDSA_P256_SHA384],
            ),
            (
                S::ECDSA_NISTP256_SHA256,
                &[w::ECDSA_P256_SHA256, w::ECDSA_P384_SHA256],
            ),
            (S::ED25519, &[w::ED25519]),
            (S::RSA_PSS_SHA512, &[w::RSA_PSS_2048_8192_SHA512_LEGACY_KEY]),
            (S::RSA_PSS_SHA384, &[w::RSA_PSS_2048_8192_SHA384_LEGACY_KEY]),
            (S::RSA_PSS_SHA256, &[w::RSA_PSS_2048_8192_SHA256_LEGACY_KEY]),
            (S::RSA_PKCS1_SHA512, &[w::RSA_PKCS1_2048_8192_SHA512]),
            (S::RSA_PKCS1_SHA384, &[w::RSA_PKCS1_2048_8192_SHA384]),
            (S::RSA_PKCS1_SHA256, &[w::RSA_PKCS1_2048_8192_SHA256]),
        ],
    }
};

pub enum Staging {
    /// Reading the source failed (for a download: worth another attempt).
    Read(io::Error),
    /// Creating, writing or persisting the file failed.
    Write(Error),
    /// The content is not what the digest says: the computed digest, and what was expected
    /// from where (`the signed manifest says sha512-…`).
    Mismatch(String, String),
}

/// Stream `r` into a temp file in `dir` while hashing; only content that matches `digest` is
/// fsynced and renamed to `name`. Otherwise the temp file is removed and `name` is untouched.
pub fn write_verified(
    dir: &Dir,
    name: &str,
    digest: &Digest,
    r: &mut impl Read,
) -> std::result::Result<u64, Staging> {
    let mut tmp = dir.create_temp(name, 0o644).map_err(Staging::Write)?;
    let mut hasher = digest.hasher();
    let n = match copy_hashing(r, &mut hasher, tmp.file()) {
        Ok(n) => n,
        Err(CopyError::Read(e)) => return Err(Staging::Read(e)),
        Err(CopyError::Write(e)) => {
            return Err(Staging::Write(Error::from(e).context(dir.show(name))))
        }
    };
    let got = hasher.finish_hex();
    if got != digest.hex {
        return Err(Staging::Mismatch(
            format!("{}-{got}", digest.algo_name()),
            format!("the signed manifest says {digest}"),
        ));
    }
    tmp.persist().map_err(Staging::Write)?;
    Ok(n)
}

fn over_limit(e: &io::Error) -> bool {
    e.get_ref()
        .and_then(|i| i.downcast_ref::<ureq::Error>())
        .is_some_and(|u| matches!(u, ureq::Error::BodyExceedsLimit(_)))
}

/// Fails a transfer whose average rate over a whole window falls below the floor: one byte
/// every few seconds keeps each read alive, so the per-read timeout alone cannot catch it.
pub struct RateFloor<R> {
    inner: R,
    limits: AttemptLimits,
    window_start: Instant,
    in_window: u64,
}

impl<R> RateFloor<R> {
    pub fn new(inner: R, limits: AttemptLimits) -> Self {
        RateFloor {
            inner,
            limits,
            window_start: Instant::now(),
            in_window: 0,
        }
    }
}

impl<R: Read> Read for RateFloor<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.in_window += n as u64;
        let w = self.limits.window;
        let elapsed = self.window_start.elapsed();
        if n > 0 && self.limits.min_rate > 0 && elapsed >= w {
            let need = (self.limits.min_rate as f64 * elapsed.as_secs_f64()) as u64;
            if self.in_window < need {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "transfer slower than {} bytes/s ({} bytes in {:.0} s)",
                        self.limits.min_rate,
                        self.in_window,
                        elapsed.as_secs_f64()
                    ),
                ));
            }
            self.window_start = Instant::now();
            self.in_window = 0;
        }
        Ok(n)
    }
}

/// Logs a progress line every few seconds on long downloads, and a summary when one was shown.
pub struct Progress<R> {
    inner: R,
    label: String,
    total: Option<u64>,
    done: u64,
    start: Instant,
    last: Instant,
    /// Progress lines shown so far; `None` once the summary is out.
    shown: Option<u32>,
}

const PROGRESS_EVERY: Duration = Duration::from_secs(5);

impl<R> Progress<R> {
    pub fn new(inner: R, label: &str, total: Option<u64>) -> Self {
        let now = Instant::now();
        Progress {
            inner,
            label: label.to_string(),
            total,
            done: 0,
            start: now,
            last: now,
            shown: Some(0),
        }
    }

    fn line(&self, verb: &str) {
        let secs = self.start.elapsed().as_secs_f64().max(1e-3);
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        let pct = match self.total {
            Some(t) if t > 0 => format!(" of {:.1} MiB ({}%)", mib(t), self.done * 100 / t),
            _ => String::new(),
        };
        log::info!(
            "{verb} {}: {:.1} MiB{pct} at {:.1} MiB/s",
            self.label,
            mib(self.done),
            mib(self.done) / secs
        );
    }
}

impl<R: Read> Read for Progress<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.done += n as u64;
        match self.shown {
            Some(k) if n == 0 => {
                if k > 0 {
                    self.line("downloaded");
                }
                self.shown = None;
            }
            Some(k) if self.last.elapsed() >= PROGRESS_EVERY => {
                self.last = Instant::now();
                self.line("downloading");
                self.shown = Some(k + 1);
            }
            _ => {}
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    #[test]
    fn full_jitter_stays_under_the_cap() {
        let r = Retry {
            attempts: 10,
            backoff: Backoff::Exponential {
                initial: Duration::from_secs(1),
                cap: Duration::from_secs(60),
            },
            budget: Duration::from_secs(600),
        };
        for n in 0..12 {
            let d = r.delay(n);
            assert!(
                d <= Duration::from_secs(60).min(Duration::from_secs(1 << n)),
                "{n}: {d:?}"
            );
        }
        // Random, not zero: 200 draws under a 60 s ceiling average near 30 s.
        let mean = (0..200).map(|_| r.delay(10).as_secs_f64()).sum::<f64>() / 200.0;
        assert!((20.0..40.0).contains(&mean), "mean {mean}");
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
            Retry {
                attempts: 5,
                backoff: Backoff::Exponential {
                    initial: Duration::from_millis(10),
                    cap: Duration::from_millis(10),
                },
                budget,
            },
        )
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
    fn a_body_stops_at_its_declared_length_or_the_cap() {
        // More bytes than Content-Length says: the body ends where it was declared to.
        let url = server(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", true);
        let body = client(Duration::from_secs(10))
            .fetch(&Request::get(&url), 1 << 20)
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
            server_message(b"\n<html>oops</html>\n").unwrap(),
            "<html>oops</html>"
        );
    }
}
