//! Where an artifact is: a repository as a release directory, an artifact pinned by digest,
//! and the names the distribution spec allows.

use crate::crypto::digest::Digest;
use crate::error::{Error, Result};

/// `oci://HOST[:PORT]/REPO/`: a repository standing for a release directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Location {
    /// `host` or `host:port`, as it is written in credentials and `hosts.toml`.
    pub(crate) host: String,
    pub(crate) repo: String,
}

impl Location {
    /// `Some` for an `oci://` directory URL (a trailing slash allowed), `None` for any other
    /// scheme; an `oci://` URL that is not a valid reference is an error naming the rule.
    pub(crate) fn parse_dir(url: &str) -> Result<Option<Location>> {
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
    pub(crate) fn show(&self, file: &str) -> String {
        format!("oci://{}/{}:{file}", self.host, self.repo)
    }
}

/// `oci://HOST[:PORT]/REPOSITORY@sha256:<hex>`: one artifact pinned by its manifest's digest (a
/// torcx manifest's location). Signed in the list that names it, so no tag is ever resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reference {
    pub(crate) loc: Location,
    pub(crate) manifest: Digest,
}

impl Reference {
    /// `Some` for an `oci://` URL, `None` for any other scheme; an `oci://` URL that is not a
    /// digest-pinned reference is an error naming the rule.
    pub(crate) fn parse(url: &str) -> Result<Option<Reference>> {
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
pub(crate) fn image_repository(s: &str) -> bool {
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
pub(crate) fn image_tag(t: &str) -> bool {
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
pub(super) fn tag(file: &str) -> Result<&str> {
    if image_tag(file) {
        Ok(file)
    } else {
        Err(Error::failed(format!(
            "{file:?} cannot be an OCI tag ([A-Za-z0-9_][A-Za-z0-9._-], at most 128): it cannot come from a registry"
        )))
    }
}

/// A `sha256:<hex>` digest (the only algorithm registries must support).
pub(super) fn oci_digest(s: &str) -> Option<Digest> {
    let hex = s.strip_prefix("sha256:")?;
    Digest::parse(&format!("sha256-{hex}"))
}

pub(super) fn oci_name(d: &Digest) -> String {
    format!("{}:{}", d.algo_name(), d.hex)
}
