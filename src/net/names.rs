//! Kubernetes' rules for the names nodestrap puts into request paths and objects: DNS labels
//! and subdomains (RFC 1123), a node's name, annotation and label keys.

use crate::error::{Error, Result};

/// A node's name as the API addresses it: a DNS subdomain (RFC 1123), since it goes into
/// request paths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NodeName(String);

impl NodeName {
    pub(crate) fn parse(s: &str) -> Option<NodeName> {
        dns_subdomain(s).then(|| NodeName(s.to_string()))
    }
}

impl std::ops::Deref for NodeName {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for NodeName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// `--node-name`, else `NODE` (the downward API's spec.nodeName).
pub(crate) fn node_name(flag: Option<&str>, env: Option<&str>) -> Result<NodeName> {
    let (n, from) = match (
        flag.filter(|n| !n.is_empty()),
        env.filter(|n| !n.is_empty()),
    ) {
        (Some(n), _) => (n, "--node-name"),
        (None, Some(n)) => (n, "NODE"),
        (None, None) => {
            return Err(Error::config(
                "no node name: give --node-name or set NODE (the downward API's spec.nodeName)",
            ))
        }
    };
    NodeName::parse(n).ok_or_else(|| {
        Error::config(format!(
            "{from} {n:?}: not a valid node name (a DNS subdomain)"
        ))
    })
}

/// A namespace's name: an RFC 1123 label (at most 63, no dots).
pub(crate) fn dns_label(s: &str) -> bool {
    s.len() <= 63 && !s.contains('.') && dns_subdomain(s)
}

pub(crate) fn dns_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

/// A Kubernetes annotation or label key: `[prefix/]name`, prefix a DNS subdomain, name at most 63
/// alphanumerics, `-`, `_`, `.`, beginning and ending alphanumeric.
pub(crate) fn check_key(flag: &str, key: &str) -> Result<()> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    if name_ok && prefix.is_none_or(dns_subdomain) {
        Ok(())
    } else {
        Err(Error::config(format!(
            "{flag} {key:?}: not a valid key ([prefix/]name)"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_name_from_flag_else_env() {
        assert_eq!(&*node_name(Some("n1"), Some("n2")).unwrap(), "n1");
        assert_eq!(&*node_name(Some(""), Some("n2")).unwrap(), "n2");
        assert_eq!(
            &*node_name(None, Some("ip-10-0-0-1.ec2.internal")).unwrap(),
            "ip-10-0-0-1.ec2.internal"
        );
        for (flag, env) in [(None, None), (Some(""), Some(""))] {
            assert_eq!(node_name(flag, env).unwrap_err().exit_code(), 2);
        }
        for bad in ["a/b", "../x", "N1", "a?b", "-a", "a..b"] {
            assert_eq!(
                node_name(Some(bad), None).unwrap_err().exit_code(),
                2,
                "{bad}"
            );
        }
    }

    #[test]
    fn annotation_keys() {
        for ok in [
            "container-linux-update.v1.coreos.com/tectonic-torcx-pre-hook-ok",
            "ok",
            "example.com/pre-hook_ok.v1",
        ] {
            check_key("--node-annotation", ok).unwrap();
        }
        for bad in [
            "",
            "/x",
            "a/",
            "Example.com/x",
            "a b",
            "x/-y",
            "a/b/c",
            &"x".repeat(64),
        ] {
            assert!(check_key("--node-annotation", bad).is_err(), "{bad:?}");
        }
    }
}
