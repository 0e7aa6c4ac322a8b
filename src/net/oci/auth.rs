//! A registry's auth: credentials from a Docker `config.json`, the `/v2/` challenge, Bearer
//! tokens per repository, and requests that carry them.

use std::time::{Duration, Instant};

use base64::Engine as _;
use serde::Deserialize;

use super::{push_headers, Client, Location, Reach, TOKEN_CAP, TOKEN_DEFAULT_SECS, TOKEN_MARGIN};
use crate::error::{Error, Result};
use crate::net::fetch::{Failure, FetchError, Http, Request};
use crate::net::mirrors::Scheme;

/// Credentials per registry from a Docker `config.json`: `{"auths": {"HOST[:PORT]": {"auth":
/// base64("user:password")}}}`, or `username` and `password` in place of `auth`. Keys written as
/// URLs (`https://host/v1/`) count for their host. Never printed.
#[derive(Default)]
pub(crate) struct Auths {
    pub(crate) entries: Vec<(String, String, String)>,
    /// Each entry's key in `auths` as the file writes it, for messages.
    keys: Vec<String>,
    /// Where they came from, for messages.
    pub(crate) from: String,
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
    pub(crate) fn parse(data: &[u8], from: &str) -> Result<Auths> {
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
    pub(super) fn entry(&self, host: &str) -> std::result::Result<String, String> {
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

impl Client<'_> {
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
    pub(super) fn authorized<T>(
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
}

/// RFC 3986 query component: unreserved characters as they are, every other byte %XX.
pub(super) fn query(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
