//! An OCI registry as a release directory (docs/oci.md): the distribution API's minimum, done
//! the way the kubelet's containerd does it. A repository holds one artifact per file of the
//! directory, tagged with the file's name; trust never comes from the registry: the signed list
//! is checked by its OpenPGP signature, and every image is fetched as a blob by the digest the
//! signed list names, so a tag the registry moved is never followed.
//!
//! Auth: the `/v2/` probe's `WWW-Authenticate` says none, Basic or Bearer; credentials come from
//! a Docker `config.json` (`auths`), the file the kubelet reads for image pulls; a Bearer token
//! is asked for per repository with `pull` scope and kept until its `expires_in`. Credentials
//! and tokens go in headers only, which are never logged. A redirect (a blob served from object
//! storage) is followed without the `Authorization` header (ureq's default, kept here).

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde::Deserialize;

use crate::crypto::digest::{sha256, Algo, Digest};
use crate::error::{Error, Result};
use crate::net::fetch::{Failure, FetchError, Http, Request};
use crate::net::kubeconfig::client_cert;
use crate::net::mirrors::{self, Endpoint, Scheme};
use crate::net::retry::Retry;
use crate::node::dir::Dir;
use crate::node::root::Root;
use crate::node::verified::{BodySink, Written};

/// nodestrap's artifact type: one file of a release directory.
pub const ARTIFACT_TYPE: &str = "application/vnd.nodestrap.file.v1";
pub const MANIFEST_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
pub const INDEX_TYPE: &str = "application/vnd.oci.image.index.v1+json";
pub const TITLE: &str = "org.opencontainers.image.title";
/// A manifest is small; one larger than this is not one of ours.
const MANIFEST_CAP: u64 = 1 << 20;
/// A Docker config.json with many registries is still small.
pub const AUTH_FILE_CAP: u64 = 1 << 20;
const TOKEN_CAP: u64 = 64 << 10;
/// The distribution spec's default when a token answer has no `expires_in`.
const TOKEN_DEFAULT_SECS: u64 = 60;
/// A token this close to its end is asked for again rather than sent.
const TOKEN_MARGIN: Duration = Duration::from_secs(5);

/// `oci://HOST[:PORT]/REPO/`: a repository standing for a release directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    /// `host` or `host:port`, as it is written in credentials and `hosts.toml`.
    pub host: String,
    pub repo: String,
}

impl Location {
    /// `Some` for an `oci://` directory URL (a trailing slash allowed), `None` for any other
    /// scheme; an `oci://` URL that is not a valid reference is an error naming the rule.
    pub fn parse_dir(url: &str) -> Result<Option<Location>> {
        let Some(rest) = url.strip_prefix("oci://") else {
            return Ok(None);
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        let bad = |why: &str| Err(Error::config(format!("{url:?}: {why}")));
        let Some((host, repo)) = rest.split_once('/') else {
            return bad("an OCI location is oci://HOST[:PORT]/REPOSITORY");
        };
        let (name, port) = match host.rsplit_once(':') {
            Some((n, p)) => (n, Some(p)),
            None => (host, None),
        };
        let name_ok = !name.is_empty()
            && name.len() <= 253
            && name.split('.').all(|l| {
                !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            });
        if !name_ok {
            return bad(
                "the registry must be a host name or an IPv4 address, with an optional :PORT",
            );
        }
        if port.is_some_and(|p| p.parse::<u16>().map_or(true, |p| p == 0)) {
            return bad("the registry's port must be 1 to 65535");
        }
        if repo.len() > 255 || !repo.split('/').all(repo_component) {
            return bad(
                "a repository is lowercase path components of [a-z0-9] joined by '.', '_', '__' or dashes, separated by '/' (the distribution spec's grammar), at most 255 characters",
            );
        }
        Ok(Some(Location {
            host: host.to_string(),
            repo: repo.to_string(),
        }))
    }

    /// What a file of this repository is called in logs and errors, and in the node's records.
    pub fn show(&self, file: &str) -> String {
        format!("oci://{}/{}:{file}", self.host, self.repo)
    }
}

/// `oci://HOST[:PORT]/REPOSITORY@sha256:<hex>`: one artifact pinned by its manifest's digest (a
/// torcx manifest's location). Signed in the list that names it, so no tag is ever resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    pub loc: Location,
    pub manifest: Digest,
}

impl Reference {
    /// `Some` for an `oci://` URL, `None` for any other scheme; an `oci://` URL that is not a
    /// digest-pinned reference is an error naming the rule.
    pub fn parse(url: &str) -> Result<Option<Reference>> {
        if !url.starts_with("oci://") {
            return Ok(None);
        }
        let Some((at, digest)) = url.rsplit_once('@') else {
            return Err(Error::config(format!(
                "{url:?}: an OCI location here is pinned by digest: oci://HOST[:PORT]/REPOSITORY@sha256:<64 hex> (a tag would be resolved by the registry)"
            )));
        };
        let manifest = oci_digest(digest)
            .ok_or_else(|| Error::config(format!("{url:?}: {digest:?} is not sha256:<64 hex>")))?;
        let loc = Location::parse_dir(at)?.ok_or_else(|| {
            Error::config(format!(
                "{url:?}: not oci://HOST[:PORT]/REPOSITORY@sha256:<hex>"
            ))
        })?;
        if at.ends_with('/') {
            return Err(Error::config(format!("{url:?}: a slash before the digest")));
        }
        Ok(Some(Reference { loc, manifest }))
    }
}

/// `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*`
fn repo_component(c: &str) -> bool {
    let b = c.as_bytes();
    let alnum = |x: u8| x.is_ascii_lowercase() || x.is_ascii_digit();
    if b.is_empty() || !alnum(b[0]) || !alnum(b[b.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if alnum(b[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && !alnum(b[i]) {
            i += 1;
        }
        let sep = &c[start..i];
        if !(sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|x| x == b'-')) {
            return false;
        }
    }
    true
}

/// An image name's repository part as container tools read it: `[HOST[:PORT]/]PATH`, or a host
/// alone (kubeadm's `imageRepository` puts `/kube-apiserver` after it). The first part is a host
/// when it holds a dot or a port, or is `localhost`.
pub fn image_repository(s: &str) -> bool {
    let mut parts = s.split('/');
    let first = parts.next().unwrap_or("");
    let host = first.contains(['.', ':']) || first == "localhost";
    let first_ok = if host {
        let (h, port) = first.split_once(':').unwrap_or((first, "1"));
        (h.parse::<std::net::Ipv4Addr>().is_ok() || crate::net::names::dns_subdomain(h))
            && port.parse::<u16>().is_ok_and(|p| p > 0)
    } else {
        repo_component(first)
    };
    s.len() <= 255 && first_ok && parts.all(repo_component)
}

/// `[A-Za-z0-9_][A-Za-z0-9._-]{0,127}`: an image tag.
pub fn image_tag(t: &str) -> bool {
    let b = t.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && (b[0].is_ascii_alphanumeric() || b[0] == b'_')
        && b[1..]
            .iter()
            .all(|x| x.is_ascii_alphanumeric() || matches!(x, b'.' | b'_' | b'-'))
}

/// A file's tag: its name, which must be a valid tag; every name nodestrap reads from a release
/// directory is one.
fn tag(file: &str) -> Result<&str> {
    if image_tag(file) {
        Ok(file)
    } else {
        Err(Error::failed(format!(
            "{file:?} cannot be an OCI tag ([A-Za-z0-9_][A-Za-z0-9._-], at most 128): it cannot come from a registry"
        )))
    }
}

/// Credentials per registry from a Docker `config.json`: `{"auths": {"HOST[:PORT]": {"auth":
/// base64("user:password")}}}`, or `username` and `password` in place of `auth`. Keys written as
/// URLs (`https://host/v1/`) count for their host. Never printed.
#[derive(Default)]
pub struct Auths {
    pub(crate) entries: Vec<(String, String, String)>,
    /// Each entry's key in `auths` as the file writes it, for messages.
    keys: Vec<String>,
    /// Where they came from, for messages.
    pub from: String,
}

impl std::fmt::Debug for Auths {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Auths({} registries from {})",
            self.entries.len(),
            self.from
        )
    }
}

#[derive(Deserialize)]
struct ConfigJson {
    #[serde(default)]
    auths: std::collections::BTreeMap<String, AuthEntry>,
}

#[derive(Deserialize)]
struct AuthEntry {
    auth: Option<String>,
    username: Option<String>,
    password: Option<String>,
}

impl Auths {
    pub fn parse(data: &[u8], from: &str) -> Result<Auths> {
        let c: ConfigJson = serde_json::from_slice(data).map_err(|e| {
            Error::config(format!(
                "{from}: not a Docker config.json ({{\"auths\": {{\"HOST\": {{\"auth\": ...}}}}}}): {e}"
            ))
        })?;
        let (mut entries, mut keys) = (Vec::new(), Vec::new());
        for (key, e) in c.auths {
            let host = key
                .strip_prefix("https://")
                .or_else(|| key.strip_prefix("http://"))
                .unwrap_or(&key);
            let host = host.split('/').next().unwrap_or_default().to_string();
            let (user, pass) = match (e.auth, e.username, e.password) {
                (Some(a), _, _) if !a.is_empty() => {
                    let raw = base64::engine::general_purpose::STANDARD
                        .decode(a.trim())
                        .ok()
                        .and_then(|b| String::from_utf8(b).ok());
                    match raw.as_deref().and_then(|r| r.split_once(':')) {
                        Some((u, p)) => (u.to_string(), p.to_string()),
                        None => {
                            return Err(Error::config(format!(
                                "{from}: auths.{key}.auth is not base64 of USER:PASSWORD"
                            )))
                        }
                    }
                }
                (_, Some(u), Some(p)) => (u, p),
                // An entry with neither (a credential helper's placeholder) gives nothing.
                _ => continue,
            };
            entries.push((host, user, pass));
            keys.push(key);
        }
        Ok(Auths {
            entries,
            keys,
            from: from.to_string(),
        })
    }

    pub(crate) fn basic(&self, host: &str) -> Option<String> {
        self.entries
            .iter()
            .find(|(h, _, _)| h == host)
            .map(|(_, u, p)| {
                let b = base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"));
                format!("Basic {b}")
            })
    }

    /// Which credentials `basic(host)` gives, for a message: `auths entry KEY in FILE`, or
    /// that there are none for `host`. Never the secret.
    fn entry(&self, host: &str) -> std::result::Result<String, String> {
        match self.entries.iter().position(|(h, _, _)| h == host) {
            Some(i) => Ok(format!("auths entry {} in {}", self.keys[i], self.from)),
            None if self.from.is_empty() => Err(format!(
                "give --registry-auth, a Docker config.json with an auths entry for {host}"
            )),
            None => Err(format!("{} has no auths entry for {host}", self.from)),
        }
    }
}

/// What a registry's `/v2/` answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Challenge {
    Open,
    Basic,
    Bearer {
        realm: String,
        service: Option<String>,
    },
}

/// `WWW-Authenticate: Bearer realm="…",service="…"` or `Basic realm="…"`.
pub(crate) fn parse_challenge(v: &str) -> Option<Challenge> {
    let (scheme, params) = v.trim().split_once(' ').unwrap_or((v.trim(), ""));
    let mut realm = None;
    let mut service = None;
    let mut rest = params.trim();
    while !rest.is_empty() {
        let (k, after) = rest.split_once('=')?;
        let after = after.trim_start();
        // A quoted string without escapes or control characters, or an RFC 9110 token.
        let (val, next) = if let Some(q) = after.strip_prefix('"') {
            let end = q.find('"')?;
            (&q[..end], &q[end + 1..])
        } else {
            let (v, n) = after.split_once(',').map_or((after, ""), |(a, b)| (a, b));
            let v = v.trim_end();
            let tchar = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
            if !v.bytes().all(tchar) {
                return None;
            }
            (v, n)
        };
        if val.bytes().any(|b| b == b'\\' || b.is_ascii_control()) {
            return None;
        }
        match k.trim().to_ascii_lowercase().as_str() {
            "realm" => realm = Some(val.to_string()),
            "service" => service = Some(val.to_string()),
            _ => {}
        }
        rest = next.trim_start().trim_start_matches(',').trim_start();
    }
    match scheme.to_ascii_lowercase().as_str() {
        "basic" => Some(Challenge::Basic),
        "bearer" => Some(Challenge::Bearer {
            realm: realm?,
            service,
        }),
        _ => None,
    }
}

#[derive(Deserialize)]
struct TokenAnswer {
    token: Option<String>,
    access_token: Option<String>,
    expires_in: Option<u64>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Manifest {
    schema_version: u32,
    media_type: Option<String>,
    artifact_type: Option<String>,
    #[serde(default)]
    layers: Vec<Descriptor>,
}

#[derive(Deserialize)]
pub(crate) struct Descriptor {
    pub(crate) digest: String,
    pub(crate) size: u64,
    #[serde(default)]
    pub(crate) annotations: std::collections::BTreeMap<String, String>,
}

impl Descriptor {
    /// Its digest, if it is at most `cap` bytes and a `sha256:<hex>` digest; `shown` names the
    /// file in the error.
    fn checked(&self, cap: u64, shown: &str) -> std::result::Result<Digest, FetchError> {
        let final_ = |why: String| FetchError::new(Failure::Final, Error::failed(why));
        if self.size > cap {
            return Err(final_(format!(
                "{shown}: {} bytes is over the {cap}-byte limit",
                self.size
            )));
        }
        oci_digest(&self.digest).ok_or_else(|| {
            final_(format!(
                "{shown}: layer digest {:?} is not sha256:<64 hex>",
                self.digest
            ))
        })
    }
}

/// A `sha256:<hex>` digest (the only algorithm registries must support).
fn oci_digest(s: &str) -> Option<Digest> {
    let hex = s.strip_prefix("sha256:")?;
    Digest::parse(&format!("sha256-{hex}"))
}

fn oci_name(d: &Digest) -> String {
    format!("{}:{}", d.algo_name(), d.hex)
}

/// Where a run's registries' mirrors are configured: containerd's `config_path` on the node.
pub struct Mirrors<'a> {
    pub root: &'a Root,
    /// A node path; empty for none.
    pub config_path: String,
}

/// One host of a registry (`net::mirrors`) and the client that reaches it.
struct Reach {
    ep: Endpoint,
    /// Its own: a mirror's (one attempt, then the next host) or a host with its own TLS
    /// settings; `None`: the run's client.
    http: Option<Http>,
}

/// The registry client of one run: each registry's hosts read once, each host probed once,
/// each repository's token kept until it ends.
pub struct Client<'a> {
    http: &'a Http,
    auths: Auths,
    mirrors: Mirrors<'a>,
    hosts: RefCell<Vec<(String, Rc<Vec<Reach>>)>>,
    challenges: RefCell<Vec<(String, Challenge)>>,
    tokens: RefCell<Vec<(String, String, Instant)>>,
}

/// What a host is asked to do: `Resolve` a tag (trusted: only hosts with that capability), or
/// `Pull` a blob by digest.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Resolve,
    Pull,
}

impl<'a> Client<'a> {
    pub fn new(http: &'a Http, auths: Auths, mirrors: Mirrors<'a>) -> Self {
        Client {
            http,
            auths,
            mirrors,
            hosts: RefCell::default(),
            challenges: RefCell::default(),
            tokens: RefCell::default(),
        }
    }

    /// The run's https client.
    pub fn http(&self) -> &'a Http {
        self.http
    }

    /// The hosts of `loc`'s registry, mirrors first (hosts.toml), each with its client.
    fn hosts(&self, loc: &Location) -> Result<Rc<Vec<Reach>>> {
        if let Some((_, h)) = self.hosts.borrow().iter().find(|(r, _)| *r == loc.host) {
            return Ok(h.clone());
        }
        let root = self.mirrors.root;
        let (eps, file) = mirrors::endpoints(root, &self.mirrors.config_path, &loc.host)?;
        let mut reaches = Vec::new();
        for ep in eps {
            let tls = if ep.own_tls() {
                let mut tls = self.http.tls().clone();
                for ca in &ep.ca {
                    let pem = root
                        .read(ca, 16 << 20)?
                        .ok_or_else(|| Error::config(format!("{}: no such file", root.show(ca))))?;
                    tls.add_pem(&pem, &root.show(ca))?;
                }
                if let Some((cert, key)) = &ep.client {
                    let read = |p: &str| {
                        root.read(p, 1 << 20)?
                            .ok_or_else(|| Error::config(format!("{}: no such file", root.show(p))))
                    };
                    let c = read(cert)?;
                    let k = match key {
                        Some(k) => read(k)?,
                        None => c.clone(),
                    };
                    tls.client = Some(client_cert(&c, &k, &root.show(cert))?);
                }
                Some(tls)
            } else {
                None
            };
            let http = match (ep.mirror, tls) {
                // A mirror that is down costs one attempt, not the retry budget: the next
                // host is there for it.
                (true, tls) => Some(self.http.derived(
                    tls.as_ref().unwrap_or(self.http.tls()),
                    Retry {
                        attempts: 1,
                        busy_attempts: 1,
                        ..self.http.retry()
                    },
                )),
                (false, Some(tls)) => Some(self.http.derived(&tls, self.http.retry())),
                (false, None) => None,
            };
            reaches.push(Reach { ep, http });
        }
        if let Some(file) = file {
            let list: Vec<String> = reaches
                .iter()
                .map(|r| {
                    let c = r.ep.caps;
                    let caps = match (c.pull, c.resolve) {
                        (true, true) => "pull, resolve",
                        (true, false) => "pull",
                        (false, true) => "resolve",
                        (false, false) => "neither pull nor resolve",
                    };
                    format!("{} ({caps})", r.ep.shown())
                })
                .collect();
            crate::info!(
                "registry {}: hosts from {file}: {}",
                loc.host,
                list.join(", then ")
            );
        }
        let reaches = Rc::new(reaches);
        self.hosts
            .borrow_mut()
            .push((loc.host.clone(), reaches.clone()));
        Ok(reaches)
    }

    /// `try_host` on each host of `loc` that may do `op`, in order, until one answers: a
    /// mirror's failure (a 404 too) passes to the next host, the last host's is the answer.
    fn first_host<T>(
        &self,
        loc: &Location,
        op: Op,
        try_host: &mut dyn FnMut(&Reach) -> std::result::Result<T, FetchError>,
    ) -> std::result::Result<T, FetchError> {
        let hosts = self
            .hosts(loc)
            .map_err(|e| FetchError::new(Failure::Final, e))?;
        let mut last = None;
        for r in hosts.iter().filter(|r| match op {
            Op::Resolve => r.ep.caps.resolve,
            Op::Pull => r.ep.caps.pull,
        }) {
            match try_host(r) {
                Err(e) if r.ep.mirror => {
                    match e.class {
                        Failure::Passed(_) => {
                            crate::info!("{}: {e}; trying the next host", r.ep.shown())
                        }
                        _ => crate::warn!("{}: {e}; trying the next host", r.ep.shown()),
                    }
                    last = Some(e);
                }
                done => return done,
            }
        }
        Err(last.unwrap_or_else(|| {
            FetchError::new(
                Failure::Final,
                Error::config(format!(
                    "registry {}: no host may {} (capabilities in its hosts.toml)",
                    loc.host,
                    match op {
                        Op::Resolve => "resolve a tag",
                        Op::Pull => "pull a blob",
                    }
                )),
            )
        }))
    }

    fn challenge(&self, r: &Reach) -> Result<Challenge> {
        let key = r.ep.root();
        if let Some((_, c)) = self.challenges.borrow().iter().find(|(h, _)| *h == key) {
            return Ok(c.clone());
        }
        let url = format!("{key}/");
        let mut req = Request::get(&url);
        push_headers(&mut req, &r.ep);
        let (status, header) = r.client(self.http).probe(&req, "www-authenticate")?;
        let c = match status {
            200..=299 => Challenge::Open,
            401 => header.as_deref().and_then(parse_challenge).ok_or_else(|| {
                Error::failed(format!(
                    "GET {url}: HTTP 401 without a WWW-Authenticate header nodestrap understands (Basic, or Bearer with a realm)"
                ))
            })?,
            s => {
                return Err(Error::failed(format!(
                    "GET {url}: HTTP {s}: not an OCI registry (the distribution API answers 200 or 401 there)"
                )))
            }
        };
        let how = match &c {
            Challenge::Open => "no credentials".to_string(),
            Challenge::Basic => "Basic credentials".to_string(),
            Challenge::Bearer { realm, .. } => format!("Bearer tokens from {realm}"),
        };
        crate::info!("{}: asks for {how} (GET {url})", r.ep.shown());
        self.challenges.borrow_mut().push((key, c.clone()));
        Ok(c)
    }

    /// The `Authorization` header for pulling `loc`'s repository from host `r`, if it asks
    /// for one; credentials are looked up by the host's name.
    fn authorization(&self, r: &Reach, loc: &Location, fresh: bool) -> Result<Option<String>> {
        let challenge = self.challenge(r)?;
        if challenge != Challenge::Open && r.ep.scheme == Scheme::Http {
            return Err(Error::failed(format!(
                "{}: asks for credentials over plain http: none are sent there",
                r.ep.shown()
            )));
        }
        match challenge {
            Challenge::Open => Ok(None),
            Challenge::Basic => match self.auths.entry(&r.ep.host) {
                Ok(_) => Ok(self.auths.basic(&r.ep.host)),
                Err(why) => Err(Error::failed(format!(
                    "{} asks for credentials: {why}",
                    r.ep.shown()
                ))),
            },
            Challenge::Bearer { realm, service } => {
                let t = self.token(r, loc, fresh, &realm, service.as_deref())?;
                Ok(Some(format!("Bearer {t}")))
            }
        }
    }

    /// A pull token for `loc`'s repository on host `r` from its token endpoint `realm`: the one
    /// kept unless `fresh` or about to end, else a new one, asked for with the host's Basic
    /// credentials (anonymously without any).
    fn token(
        &self,
        r: &Reach,
        loc: &Location,
        fresh: bool,
        realm: &str,
        service: Option<&str>,
    ) -> Result<String> {
        let key = format!("{} {}", r.ep.root(), loc.repo);
        let now = Instant::now();
        if !fresh {
            let kept = self.tokens.borrow().iter().find_map(|(k, t, until)| {
                (*k == key && now + TOKEN_MARGIN < *until).then(|| t.clone())
            });
            if let Some(t) = kept {
                return Ok(t);
            }
        }
        if !realm.starts_with("https://") {
            return Err(Error::failed(format!(
                "{}: its token realm {realm:?} is not https: credentials are not sent there",
                r.ep.shown()
            )));
        }
        let mut url = format!(
            "{realm}{}scope={}",
            if realm.contains('?') { '&' } else { '?' },
            query(&format!("repository:{}:pull", loc.repo))
        );
        if let Some(s) = service {
            url.push_str(&format!("&service={}", query(s)));
        }
        let mut req = Request::get(&url);
        // Anonymous tokens are asked for without credentials.
        if let Some(b) = self.auths.basic(&r.ep.host) {
            req.headers.push(("Authorization".into(), b));
        }
        let body = r.client(self.http).fetch(&req, TOKEN_CAP).map_err(|e| {
            match (e.class, self.auths.entry(&r.ep.host)) {
                (Failure::Denied, Ok(entry)) => e.error.context(format!(
                    "token endpoint {realm} refused the credentials of {entry}"
                )),
                (Failure::Denied, Err(why)) => e.error.context(format!(
                    "token endpoint {realm} refused a request without credentials ({why})"
                )),
                _ => e.error,
            }
        })?;
        let t: TokenAnswer = serde_json::from_slice(&body)
            .map_err(|e| Error::failed(format!("GET {realm}: not a token answer: {e}")))?;
        let Some(token) = t.token.or(t.access_token).filter(|t| !t.is_empty()) else {
            return Err(Error::failed(format!(
                "GET {realm}: the answer has no token (neither token nor access_token)"
            )));
        };
        let secs = t.expires_in.unwrap_or(TOKEN_DEFAULT_SECS);
        crate::info!(
            "{}: pull token for {} from {realm}, valid {secs} s",
            r.ep.shown(),
            loc.repo
        );
        let mut tokens = self.tokens.borrow_mut();
        tokens.retain(|(k, _, _)| *k != key);
        tokens.push((key, token.clone(), now + Duration::from_secs(secs)));
        Ok(token)
    }

    /// What host `r` refused when it answered 401 or 403, for the error: the credentials by
    /// their file and entry (Basic, or the token their token endpoint gave), or that none were
    /// sent. Never the secret.
    fn refusal(&self, r: &Reach) -> String {
        let shown = r.ep.shown();
        let challenge = self.challenge(r).unwrap_or(Challenge::Open);
        match (challenge, self.auths.entry(&r.ep.host)) {
            (Challenge::Basic, Ok(entry)) => {
                format!("{shown} refused the Basic credentials of {entry}")
            }
            (Challenge::Bearer { realm, .. }, Ok(entry)) => {
                format!("{shown} refused the token {realm} gave for the credentials of {entry}")
            }
            (Challenge::Bearer { realm, .. }, Err(why)) => {
                format!("{shown} refused the anonymous token {realm} gave ({why})")
            }
            _ => format!("{shown} refused a request without credentials (its /v2/ asked for none)"),
        }
    }

    /// `op` with a GET of `rest` of `loc` on host `r`, carrying the host's headers, its
    /// authorization and `accept`; once more with a new token if the host refused the one
    /// kept (it may have ended early). A refusal names the credentials refused.
    fn authorized<T>(
        &self,
        r: &Reach,
        loc: &Location,
        rest: &str,
        accept: Option<&str>,
        op: &mut dyn FnMut(&Http, &Request) -> std::result::Result<T, FetchError>,
    ) -> std::result::Result<T, FetchError> {
        let url = r.ep.url(&loc.host, &loc.repo, rest);
        let request = |fresh: bool| {
            let auth = self
                .authorization(r, loc, fresh)
                .map_err(|e| FetchError::new(Failure::Final, e))?;
            let mut req = Request::get(&url);
            push_headers(&mut req, &r.ep);
            if let Some(a) = accept {
                req.headers.push(("Accept".into(), a.to_string()));
            }
            let bearer = auth.as_deref().is_some_and(|a| a.starts_with("Bearer "));
            if let Some(a) = auth {
                req.headers.push(("Authorization".into(), a));
            }
            Ok((req, bearer))
        };
        let http = r.client(self.http);
        let (req, bearer) = request(false)?;
        let answer = match op(http, &req) {
            Err(e) if bearer && e.class == Failure::Denied => {
                crate::info!("{}: token refused; asking for a new one", r.ep.shown());
                op(http, &request(true)?.0)
            }
            a => a,
        };
        answer.map_err(|e| match e.class {
            Failure::Denied => FetchError::new(e.class, e.error.context(self.refusal(r))),
            _ => e,
        })
    }

    /// The whole of file `file` of `loc` (at most `cap` bytes): its artifact's manifest by tag
    /// from a host that may resolve, then the layer titled `file` by digest from a host that
    /// may pull, checked against that digest and size. A tag no host has is
    /// `Failure::Passed(404)`.
    pub fn get(
        &self,
        loc: &Location,
        file: &str,
        cap: u64,
    ) -> std::result::Result<Vec<u8>, FetchError> {
        let final_ = |e: Error| FetchError::new(Failure::Final, e);
        let tag = tag(file).map_err(final_)?;
        let shown = loc.show(file);
        let accept = format!("{MANIFEST_TYPE}, {INDEX_TYPE}");
        let layer = self.first_host(loc, Op::Resolve, &mut |r| {
            let body = self.authorized(
                r,
                loc,
                &format!("manifests/{tag}"),
                Some(&accept),
                &mut |h: &Http, req: &Request| h.fetch_passing(req, MANIFEST_CAP, &[404]),
            )?;
            file_layer(&body, file, &shown).map_err(final_)
        })?;
        let digest = layer.checked(cap, &shown)?;
        self.first_host(loc, Op::Pull, &mut |r| {
            let rest = format!("blobs/{}", layer.digest);
            let data = self.authorized(r, loc, &rest, None, &mut |h: &Http, req: &Request| h.fetch(req, layer.size))?;
            let got = crate::crypto::digest::hex(&sha256(&data));
            if data.len() as u64 != layer.size || got != digest.hex {
                return Err(final_(Error::failed(format!(
                    "{}: the blob is not the one {shown} names: {} bytes with sha256:{got}, want {} bytes with {}",
                    r.ep.url(&loc.host, &loc.repo, &rest),
                    data.len(),
                    layer.size,
                    layer.digest
                ))));
            }
            Ok(data)
        })
    }

    /// `url` into `sink`, the store's verified write of file `name` of `dir`, as `Http::download`
    /// does; an `oci://` reference (`Reference`)
    /// is read from its registry or a mirror that may pull: the manifest by its digest (checked),
    /// then its one layer, titled `name`, as a blob.
    pub fn download(
        &self,
        url: &str,
        cap: u64,
        target: (&Dir, &str),
        sink: &mut dyn BodySink<Written>,
    ) -> std::result::Result<u64, FetchError> {
        let final_ = |e: Error| FetchError::new(Failure::Final, e);
        let Some(r) = Reference::parse(url).map_err(final_)? else {
            return self.http.download(url, cap, target, sink);
        };
        let name = target.1;
        let want = oci_name(&r.manifest);
        let accept = format!("{MANIFEST_TYPE}, {INDEX_TYPE}");
        let layer = self.first_host(&r.loc, Op::Pull, &mut |h| {
            let body = self.authorized(
                h,
                &r.loc,
                &format!("manifests/{want}"),
                Some(&accept),
                &mut |http: &Http, req: &Request| http.fetch(req, MANIFEST_CAP),
            )?;
            let got = crate::crypto::digest::hex(&sha256(&body));
            if got != r.manifest.hex {
                return Err(final_(Error::failed(format!(
                    "{}: the manifest {} served has sha256:{got}, not the pinned {want}",
                    url,
                    h.ep.shown()
                ))));
            }
            file_layer(&body, name, url).map_err(final_)
        })?;
        let blob = layer.checked(cap, url)?;
        let w = self.stream(&r.loc, &blob, cap, Some(target), sink)?;
        Ok(w.bytes)
    }

    /// Blob `digest` of `loc` streamed to `consume`, as `Http::stream` streams a download, from
    /// the first host that may pull and serves it: the digest is the signed list's, so no tag
    /// and no manifest is asked for.
    pub fn stream<T>(
        &self,
        loc: &Location,
        digest: &Digest,
        cap: u64,
        target: Option<(&Dir, &str)>,
        sink: &mut dyn BodySink<T>,
    ) -> std::result::Result<T, FetchError> {
        if digest.algo != Algo::Sha256 {
            return Err(FetchError::new(
                Failure::Final,
                Error::failed(format!(
                    "{}: registries address blobs by sha256; the list names {}",
                    loc.show(""),
                    digest
                )),
            ));
        }
        let rest = format!("blobs/{}", oci_name(digest));
        self.first_host(loc, Op::Pull, &mut |r| {
            self.authorized(r, loc, &rest, None, &mut |h: &Http, req: &Request| {
                h.stream(req, cap, target, &mut *sink)
            })
        })
    }
}

impl Reach {
    fn client<'h>(&'h self, run: &'h Http) -> &'h Http {
        self.http.as_ref().unwrap_or(run)
    }
}

/// A host's `[host.….header]` values, on every request to it.
fn push_headers(req: &mut Request, ep: &Endpoint) {
    for (k, v) in &ep.headers {
        req.headers.push((k.clone().into(), v.clone()));
    }
}

/// The one layer of an artifact manifest titled `file`.
pub(crate) fn file_layer(body: &[u8], file: &str, shown: &str) -> Result<Descriptor> {
    let m: Manifest = serde_json::from_slice(body)
        .map_err(|e| Error::failed(format!("{shown}: not an OCI image manifest: {e}")))?;
    if m.schema_version != 2 || m.media_type.as_deref().is_some_and(|t| t != MANIFEST_TYPE) {
        return Err(Error::failed(format!(
            "{shown}: a {} manifest (schema {}), not an OCI image manifest ({MANIFEST_TYPE})",
            m.media_type.as_deref().unwrap_or("untyped"),
            m.schema_version
        )));
    }
    if m.artifact_type.as_deref() != Some(ARTIFACT_TYPE) {
        return Err(Error::failed(format!(
            "{shown}: artifactType {:?}, not {ARTIFACT_TYPE} (publish it with deploy/publish-oci)",
            m.artifact_type.as_deref().unwrap_or("(none)")
        )));
    }
    let mut titled = m
        .layers
        .into_iter()
        .filter(|l| l.annotations.get(TITLE).map(String::as_str) == Some(file));
    match (titled.next(), titled.next()) {
        (Some(l), None) => Ok(l),
        (None, _) => Err(Error::failed(format!(
            "{shown}: no layer titled {file} ({TITLE})"
        ))),
        (Some(_), Some(_)) => Err(Error::failed(format!(
            "{shown}: more than one layer titled {file}"
        ))),
    }
}

/// RFC 3986 query component: unreserved characters as they are, every other byte %XX.
fn query(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_repositories_and_tags() {
        for good in [
            "registry.k8s.io",
            "registry.example.com:5000/k8s",
            "localhost/nodestrap",
            "10.0.2.2:5000",
            "library",
            "a/b__c/d-e",
        ] {
            assert!(image_repository(good), "{good}");
        }
        for bad in [
            "",
            "Registry.io",
            "r.io/",
            "/k8s",
            "r.io:0/k8s",
            "r.io/a b",
            "r.io/A",
        ] {
            assert!(!image_repository(bad), "{bad}");
        }
        assert!(image_tag("3.5.16-0") && image_tag("_x") && !image_tag("-x") && !image_tag(""));
    }

    #[test]
    fn pinned_references() {
        let hex = "0123456789abcdef".repeat(4);
        let r = Reference::parse(&format!("oci://r.example:5000/torcx/docker@sha256:{hex}"))
            .unwrap()
            .unwrap();
        assert_eq!(r.loc.host, "r.example:5000");
        assert_eq!(r.loc.repo, "torcx/docker");
        assert_eq!(r.manifest.hex, hex);
        assert_eq!(
            Reference::parse("https://r.example/docker.tgz").unwrap(),
            None
        );
        for (url, why) in [
            (
                "oci://r.example/torcx/docker:17.06".to_string(),
                "pinned by digest",
            ),
            (
                "oci://r.example/torcx/docker@sha256:abc".to_string(),
                "is not sha256:<64 hex>",
            ),
            (
                format!("oci://r.example/torcx/docker:17.06@sha256:{hex}"),
                "a repository is",
            ),
            (
                format!("oci://r.example/torcx/docker/@sha256:{hex}"),
                "a slash before the digest",
            ),
            (
                format!("oci://r.example@sha256:{hex}"),
                "oci://HOST[:PORT]/REPOSITORY",
            ),
        ] {
            let e = Reference::parse(&url).unwrap_err().to_string();
            assert!(e.contains(why), "{url}: {e}");
        }
    }

    #[test]
    fn locations() {
        let l = Location::parse_dir("oci://registry.example:5000/flatcar/kubernetes/")
            .unwrap()
            .unwrap();
        assert_eq!(l.host, "registry.example:5000");
        assert_eq!(l.repo, "flatcar/kubernetes");
        assert_eq!(
            l.show("SHA256SUMS"),
            "oci://registry.example:5000/flatcar/kubernetes:SHA256SUMS"
        );
        assert!(Location::parse_dir("https://x/").unwrap().is_none());
        for bad in [
            "oci://",
            "oci://host",
            "oci://host/",
            "oci://host/Upper",
            "oci://host/a//b",
            "oci://host/a-",
            "oci://host/a...b",
            "oci://host:0/a",
            "oci://host:99999/a",
            "oci://ho_st/a",
            "oci://host/a?x",
        ] {
            assert!(Location::parse_dir(bad).is_err(), "{bad}");
        }
        assert!(Location::parse_dir("oci://127.0.0.1:5000/a__b/c-d.e---f").is_ok());
    }

    #[test]
    fn tags() {
        assert!(tag("kubernetes-v1.37.2-x86-64.raw").is_ok());
        assert!(tag("SHA256SUMS.gpg").is_ok());
        assert!(tag(".hidden").is_err());
        assert!(tag("a/b").is_err());
        assert!(tag(&"a".repeat(129)).is_err());
    }

    #[test]
    fn challenges() {
        assert_eq!(
            parse_challenge(
                r#"Bearer realm="https://auth.example/token",service="registry.example",scope="repository:a:pull""#
            ),
            Some(Challenge::Bearer {
                realm: "https://auth.example/token".into(),
                service: Some("registry.example".into())
            })
        );
        assert_eq!(
            parse_challenge(r#"Basic realm="Registry Realm""#),
            Some(Challenge::Basic)
        );
        assert_eq!(parse_challenge("Bearer service=x"), None);
        assert_eq!(
            parse_challenge("Bearer realm=https://a/t,service=x"),
            None,
            "a URL is not a token: it must be quoted"
        );
        assert_eq!(
            parse_challenge("Bearer realm=a,service=x\"y"),
            None,
            "a quote inside a token"
        );
        assert_eq!(
            parse_challenge("Bearer realm=\"https://a/\x01\""),
            None,
            "a control character"
        );
        assert_eq!(parse_challenge("Negotiate"), None);
    }

    #[test]
    fn auth_file() {
        let a = Auths::parse(
            br#"{"auths": {"https://r.example:5000/v1/": {"auth": "dTpw"}, "q.example": {"username": "x", "password": "y"}, "helper.example": {}}}"#,
            "config.json",
        )
        .unwrap();
        assert_eq!(a.basic("r.example:5000").as_deref(), Some("Basic dTpw"));
        assert_eq!(a.basic("q.example").as_deref(), Some("Basic eDp5"));
        assert_eq!(a.basic("helper.example"), None);
        assert!(format!("{a:?}").contains("2 registries"));
        // Messages name an entry by its key as the file writes it, never by its secret.
        assert_eq!(
            a.entry("r.example:5000").unwrap(),
            "auths entry https://r.example:5000/v1/ in config.json"
        );
        assert_eq!(
            a.entry("helper.example").unwrap_err(),
            "config.json has no auths entry for helper.example"
        );
        assert!(Auths::default()
            .entry("h")
            .unwrap_err()
            .contains("give --registry-auth"));
        assert!(Auths::parse(br#"{"auths": {"h": {"auth": "bm9jb2xvbg=="}}}"#, "f").is_err());
        assert!(Auths::parse(br#"{"auths": "x"}"#, "f").is_err());
        assert!(Auths::parse(b"not json", "f").is_err());
    }

    #[test]
    fn layers() {
        let m = |at: &str, title: &str| {
            format!(
                r#"{{"schemaVersion":2,"mediaType":"{MANIFEST_TYPE}","artifactType":"{at}","config":{{}},"layers":[{{"mediaType":"application/octet-stream","digest":"sha256:{}","size":3,"annotations":{{"{TITLE}":"{title}"}}}}]}}"#,
                "a".repeat(64)
            )
        };
        assert_eq!(
            file_layer(m(ARTIFACT_TYPE, "f").as_bytes(), "f", "s")
                .unwrap()
                .size,
            3
        );
        assert!(file_layer(m("other", "f").as_bytes(), "f", "s").is_err());
        assert!(file_layer(m(ARTIFACT_TYPE, "g").as_bytes(), "f", "s").is_err());
        assert!(file_layer(b"{}", "f", "s").is_err());
    }

    #[test]
    fn queries() {
        assert_eq!(query("repository:a/b:pull"), "repository%3Aa%2Fb%3Apull");
    }
}
