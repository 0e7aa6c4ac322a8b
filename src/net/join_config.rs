//! kubeadm's JoinConfiguration (the file `kubeadm join --config` takes) as the version source
//! of a node that has not joined: it names the cluster before any kubeconfig exists. Only its
//! `discovery` is read, as kubeadm reads it:
//!
//! - `file.kubeConfigPath`: a kubeconfig on the node, asked as any other;
//! - `bootstrapToken`: cluster-info (kube-public, readable by anyone) is read from
//!   `apiServerEndpoint` without checking the server, and trusted only for a CA whose public
//!   key matches one of `caCertHashes`; `/version` is then asked over TLS checked against that
//!   CA, with the token. kubeadm also checks cluster-info's JWS signature; nodestrap uses
//!   nothing of cluster-info but the CA the pin proves, so the pin is all it trusts, and a
//!   configuration without pins (`unsafeSkipCAVerification`) is refused.

use yaml_rust2::Yaml;

use crate::error::{Error, Result};
use crate::net::fetch::{Failure, FetchError, Http, Request};
use crate::net::kube::Kube;
use crate::net::retry::Retry;
use crate::net::tls::{Check, Tls};
use crate::node::root::Root;
use crate::yaml;

/// The kubeadm API versions kubeadm 1.31 and later read.
const VERSIONS: &[&str] = &["kubeadm.k8s.io/v1beta4", "kubeadm.k8s.io/v1beta3"];

/// How the join configuration finds the cluster. Not `Debug`: the token is a secret.
#[derive(PartialEq)]
pub enum Discovery {
    /// `discovery.file.kubeConfigPath`: a kubeconfig on the node.
    File(String),
    /// `discovery.bootstrapToken`.
    Token {
        /// `host:port` (or `[v6]:port`).
        endpoint: String,
        token: String,
        /// `sha256:<hex>` of the CA's SubjectPublicKeyInfo, as kubeadm prints them.
        pins: Vec<String>,
    },
}

/// The `discovery` of the one JoinConfiguration in `text` (other documents, such as a
/// KubeletConfiguration beside it, are kubeadm's business). `name` names the file in errors.
pub fn parse(text: &str, name: &str) -> Result<Discovery> {
    let docs = yaml::parse_all(text, name)?;
    let doc = join_document(&docs, name)?;
    let d = &doc["discovery"];
    let token_d = &d["bootstrapToken"];
    let file_d = &d["file"];
    let set = |y: &Yaml| !matches!(y, Yaml::BadValue | Yaml::Null);
    match (set(token_d), set(file_d)) {
        (true, true) => Err(Error::failed(format!(
            "{name}: discovery: bootstrapToken and file are both set (kubeadm refuses this too)"
        ))),
        (false, false) => Err(Error::failed(format!(
            "{name}: discovery: neither bootstrapToken nor file is set"
        ))),
        (false, true) => file_discovery(file_d, name),
        (true, false) => token_discovery(token_d, name),
    }
}

/// The one JoinConfiguration among `docs`, of an API version kubeadm reads.
fn join_document<'y>(docs: &'y [Yaml], name: &str) -> Result<&'y Yaml> {
    let joins: Vec<&Yaml> = docs
        .iter()
        .filter(|d| {
            yaml::opt_str(d, "kind", name).ok().flatten().as_deref() == Some("JoinConfiguration")
        })
        .collect();
    let doc = match joins.as_slice() {
        [d] => *d,
        [] => {
            return Err(Error::failed(format!(
                "{name}: no document of kind JoinConfiguration in it"
            )))
        }
        _ => {
            return Err(Error::failed(format!(
                "{name}: {} documents of kind JoinConfiguration; kubeadm takes one",
                joins.len()
            )))
        }
    };
    let version = yaml::opt_str(doc, "apiVersion", name)?.unwrap_or_default();
    if !VERSIONS.contains(&version.as_str()) {
        return Err(Error::failed(format!(
            "{name}: apiVersion {version:?}: expected {}",
            VERSIONS.join(" or ")
        )));
    }
    Ok(doc)
}

/// `discovery.file`: a kubeconfig on the node, by its absolute path.
fn file_discovery(file_d: &Yaml, name: &str) -> Result<Discovery> {
    let field = |f: &str| format!("discovery.{f}");
    let p = yaml::opt_str(file_d, "kubeConfigPath", name)?.unwrap_or_default();
    if p.starts_with("https://") || p.starts_with("http://") {
        return Err(Error::failed(format!(
            "{name}: {}: {p:?}: nodestrap reads a kubeconfig on the node, not a URL",
            field("file.kubeConfigPath")
        )));
    }
    if !p.starts_with('/') {
        return Err(Error::failed(format!(
            "{name}: {}: {p:?}: expected an absolute path on the node",
            field("file.kubeConfigPath")
        )));
    }
    Ok(Discovery::File(p))
}

/// `discovery.bootstrapToken`: the API server's address, the token, and the CA's pins.
fn token_discovery(token_d: &Yaml, name: &str) -> Result<Discovery> {
    let field = |f: &str| format!("discovery.{f}");
    let endpoint = yaml::opt_str(token_d, "apiServerEndpoint", name)?.unwrap_or_default();
    if endpoint.is_empty() || endpoint.contains('/') || !endpoint.contains(':') {
        return Err(Error::failed(format!(
            "{name}: {}: {endpoint:?}: expected HOST:PORT",
            field("bootstrapToken.apiServerEndpoint")
        )));
    }
    let token = yaml::opt_str(token_d, "token", name)?.unwrap_or_default();
    if !is_token(&token) {
        return Err(Error::failed(format!(
            "{name}: {}: not a bootstrap token (6 and 16 characters of [a-z0-9] joined by a dot)",
            field("bootstrapToken.token")
        )));
    }
    let mut pins = Vec::new();
    for p in yaml::items(
        &token_d["caCertHashes"],
        name,
        "discovery.bootstrapToken.caCertHashes",
    )? {
        let p = yaml::scalar(p).unwrap_or_default();
        let hex = p.strip_prefix("sha256:").unwrap_or("");
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Error::failed(format!(
                "{name}: {}: {:?}: expected sha256:<64 hex digits>",
                field("bootstrapToken.caCertHashes"),
                crate::error::excerpt(&p, 80)
            )));
        }
        pins.push(format!("sha256:{}", hex.to_ascii_lowercase()));
    }
    if pins.is_empty() {
        return Err(Error::failed(format!(
            "{name}: {}: none, so nothing proves the cluster's CA (nodestrap does not \
             skip that check, whatever unsafeSkipCAVerification says): add the hash \
             `kubeadm token create --print-join-command` prints",
            field("bootstrapToken.caCertHashes")
        )));
    }
    Ok(Discovery::Token {
        endpoint,
        token,
        pins,
    })
}

/// `abcdef.0123456789abcdef`: a bootstrap token's id and secret.
fn is_token(t: &str) -> bool {
    let ok = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    };
    matches!(t.split_once('.'), Some((id, secret)) if ok(id, 6) && ok(secret, 16))
}

/// Token discovery could not read cluster-info for want of an answer: judged by the fallback
/// policy as a `/version` that failed the same way.
pub(crate) struct Unreached {
    /// The join configuration, for messages.
    pub(crate) source: String,
    pub(crate) error: String,
    pub(crate) failure: Failure,
}

/// A client for the cluster the join configuration at `node_path` names, for its version, or
/// the discovery's failure to reach it. `Ok(None)` when the file does not exist.
pub(crate) fn kube(
    root: &Root,
    node_path: &str,
    retry: Retry,
) -> Result<Option<std::result::Result<Kube, Unreached>>> {
    let name = root.show(node_path);
    let Some(text) = root.read_text(node_path)? else {
        return Ok(None);
    };
    match parse(&text, &name)? {
        Discovery::File(p) => match Kube::from_kubeconfig(root, &p, retry)? {
            Some(k) => Ok(Some(Ok(k))),
            None => Err(Error::failed(format!(
                "{name}: discovery.file.kubeConfigPath names {}, which does not exist",
                root.show(&p)
            ))),
        },
        Discovery::Token {
            endpoint,
            token,
            pins,
        } => {
            let source =
                format!("{name} (its bootstrap token; the cluster's CA pinned by caCertHashes)");
            let tls = match pinned_ca(&endpoint, &pins, &name, retry) {
                Ok(tls) => tls,
                Err(FetchError {
                    class: class @ (Failure::Unreachable | Failure::Busy),
                    error,
                }) => {
                    return Ok(Some(Err(Unreached {
                        source,
                        error: error.to_string(),
                        failure: class,
                    })))
                }
                Err(e) => return Err(e.into()),
            };
            Kube::with_token(&format!("https://{endpoint}"), tls, token, source, retry)
                .map(|k| Some(Ok(k)))
        }
    }
}

/// The CA that cluster-info at `endpoint` offers, trusted only if its key is one of `pins`;
/// a failure's class says whether cluster-info could be read at all (unreachable, busy: as
/// `/version` fails) or was read and refused (final).
fn pinned_ca(
    endpoint: &str,
    pins: &[String],
    name: &str,
    retry: Retry,
) -> std::result::Result<Tls, FetchError> {
    let url = format!("https://{endpoint}/api/v1/namespaces/kube-public/configmaps/cluster-info");
    let unchecked = Tls {
        check: Check::PinnedAfter,
        ..Tls::default()
    };
    let body = Http::new(&unchecked, retry)
        .fetch(&Request::get(&url), 1 << 20)
        .map_err(|FetchError { class, error }| FetchError {
            class,
            error: error.context(format!("{name}: discovery.bootstrapToken: cluster-info")),
        })?;
    // What the answer holds is final: asking again gets the same CA.
    pinned_in(&body, &url, endpoint, pins, name)
        .map_err(|error| FetchError::new(Failure::Final, error))
}

/// The CA in cluster-info's answer `body`, if its key is one of `pins`.
fn pinned_in(body: &[u8], url: &str, endpoint: &str, pins: &[String], name: &str) -> Result<Tls> {
    let bad = |why: String| Error::failed(format!("{name}: cluster-info from {url}: {why}"));
    let cm: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| bad(format!("invalid JSON: {e}")))?;
    let kubeconfig = cm["data"]["kubeconfig"]
        .as_str()
        .ok_or_else(|| bad("no data.kubeconfig".into()))?;
    let doc = yaml::parse(kubeconfig, &format!("{url} data.kubeconfig"))?;
    let ca = yaml::items(&doc["clusters"], url, "clusters")?
        .first()
        .and_then(|c| yaml::scalar(&c["cluster"]["certificate-authority-data"]))
        .ok_or_else(|| {
            bad("its kubeconfig has no cluster with certificate-authority-data".into())
        })?;
    let pem = crate::net::kubeconfig::b64(&ca, url, "certificate-authority-data")?;
    let mut offered = Vec::new();
    for item in ureq::tls::parse_pem(&pem) {
        if let Ok(ureq::tls::PemItem::Certificate(c)) = item {
            let pin = crate::crypto::x509::spki_sha256(c.der());
            if pin.as_ref().is_some_and(|p| pins.contains(p)) {
                let mut tls = Tls::default();
                tls.roots.push(c.to_owned());
                tls.sources.push(format!(
                    "the CA of cluster-info at {endpoint}, pinned by {name} ({})",
                    pin.unwrap_or_default()
                ));
                tls.fix = Some(format!(
                    "discovery.bootstrapToken.caCertHashes in {name} (the cluster's CA)"
                ));
                return Ok(tls);
            }
            offered.push(pin.unwrap_or_else(|| "an unreadable certificate".into()));
        }
    }
    Err(bad(format!(
        "its CA ({}) matches none of caCertHashes ({}): not the cluster {name} names, or the \
         hashes are out of date",
        if offered.is_empty() {
            "no certificate".to_string()
        } else {
            offered.join(", ")
        },
        pins.join(", ")
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PIN: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn token_config(extra: &str) -> String {
        format!(
            "apiVersion: kubeadm.k8s.io/v1beta4\nkind: JoinConfiguration\ndiscovery:\n  bootstrapToken:\n    apiServerEndpoint: 10.0.0.1:6443\n    token: abcdef.0123456789abcdef\n{extra}"
        )
    }

    #[test]
    fn token_discovery_takes_the_endpoint_token_and_pins() {
        let text = format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n---\n{}",
            token_config(&format!(
                "    caCertHashes: [\"{}\"]\n",
                PIN.to_uppercase().replace("SHA256", "sha256")
            ))
        );
        let d = parse(&text, "join.yaml").unwrap();
        assert!(
            d == Discovery::Token {
                endpoint: "10.0.0.1:6443".into(),
                token: "abcdef.0123456789abcdef".into(),
                pins: vec![PIN.into()],
            }
        );
    }

    #[test]
    fn what_kubeadm_would_refuse_or_nodestrap_cannot_trust_is_named() {
        for (text, says) in [
            (token_config(""), "caCertHashes: none"),
            (
                token_config("    unsafeSkipCAVerification: true\n"),
                "whatever unsafeSkipCAVerification says",
            ),
            (
                token_config("    caCertHashes: [\"md5:00\"]\n"),
                "expected sha256:<64 hex digits>",
            ),
            (
                token_config(&format!("    caCertHashes: [\"{PIN}\"]\n  file:\n    kubeConfigPath: /x\n")),
                "bootstrapToken and file are both set",
            ),
            (
                token_config(&format!("    caCertHashes: [\"{PIN}\"]\n"))
                    .replace("abcdef.0123456789abcdef", "not-a-token"),
                "not a bootstrap token",
            ),
            (
                token_config(&format!("    caCertHashes: [\"{PIN}\"]\n")).replace("v1beta4", "v1beta2"),
                "apiVersion \"kubeadm.k8s.io/v1beta2\"",
            ),
            (
                "apiVersion: kubeadm.k8s.io/v1beta4\nkind: InitConfiguration\n".into(),
                "no document of kind JoinConfiguration",
            ),
            (
                "apiVersion: kubeadm.k8s.io/v1beta4\nkind: JoinConfiguration\ndiscovery:\n  file:\n    kubeConfigPath: https://x/y\n".into(),
                "not a URL",
            ),
            (
                "apiVersion: kubeadm.k8s.io/v1beta4\nkind: JoinConfiguration\n".into(),
                "neither bootstrapToken nor file",
            ),
        ] {
            let e = match parse(&text, "join.yaml") {
                Err(e) => e.to_string(),
                Ok(_) => panic!("accepted: {text}"),
            };
            assert!(e.starts_with("join.yaml: ") && e.contains(says), "{e}");
            // The token never appears in an error.
            assert!(!e.contains("0123456789abcdef"), "{e}");
        }
    }

    #[test]
    fn file_discovery_names_a_kubeconfig_on_the_node() {
        let d = parse(
            "apiVersion: kubeadm.k8s.io/v1beta3\nkind: JoinConfiguration\ndiscovery:\n  file:\n    kubeConfigPath: /etc/kubernetes/discovery.conf\n",
            "join.yaml",
        )
        .unwrap();
        assert!(d == Discovery::File("/etc/kubernetes/discovery.conf".into()));
    }
}
