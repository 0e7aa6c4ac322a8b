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

use crate::error::{Error, Result};
use crate::net::fetch::{Failure, FetchError, Http, Request};
use crate::net::kubeconfig::client_cert;
use crate::net::mirrors::{self, Endpoint};
use crate::net::retry::Retry;
use crate::node::root::Root;

mod auth;
mod manifest;
mod reference;

pub(crate) use auth::Auths;
pub(crate) use auth::{parse_challenge, Challenge};
pub(crate) use manifest::file_layer;
pub(crate) use reference::{image_repository, image_tag, Location, Reference};

/// nodestrap's artifact type: one file of a release directory.
pub(crate) const ARTIFACT_TYPE: &str = "application/vnd.nodestrap.file.v1";
pub(crate) const MANIFEST_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
pub(crate) const INDEX_TYPE: &str = "application/vnd.oci.image.index.v1+json";
pub(crate) const TITLE: &str = "org.opencontainers.image.title";
/// A manifest is small; one larger than this is not one of ours.
const MANIFEST_CAP: u64 = 1 << 20;
/// A Docker config.json with many registries is still small.
pub(crate) const AUTH_FILE_CAP: u64 = 1 << 20;
const TOKEN_CAP: u64 = 64 << 10;
/// The distribution spec's default when a token answer has no `expires_in`.
const TOKEN_DEFAULT_SECS: u64 = 60;
/// A token this close to its end is asked for again rather than sent.
const TOKEN_MARGIN: Duration = Duration::from_secs(5);

/// Where a run's registries' mirrors are configured: containerd's `config_path` on the node.
pub(crate) struct Mirrors<'a> {
    pub(crate) root: &'a Root,
    /// A node path; empty for none.
    pub(crate) config_path: String,
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
pub(crate) struct Client<'a> {
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
    pub(crate) fn new(http: &'a Http, auths: Auths, mirrors: Mirrors<'a>) -> Self {
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
    pub(crate) fn http(&self) -> &'a Http {
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

#[cfg(test)]
mod tests {
    use super::auth::query;
    use super::reference::tag;
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
