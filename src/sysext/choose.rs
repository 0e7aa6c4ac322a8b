//! Which images a node gets: the Kubernetes image by the cluster's version and the version-skew
//! policy, the runtime image by the runtime mappings (docs/bootstrap.md, "sysext").

use crate::error::{Error, Result};
use crate::node::mappings::Mappings;
use crate::sysext::sums::{Image, Version};

/// At most this many names of a list go into a message.
const SHOWN: usize = 12;

/// What the version asks of the Kubernetes image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Want {
    /// The cluster's version (from the API server or the node's files): its minor, with the
    /// version-skew policy's older minors when the source has none.
    Cluster,
    /// `--force-kube-version v1.31.7`: that patch and nothing else.
    Patch,
    /// `--force-kube-version v1.31`: the newest patch of that minor and nothing else.
    Minor,
}

/// The Kubernetes image for `cluster` (`v1.32.4`, or `v1.32` for `Want::Minor`) as `want`
/// says. For the cluster's version: the newest patch of the cluster's minor; if the source has
/// none, the newest patch of the newest older minor the version-skew policy allows (3 minors
/// older, 2 below 1.25); never a newer minor than the API server's. Returns the image and the
/// sentence that says why.
pub(crate) fn kubernetes(
    cluster: &str,
    want: Want,
    offered: &[Image],
    source: &str,
) -> Result<(Image, String)> {
    let parts = if want == Want::Minor { 2 } else { 3 };
    let v = Version::parse(cluster.split(['-', '+']).next().unwrap_or(cluster))
        .filter(|v| v.0.len() == parts)
        .ok_or_else(|| {
            Error::failed(format!(
                "Kubernetes version {cluster:?} is not a version like {}",
                if parts == 2 { "v1.32" } else { "v1.32.4" }
            ))
        })?;
    let (major, minor) = v.minor();
    let newest_of = |m: u64| {
        offered
            .iter()
            .filter(|i| i.version.0.len() >= 2 && i.version.minor() == (major, m))
            .max_by(|a, b| a.version.cmp(&b.version))
    };
    if want == Want::Patch {
        if let Some(i) = offered.iter().find(|i| i.version == v) {
            return Ok((
                i.clone(),
                "the patch --force-kube-version names".to_string(),
            ));
        }
        return Err(Error::failed(format!(
            "--force-kube-version {cluster}: {source} has no kubernetes {cluster}: it offers {} (v{major}.{minor} alone takes the newest patch of the minor)",
            shown(offered)
        )));
    }
    if let Some(i) = newest_of(minor) {
        if want == Want::Minor {
            let why = format!("newest patch of {major}.{minor}, the minor --force-kube-version names, that {source} offers");
            return Ok((i.clone(), why));
        }
        let why =
            format!("newest patch of the cluster's minor {major}.{minor} that {source} offers");
        return Ok((i.clone(), why));
    }
    if want == Want::Minor {
        return Err(Error::failed(format!(
            "--force-kube-version {cluster}: {source} has no kubernetes {major}.{minor}: it offers {}",
            shown(offered)
        )));
    }
    for older in (0..minor).rev().take(3) {
        if minor - older > skew(older) {
            break;
        }
        if let Some(i) = newest_of(older) {
            let why = format!(
                "{source} offers no {major}.{minor}; {major}.{older} is {} minor(s) older than the API server, within the version-skew policy",
                minor - older
            );
            crate::warn!("{why}");
            return Ok((i.clone(), why));
        }
    }
    Err(Error::failed(format!(
        "no Kubernetes image for a {major}.{minor} cluster: a kubelet must be {major}.{minor} or at most {} minors older, and {source} offers {}",
        skew(minor.saturating_sub(1)),
        shown(offered)
    )))
}

/// The images offered, for a message: sorted, at most `SHOWN`.
fn shown(offered: &[Image]) -> String {
    let mut names: Vec<String> = offered.iter().map(Image::label).collect();
    names.sort();
    if names.is_empty() {
        "nothing for this architecture".to_string()
    } else if names.len() > SHOWN {
        format!("{} … ({} in all)", names[..SHOWN].join(", "), names.len())
    } else {
        names.join(", ")
    }
}

/// How many minors a kubelet of minor `m` may lag the API server (kubernetes/website,
/// version-skew-policy: 3 from 1.25 on, 2 before).
fn skew(m: u64) -> u64 {
    if m >= 25 {
        3
    } else {
        2
    }
}

/// The runtime the mappings name for the cluster's minor: (name, preferred versions, source).
/// `None` when the mappings name none for it.
pub(crate) fn runtime(m: &Mappings, cluster: &str) -> Result<Option<(String, Vec<Version>)>> {
    let Some(entries) = m.runtimes_for(cluster) else {
        crate::info!(
            "no runtime extension: {} has no entry for Kubernetes {cluster}'s minor",
            m.source
        );
        return Ok(None);
    };
    let mut known = entries
        .iter()
        .filter(|(w, _)| w == "containerd" || w == "docker");
    let Some((name, list)) = known.next() else {
        crate::info!(
            "no runtime extension: {} names neither containerd nor docker for Kubernetes {cluster}",
            m.source
        );
        return Ok(None);
    };
    if let Some((other, _)) = known.next() {
        crate::info!("{}: {name} comes first, {other} is not staged", m.source);
    }
    let versions = list
        .iter()
        .map(|v| {
            Version::parse(v).ok_or_else(|| {
                Error::failed(format!(
                    "{}: {name} version {v:?} for Kubernetes {cluster} is not a version like 1.7 or 1.7.24",
                    m.source
                ))
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Some((name.clone(), versions)))
}

/// The newest offered image in the first preferred version stream that has one.
pub(crate) fn runtime_image(
    name: &str,
    wanted: &[Version],
    offered: &[Image],
    source: &str,
) -> Result<Image> {
    for w in wanted {
        if let Some(i) = offered
            .iter()
            .filter(|i| i.version.within(w))
            .max_by(|a, b| a.version.cmp(&b.version))
        {
            return Ok(i.clone());
        }
    }
    let want: Vec<String> = wanted.iter().map(Version::to_string).collect();
    let mut have: Vec<String> = offered.iter().map(Image::label).collect();
    have.truncate(SHOWN);
    Err(Error::failed(format!(
        "no {name} image in {}: the mappings ask for {}; {source} offers {}",
        want.join(" or "),
        want.join(", "),
        if have.is_empty() {
            "none".into()
        } else {
            have.join(", ")
        }
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::digest::Digest;

    fn imgs(vs: &[&str]) -> Vec<Image> {
        vs.iter()
            .map(|v| Image {
                name: "kubernetes".into(),
                version: Version::parse(v).unwrap(),
                v_prefix: true,
                arch: "x86-64".into(),
                file: format!("kubernetes-v{v}-x86-64.raw"),
                digest: Digest::parse(&format!("sha256-{}", "0".repeat(64))).unwrap(),
            })
            .collect()
    }

    #[test]
    fn newest_patch_of_the_cluster_minor() {
        let o = imgs(&["1.31.9", "1.32.1", "1.32.10", "1.32.3", "1.33.0"]);
        let (i, why) = kubernetes("v1.32.4", Want::Cluster, &o, "s").unwrap();
        assert_eq!(i.label(), "v1.32.10");
        assert!(why.contains("newest patch"));
        // Never a newer minor.
        let (i, _) = kubernetes("v1.30.2", Want::Cluster, &o, "s").unwrap_err_or_ok();
        assert!(i.is_none());
    }

    #[test]
    fn older_minor_within_skew_and_none_names_the_offer() {
        let o = imgs(&["1.29.5", "1.30.1"]);
        let (i, why) = kubernetes("v1.32.0", Want::Cluster, &o, "s").unwrap();
        assert_eq!(i.label(), "v1.30.1");
        assert!(why.contains("2 minor(s) older"), "{why}");
        // 1.28 is 4 minors behind 1.32: outside the policy.
        let e = kubernetes("v1.32.0", Want::Cluster, &imgs(&["1.28.9"]), "s")
            .unwrap_err()
            .to_string();
        assert!(e.contains("offers v1.28.9"), "{e}");
        // Before 1.25 the policy allowed 2.
        assert!(kubernetes("v1.24.0", Want::Cluster, &imgs(&["1.21.0"]), "s").is_err());
        assert!(kubernetes("v1.24.0", Want::Cluster, &imgs(&["1.22.3"]), "s").is_ok());
        assert!(kubernetes("1.32", Want::Cluster, &o, "s").is_err());
    }

    #[test]
    fn a_forced_patch_is_that_patch_and_a_forced_minor_its_newest() {
        let o = imgs(&["1.31.7", "1.31.9", "1.32.1"]);
        let (i, why) = kubernetes("v1.31.7", Want::Patch, &o, "s").unwrap();
        assert_eq!(
            (i.label().as_str(), why.contains("--force-kube-version")),
            ("v1.31.7", true)
        );
        let e = kubernetes("v1.31.8", Want::Patch, &o, "s")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("s has no kubernetes v1.31.8: it offers v1.31.7, v1.31.9, v1.32.1"),
            "{e}"
        );
        let (i, _) = kubernetes("v1.31", Want::Minor, &o, "s").unwrap();
        assert_eq!(i.label(), "v1.31.9");
        // A forced minor is that minor: no older one stands in.
        let e = kubernetes("v1.33", Want::Minor, &o, "s")
            .unwrap_err()
            .to_string();
        assert!(e.contains("has no kubernetes 1.33"), "{e}");
        assert!(kubernetes("v1.31", Want::Patch, &o, "s").is_err());
    }

    trait OrNone {
        fn unwrap_err_or_ok(self) -> (Option<Image>, String);
    }
    impl OrNone for Result<(Image, String)> {
        fn unwrap_err_or_ok(self) -> (Option<Image>, String) {
            match self {
                Ok((i, w)) => (Some(i), w),
                Err(e) => (None, e.to_string()),
            }
        }
    }

    #[test]
    fn runtime_from_mappings() {
        let m = Mappings::parse(
            "kind: VersionManifestV1\nversions:\n  k8s:\n    \"1.32\":\n      podman: [\"5\"]\n      containerd: [\"2.0\", \"1.7\"]\n",
            "f",
        )
        .unwrap();
        let (name, vs) = runtime(&m, "v1.32.4").unwrap().unwrap();
        assert_eq!(name, "containerd");
        let mut o = imgs(&["1.7.20", "1.7.24", "1.6.9"]);
        for i in &mut o {
            i.name = "containerd".into();
        }
        assert_eq!(
            runtime_image(&name, &vs, &o, "s").unwrap().label(),
            "v1.7.24"
        );
        assert!(runtime(&m, "v1.31.0").unwrap().is_none());
        let e = runtime_image(&name, &vs[..1], &o, "s")
            .unwrap_err()
            .to_string();
        assert!(e.contains("no containerd image in 2.0"), "{e}");
    }
}
