//! Registry mirrors as containerd reads them (`hosts.toml`, containerd's "registry host
//! namespace"), so one mirror setup serves nodestrap and the kubelet's containerd alike: for
//! registry `HOST[:PORT]`, the first of `<config_path>/HOST_PORT_`, `<config_path>/HOST:PORT`
//! and `<config_path>/_default` that exists is the host's directory (a `config_path` of several
//! folders, `a:b`, is searched folder by folder: a's `_default` wins over b's `HOST:PORT`, as
//! containerd's CRI plugin splits it), and its `hosts.toml` lists
//! the `[host."URL"]` mirrors, tried in the file's order, then the `server` (the registry itself
//! unless `server` names another). Each gets its capabilities (`pull`, `resolve`), `ca`,
//! `client`, `header` and `override_path`; every manifest and blob request to a host that is
//! not the registry carries `?ns=HOST[%3APORT]`, as containerd's does (the one `GET /v2/` probe
//! of a host carries none: containerd sends no probe). Where nodestrap differs, it is stricter:
//! a file that is not valid is an error (containerd logs it and pulls from the registry),
//! `skip_verify = true` takes the host out of the list (credentials would cross an unverified
//! connection), and a host offers one client certificate.

use crate::error::{Error, Result};
use crate::net::toml::{self, Table, Value};
use crate::node::root::Root;

/// containerd's `config_path` as its docs and most distributions set it.
pub(crate) const DEFAULT_CONFIG_PATH: &str = "/etc/containerd/certs.d";
const HOSTS_FILE_CAP: u64 = 64 << 10;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scheme {
    Https,
    /// Only a mirror may be plain http (Spegel listens so on the node): no credentials are ever
    /// sent there, and what it serves is checked against the signed digests as any download.
    Http,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Caps {
    pub(crate) pull: bool,
    /// Resolving a tag is trusted: a host without it is never asked for a manifest by tag.
    pub(crate) resolve: bool,
}

/// Client certificate and key files; the key in the certificate's file when `None`.
pub(crate) type ClientPair = (String, Option<String>);

/// One host a registry's content may come from.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Endpoint {
    pub(crate) scheme: Scheme,
    /// `host[:port]`: what credentials are looked up by.
    pub(crate) host: String,
    /// The API root: `/v2` below the URL's path, or the path itself with `override_path`.
    pub(crate) path: String,
    pub(crate) caps: Caps,
    /// Node paths of extra CA bundles, trusted beside the system's.
    pub(crate) ca: Vec<String>,
    pub(crate) client: Option<ClientPair>,
    pub(crate) headers: Vec<(String, String)>,
    /// A `[host]` entry, not the server.
    pub(crate) mirror: bool,
}

impl Endpoint {
    /// The registry itself, as containerd reaches it with no hosts.toml.
    pub(crate) fn registry(host: &str) -> Endpoint {
        Endpoint {
            scheme: Scheme::Https,
            host: host.to_string(),
            path: "/v2".into(),
            caps: Caps {
                pull: true,
                resolve: true,
            },
            ca: Vec::new(),
            client: None,
            headers: Vec::new(),
            mirror: false,
        }
    }

    /// `scheme://host/path`, the API root without its slash.
    pub(crate) fn root(&self) -> String {
        let scheme = match self.scheme {
            Scheme::Https => "https",
            Scheme::Http => "http",
        };
        format!("{scheme}://{}{}", self.host, self.path)
    }

    /// The URL of `rest` (`manifests/TAG`, `blobs/DIGEST`) of repository `repo` of registry
    /// `registry` on this host: `?ns=` when the host is not the registry, written as
    /// containerd writes it (`isProxy` and `addNamespace` in its `remotes/docker`: Go's
    /// `url.Values.Encode`, so a port's colon is `%3A`).
    pub(crate) fn url(&self, registry: &str, repo: &str, rest: &str) -> String {
        let base = format!("{}/{repo}/{rest}", self.root());
        if self.host == registry || (registry == "docker.io" && self.host == "registry-1.docker.io")
        {
            base
        } else {
            // A registry is a host name or IPv4 address and a port: only the colon is escaped.
            format!("{base}?ns={}", registry.replace(':', "%3A"))
        }
    }

    /// What the log calls it.
    pub(crate) fn shown(&self) -> String {
        if self.mirror {
            format!("mirror {}", self.root())
        } else {
            format!("registry {}", self.host)
        }
    }

    /// TLS settings of its own (else the run's client serves it as is).
    pub(crate) fn own_tls(&self) -> bool {
        !self.ca.is_empty() || self.client.is_some()
    }
}

/// `--registry-config-path`: empty (none), or absolute node folders separated by `:`. An empty
/// or relative one is refused: containerd would look it up relative to its working directory.
pub(crate) fn check_config_path(config_path: &str) -> Result<()> {
    if config_path.is_empty() {
        return Ok(());
    }
    for (i, f) in config_path.split(':').enumerate() {
        if !f.starts_with('/') {
            return Err(Error::config(format!(
                "--registry-config-path {config_path:?}: folder {} of its ':'-separated list, {f:?}, is not an absolute folder on the node",
                i + 1
            )));
        }
    }
    Ok(())
}

/// The hosts of registry `registry` (`host[:port]`), mirrors first, and the file they came from:
/// from `config_path` on the node (folders separated by `:`, checked by `check_config_path`;
/// empty: none), else the registry alone.
pub(crate) fn endpoints(
    root: &Root,
    config_path: &str,
    registry: &str,
) -> Result<(Vec<Endpoint>, Option<String>)> {
    if config_path.is_empty() {
        return Ok((vec![Endpoint::registry(registry)], None));
    }
    let mut names = Vec::new();
    if let Some((h, p)) = registry.rsplit_once(':') {
        names.push(format!("{h}_{p}_"));
    }
    names.push(registry.to_string());
    names.push("_default".into());
    let dirs = config_path.split(':').flat_map(|base| {
        let base = base.trim_end_matches('/');
        names.iter().map(move |d| format!("{base}/{d}"))
    });
    for dir in dirs {
        if !root.exists(&dir) {
            continue;
        }
        let file = format!("{dir}/hosts.toml");
        let shown = root.show(&file);
        // A directory without hosts.toml holds only certificates for the registry itself
        // (Docker's certs.d layout), which nodestrap does not read.
        let Some(data) = root.read(&file, HOSTS_FILE_CAP)? else {
            return Ok((vec![Endpoint::registry(registry)], None));
        };
        let text = String::from_utf8(data)
            .map_err(|_| Error::config(format!("{shown}: not UTF-8 text")))?;
        let doc = toml::parse(&text, &shown)?;
        return Ok((parse_hosts(&doc, &dir, registry, &shown)?, Some(shown)));
    }
    Ok((vec![Endpoint::registry(registry)], None))
}

/// The hosts a parsed hosts.toml names, for registry `registry`; relative file paths are
/// relative to `dir`, the host's directory.
pub(crate) fn parse_hosts(
    doc: &Table,
    dir: &str,
    registry: &str,
    shown: &str,
) -> Result<Vec<Endpoint>> {
    let mut out = Vec::new();
    match doc.get("host") {
        None => {}
        Some(Value::Table(hosts)) => {
            for (url, v) in &hosts.entries {
                let Value::Table(t) = v else {
                    return Err(field(shown, &format!("host.{url:?}"), "must be a table"));
                };
                let at = format!("[host.{url:?}]");
                if let Some(e) = host(url, t, dir, shown, &at)? {
                    out.push(Endpoint { mirror: true, ..e });
                }
            }
        }
        Some(_) => {
            return Err(field(
                shown,
                "host",
                "must be a table of [host.\"URL\"] tables",
            ))
        }
    }
    let server = match doc.get("server") {
        None => None,
        Some(Value::String(s)) if !s.is_empty() => Some(s.as_str()),
        Some(_) => return Err(field(shown, "server", "must be a URL")),
    };
    let top = host(server.unwrap_or(registry), doc, dir, shown, "server")?;
    if let Some(mut e) = top {
        if server.is_none() {
            // As containerd: with no `server`, the registry with every capability.
            let r = Endpoint::registry(registry);
            (e.scheme, e.host, e.path, e.caps) = (r.scheme, r.host, r.path, r.caps);
        } else if e.scheme == Scheme::Http {
            return Err(field(
                shown,
                "server",
                "must be https: credentials go to the server",
            ));
        }
        out.push(e);
    }
    Ok(out)
}

fn field(shown: &str, key: &str, why: &str) -> Error {
    Error::config(format!("{shown}: {key} {why}"))
}

/// One host's settings from table `t` (a `[host."URL"]`, or the file's top level for the
/// server); `None` for a host nodestrap does not use (`skip_verify = true`).
fn host(url: &str, t: &Table, dir: &str, shown: &str, at: &str) -> Result<Option<Endpoint>> {
    let k = HostKeys { t, dir, shown, at };
    let (scheme, hostport, path) = k.url(url)?;
    let override_path = k.override_path()?;
    let clean = clean_path(&path);
    let path = if override_path || clean.ends_with("/v2") {
        clean
    } else {
        format!("{clean}/v2")
    };
    if k.skip_verify()? {
        return Ok(None);
    }
    let caps = k.caps()?;
    let ca = k.ca()?;
    let client = k.client()?;
    let headers = k.headers()?;
    Ok(Some(Endpoint {
        scheme,
        host: hostport,
        path,
        caps,
        ca,
        client,
        headers,
        mirror: false,
    }))
}

/// One host table's keys, each read by its own step, in the order `host` finds their errors.
struct HostKeys<'a> {
    t: &'a Table,
    /// Where relative file names (`ca`, `client`) start.
    dir: &'a str,
    shown: &'a str,
    /// The table, in errors.
    at: &'a str,
}

impl HostKeys<'_> {
    fn bad(&self, key: &str, why: &str) -> Error {
        field(self.shown, &format!("{} {key}", self.at), why)
    }

    fn abs(&self, p: &str) -> String {
        if p.starts_with('/') {
            p.to_string()
        } else {
            format!("{}/{p}", self.dir)
        }
    }

    /// The host's URL (https when it names no scheme): its scheme, host and port, and path.
    fn url(&self, url: &str) -> Result<(Scheme, String, String)> {
        let full = if url.starts_with("http") || url.contains("://") {
            url.to_string()
        } else {
            format!("https://{url}")
        };
        let (scheme, rest) = if let Some(r) = full.strip_prefix("https://") {
            (Scheme::Https, r)
        } else if let Some(r) = full.strip_prefix("http://") {
            (Scheme::Http, r)
        } else {
            return Err(self.bad("", "is not an http or https URL"));
        };
        let (hostport, path) = match rest.find(['/', '?', '#']) {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        let host_ok = !hostport.is_empty()
            && hostport
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-.:[]_".contains(&b));
        let port_ok = match hostport.rsplit_once(':') {
            Some((h, _)) if !h.ends_with(']') && h.contains(':') => false,
            Some((_, p)) => p.parse::<u16>().is_ok_and(|p| p > 0),
            None => true,
        };
        if !host_ok || !port_ok || path.contains(['?', '#']) {
            return Err(self.bad("", "is not a URL of a host and an optional path"));
        }
        Ok((scheme, hostport.to_string(), path.to_string()))
    }

    fn override_path(&self) -> Result<bool> {
        match self.t.get("override_path") {
            None => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => Err(self.bad(
                "override_path",
                &format!("must be a boolean, not {}", v.kind()),
            )),
        }
    }

    /// Whether the host is left out (`skip_verify = true`).
    fn skip_verify(&self) -> Result<bool> {
        match self.t.get("skip_verify") {
            None | Some(Value::Bool(false)) => Ok(false),
            Some(Value::Bool(true)) => {
                crate::warn!(
                    "{}: {}: skip_verify = true: nodestrap does not use this host (credentials would cross an unverified connection)",
                    self.shown,
                    self.at
                );
                Ok(true)
            }
            Some(v) => Err(self.bad(
                "skip_verify",
                &format!("must be a boolean, not {}", v.kind()),
            )),
        }
    }

    fn caps(&self) -> Result<Caps> {
        let all = Caps {
            pull: true,
            resolve: true,
        };
        let a = match self.t.get("capabilities") {
            None => return Ok(all),
            Some(Value::Array(a)) if a.is_empty() => return Ok(all),
            Some(Value::Array(a)) => a,
            Some(v) => {
                return Err(self.bad(
                    "capabilities",
                    &format!("must be an array, not {}", v.kind()),
                ))
            }
        };
        let mut c = Caps {
            pull: false,
            resolve: false,
        };
        for v in a {
            match v {
                Value::String(s) => match s.to_ascii_lowercase().as_str() {
                    "pull" => c.pull = true,
                    "resolve" => c.resolve = true,
                    "push" => {}
                    _ => {
                        return Err(self.bad(
                            "capabilities",
                            &format!("names {s:?}: one of pull, resolve, push"),
                        ))
                    }
                },
                v => {
                    return Err(self.bad(
                        "capabilities",
                        &format!("holds a {}: strings only", v.kind()),
                    ))
                }
            }
        }
        Ok(c)
    }

    fn ca(&self) -> Result<Vec<String>> {
        match self.t.get("ca") {
            None => Ok(Vec::new()),
            Some(Value::String(s)) => Ok(vec![self.abs(s)]),
            Some(Value::Array(a)) => Ok(strings(a)
                .ok_or_else(|| self.bad("ca", "must hold file names only"))?
                .iter()
                .map(|s| self.abs(s))
                .collect()),
            Some(v) => Err(self.bad(
                "ca",
                &format!("must be a file name or an array of them, not {}", v.kind()),
            )),
        }
    }

    /// The client certificate (and its key, if a file of its own): one at most.
    fn client(&self) -> Result<Option<ClientPair>> {
        let mut pairs: Vec<ClientPair> = Vec::new();
        match self.t.get("client") {
            None => {}
            Some(Value::String(s)) => pairs.push((self.abs(s), None)),
            Some(Value::Array(a)) => {
                for v in a {
                    match v {
                        Value::String(s) => pairs.push((self.abs(s), None)),
                        Value::Array(p) => match strings(p).as_deref() {
                            Some([c, k]) => pairs.push((self.abs(c), Some(self.abs(k)))),
                            _ => {
                                return Err(
                                    self.bad("client", "pairs are [certificate file, key file]")
                                )
                            }
                        },
                        v => return Err(self.bad("client", &format!("holds a {}", v.kind()))),
                    }
                }
            }
            Some(v) => {
                return Err(self.bad(
                    "client",
                    &format!("must be a file name or an array, not {}", v.kind()),
                ))
            }
        }
        if pairs.len() > 1 {
            return Err(self.bad(
                "client",
                "names more than one certificate: nodestrap offers one per host",
            ));
        }
        Ok(pairs.pop())
    }

    /// The `[header]` table: a name and its value for each value of each name.
    fn headers(&self) -> Result<Vec<(String, String)>> {
        let h = match self.t.get("header") {
            None => return Ok(Vec::new()),
            Some(Value::Table(h)) => h,
            Some(v) => {
                return Err(self.bad("header", &format!("must be a table, not {}", v.kind())))
            }
        };
        let mut headers = Vec::new();
        for (name, v) in &h.entries {
            if name.is_empty()
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
            {
                return Err(self.bad("header", &format!("{name:?} is not a header name")));
            }
            let values = match v {
                Value::String(s) => vec![s.clone()],
                Value::Array(a) => strings(a)
                    .ok_or_else(|| self.bad("header", &format!("{name}: strings only")))?,
                v => {
                    return Err(self.bad(
                        "header",
                        &format!("{name}: a string or strings, not {}", v.kind()),
                    ))
                }
            };
            for value in values {
                if value.bytes().any(|b| b < 0x20 && b != b'\t' || b == 0x7f) {
                    return Err(self.bad(
                        "header",
                        &format!("{name}: control characters in its value"),
                    ));
                }
                headers.push((name.clone(), value));
            }
        }
        Ok(headers)
    }
}

fn strings(a: &[Value]) -> Option<Vec<String>> {
    a.iter()
        .map(|v| match v {
            Value::String(s) => Some(s.clone()),
            _ => None,
        })
        .collect()
}

/// Go's `path.Clean` for a URL path: `""` for none, else `/a/b` without dot segments,
/// doubled or trailing slashes.
fn clean_path(p: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for seg in p.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            s => parts.push(s),
        }
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("/{}", parts.join("/"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(doc: &str) -> Result<Vec<Endpoint>> {
        let t = toml::parse(doc, "hosts.toml")?;
        parse_hosts(
            &t,
            "/etc/containerd/certs.d/r.example",
            "r.example",
            "hosts.toml",
        )
    }

    #[test]
    fn order_caps_paths_and_ns() {
        let h = hosts(
            r#"
server = "https://r.example"
[host."http://127.0.0.1:30020"]
  capabilities = ["pull"]
[host."https://cache.example/some/prefix"]
  ca = ["cache-ca.pem", "/etc/pki/extra.pem"]
  client = [["c.pem", "/k.pem"]]
  [host."https://cache.example/some/prefix".header]
    X-Token = ["a", "b"]
[host."mirror.example:5000"]
  override_path = true
"#,
        )
        .unwrap();
        assert_eq!(h.len(), 4);
        assert_eq!(h[0].root(), "http://127.0.0.1:30020/v2");
        assert_eq!(
            h[0].caps,
            Caps {
                pull: true,
                resolve: false
            }
        );
        assert_eq!(
            h[0].url("r.example", "ext/kubernetes", "blobs/sha256:ab"),
            "http://127.0.0.1:30020/v2/ext/kubernetes/blobs/sha256:ab?ns=r.example"
        );
        assert_eq!(h[1].root(), "https://cache.example/some/prefix/v2");
        assert_eq!(
            h[1].ca,
            [
                "/etc/containerd/certs.d/r.example/cache-ca.pem",
                "/etc/pki/extra.pem"
            ]
        );
        assert_eq!(
            h[1].client,
            Some((
                "/etc/containerd/certs.d/r.example/c.pem".into(),
                Some("/k.pem".into())
            ))
        );
        assert_eq!(
            h[1].headers,
            [
                ("X-Token".into(), "a".into()),
                ("X-Token".into(), "b".into())
            ]
        );
        assert_eq!(h[2].root(), "https://mirror.example:5000");
        assert_eq!(
            h[2].url("r.example:5000", "x", "manifests/t"),
            "https://mirror.example:5000/x/manifests/t?ns=r.example%3A5000",
            "the port's colon escaped as Go's url.Values.Encode escapes it"
        );
        assert!(h[..3].iter().all(|e| e.mirror));
        assert!(!h[3].mirror);
        assert_eq!(
            h[3].url("r.example", "x", "manifests/t"),
            "https://r.example/v2/x/manifests/t"
        );
    }

    #[test]
    fn server_defaults_and_skip_verify() {
        let h =
            hosts("capabilities = [\"pull\"]\n[host.\"https://m\"]\nskip_verify = true\n").unwrap();
        // No `server`: the registry, with every capability (containerd ignores the top level's).
        assert_eq!(h, [Endpoint::registry("r.example")]);
        let h = hosts("server = \"https://other.example/v2/\"\n").unwrap();
        assert_eq!(h[0].root(), "https://other.example/v2");
        assert_eq!(
            h[0].url("r.example", "x", "blobs/d"),
            "https://other.example/v2/x/blobs/d?ns=r.example"
        );
    }

    /// Folder by folder, as containerd's CRI plugin (tests/sysext/oci.rs holds it to the real
    /// one): the first folder's `_default` comes before the second's `HOST:PORT`.
    #[test]
    fn several_folders_are_searched_in_turn() {
        let mut rnd = [0u8; 8];
        rustix::rand::getrandom(&mut rnd, rustix::rand::GetRandomFlags::empty()).unwrap();
        let p =
            std::env::temp_dir().join(format!("nodestrap-mirrors-{:x}", u64::from_ne_bytes(rnd)));
        let put = |dir: &str, mirror: &str| {
            std::fs::create_dir_all(p.join(dir)).unwrap();
            std::fs::write(
                p.join(dir).join("hosts.toml"),
                format!("[host.\"https://{mirror}\"]\n"),
            )
            .unwrap();
        };
        put("a/x", "unused");
        put("b/r.example_5000_", "b-specific");
        let root = Root::open(&p).unwrap();
        let first = |path: &str| {
            let (eps, file) = endpoints(&root, path, "r.example:5000").unwrap();
            let file = file.map(|f| f.rsplit('/').nth(1).unwrap_or_default().to_string());
            (eps[0].host.clone(), file)
        };
        let named = |host: &str, dir: &str| (host.to_string(), Some(dir.to_string()));
        assert_eq!(first("/a:/b/"), named("b-specific", "r.example_5000_"));
        put("a/_default", "a-default");
        assert_eq!(first("/a/:/b"), named("a-default", "_default"));
        assert_eq!(first("/b:/a"), named("b-specific", "r.example_5000_"));
        // A folder without hosts.toml ends the search: the registry alone.
        std::fs::create_dir_all(p.join("c/r.example:5000")).unwrap();
        assert_eq!(first("/c:/a"), ("r.example:5000".into(), None));
        for (bad, which) in [
            ("/a::/b", "folder 2"),
            ("/a:", "folder 2"),
            ("/a:b", "folder 2"),
        ] {
            let e = check_config_path(bad).unwrap_err().to_string();
            assert!(
                e.contains(which) && e.contains("not an absolute folder"),
                "{bad}: {e}"
            );
        }
        for good in ["", "/a", "/a/:/b"] {
            assert!(check_config_path(good).is_ok(), "{good}");
        }
        std::fs::remove_dir_all(&p).unwrap();
    }

    #[test]
    fn refused() {
        for (doc, why) in [
            (
                "[host.\"https://m\"]\ncapabilities = [\"fetch\"]\n",
                "capabilities names \"fetch\"",
            ),
            (
                "[host.\"https://m\"]\nclient = [\"a.pem\", \"b.pem\"]\n",
                "more than one certificate",
            ),
            (
                "[host.\"https://m\"]\nclient = [[\"a.pem\"]]\n",
                "pairs are",
            ),
            ("[host.\"https://m\"]\nca = 3\n", "ca must be a file name"),
            ("[host.\"ftp://m\"]\n", "not an http or https URL"),
            (
                "[host.\"https://m\".header]\n\"bad name\" = \"x\"\n",
                "not a header name",
            ),
            (
                "[host.\"https://m\".header]\nX = \"a\\nb\"\n",
                "control characters",
            ),
            ("server = \"http://r.example\"\n", "server must be https"),
            ("host = 1\n", "host must be a table"),
        ] {
            let e = hosts(doc).unwrap_err().to_string();
            assert!(e.contains(why), "{doc:?}: {e}");
        }
    }
}
