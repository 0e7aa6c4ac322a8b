//! Runtime mappings (`kind: VersionManifestV1`): Kubernetes minor version to the container
//! runtime versions it supports, most preferred first.

use crate::error::{Error, Result};
use crate::yaml;

/// `(key, value)` pairs in file order: YAML maps whose order carries preference.
type Ordered<T> = Vec<(String, T)>;

#[derive(Debug)]
pub struct Mappings {
    /// versions[have][minor][want] = [preferred...], in file order.
    versions: Ordered<Ordered<Ordered<Vec<String>>>>,
    pub(crate) source: String,
}

impl Mappings {
    pub fn parse(text: &str, source: &str) -> Result<Mappings> {
        let doc = yaml::parse(text, source)?;
        match yaml::opt_str(&doc, "kind", source)? {
            Some(k) if k == "VersionManifestV1" => {}
            Some(k) => {
                return Err(Error::failed(format!(
                    "{source}: kind is {k:?}, expected \"VersionManifestV1\""
                )))
            }
            None => {
                return Err(Error::failed(format!(
                    "{source}: no kind (expected \"VersionManifestV1\")"
                )))
            }
        }
        let mut versions = Vec::new();
        for (have, minors) in yaml::entries(&doc["versions"], source, "versions")? {
            let mut ms = Vec::new();
            for (minor, wants) in yaml::entries(minors, source, &format!("versions.{have}"))? {
                let mut ws = Vec::new();
                for (want, list) in
                    yaml::entries(wants, source, &format!("versions.{have}.{minor}"))?
                {
                    let field = format!("versions.{have}.{minor}.{want}");
                    let vs = yaml::items(list, source, &field)?
                        .iter()
                        .map(|v| {
                            yaml::scalar(v).ok_or_else(|| {
                                Error::failed(format!("{source}: {field}: entries must be strings"))
                            })
                        })
                        .collect::<Result<Vec<_>>>()?;
                    ws.push((want, vs));
                }
                ms.push((minor, ws));
            }
            versions.push((have, ms));
        }
        Ok(Mappings {
            versions,
            source: source.to_string(),
        })
    }

    /// Preferred `want` versions for Kubernetes `k8s_version` (`v1.10.2+coreos.0` → key `1.10`).
    pub fn runtime_for(&self, k8s_version: &str, want: &str) -> Result<Vec<String>> {
        let minor = minor_of(k8s_version).ok_or_else(|| {
            Error::failed(format!(
                "Kubernetes version {k8s_version:?} is not a semantic version"
            ))
        })?;
        let src = &self.source;
        let (_, minors) = self
            .versions
            .iter()
            .find(|(h, _)| h == "k8s")
            .ok_or_else(|| Error::failed(format!("{src}: no versions.k8s table")))?;
        let (_, wants) = minors.iter().find(|(m, _)| *m == minor).ok_or_else(|| {
            Error::failed(format!(
                "{src}: no entry for Kubernetes {minor} (from {k8s_version})"
            ))
        })?;
        match wants.iter().find(|(w, _)| w == want) {
            Some((_, list)) if !list.is_empty() => Ok(list.clone()),
            _ => Err(Error::failed(format!(
                "{src}: no {want} versions for Kubernetes {minor}"
            ))),
        }
    }
}

impl Mappings {
    /// Every runtime and its preferred versions for Kubernetes `k8s_version`'s minor, in file
    /// order; `None` when the minor (or the `k8s` table) has no entry.
    pub(crate) fn runtimes_for(&self, k8s_version: &str) -> Option<&[(String, Vec<String>)]> {
        let minor = minor_of(k8s_version)?;
        let (_, minors) = self.versions.iter().find(|(h, _)| h == "k8s")?;
        minors
            .iter()
            .find(|(m, _)| *m == minor)
            .map(|(_, w)| w.as_slice())
    }

    /// The Kubernetes minors the file maps, in file order (for messages).
    pub(crate) fn minors(&self) -> Vec<&str> {
        self.versions
            .iter()
            .filter(|(h, _)| h == "k8s")
            .flat_map(|(_, m)| m.iter().map(|(v, _)| v.as_str()))
            .collect()
    }
}

/// `v1.10.2+coreos.0` → `1.10`. The version must be semver-shaped: MAJOR.MINOR.PATCH with
/// optional pre-release and build parts.
/// `1.9` of a full version (`major_minor`) or of a minor alone (`v1.9`, as `--force-kube-version`
/// takes it).
pub(crate) fn minor_of(v: &str) -> Option<String> {
    major_minor(v).or_else(|| {
        let (a, b) = v.strip_prefix('v').unwrap_or(v).split_once('.')?;
        let num = |s: &str| {
            (!s.is_empty() && s.len() <= 9 && s.bytes().all(|c| c.is_ascii_digit()))
                .then(|| s.parse::<u64>().ok())
                .flatten()
        };
        Some(format!("{}.{}", num(a)?, num(b)?))
    })
}

/// Whether `v` names a minor only (`v1.31`), not a patch.
pub(crate) fn is_minor_only(v: &str) -> bool {
    major_minor(v).is_none() && minor_of(v).is_some()
}

pub fn major_minor(v: &str) -> Option<String> {
    let v = v.trim_start_matches('v');
    let core = v.split(['-', '+']).next()?;
    let parts: Vec<&str> = core.split('.').collect();
    if parts.len() != 3
        || !parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
    {
        return None;
    }
    let num = |s: &str| s.parse::<u64>().ok();
    Some(format!("{}.{}", num(parts[0])?, num(parts[1])?))
}

#[cfg(test)]
mod tests {
    use super::*;

    const INSTALLER: &str = "kind: VersionManifestV1\nversions:\n  k8s:\n    1.1:\n        docker: [ \"1.11\" ]\n    1.9:\n        docker: [ \"17.03\", \"1.12\"]\n    1.10:\n        docker: [ \"17.06\" ]\n";

    #[test]
    fn one_ten_is_not_one_one() {
        let m = Mappings::parse(INSTALLER, "t").unwrap();
        assert_eq!(
            m.runtime_for("v1.10.2+coreos.0", "docker").unwrap(),
            vec!["17.06"]
        );
        assert_eq!(m.runtime_for("v1.1.0", "docker").unwrap(), vec!["1.11"]);
        assert_eq!(
            m.runtime_for("v1.9.6+coreos.0", "docker").unwrap(),
            vec!["17.03", "1.12"]
        );
        assert!(m
            .runtime_for("v1.8.0", "docker")
            .unwrap_err()
            .to_string()
            .contains("no entry for Kubernetes 1.8"));
    }

    #[test]
    fn wrong_kind_and_bad_versions() {
        assert!(Mappings::parse("kind: Other\nversions: {}\n", "f")
            .unwrap_err()
            .to_string()
            .contains("kind is"));
        assert!(Mappings::parse("kind: VersionManifestV1\nversions: [1]\n", "f").is_err());
        assert!(Mappings::parse("kind: [\n", "f")
            .unwrap_err()
            .to_string()
            .contains("invalid YAML"));
        assert_eq!(major_minor("1.9.6_coreos.0"), None);
        assert_eq!(major_minor("v1.9.6-beta.1+x"), Some("1.9".into()));
    }
}
