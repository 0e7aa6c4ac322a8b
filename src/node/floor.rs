//! Versions only go forward: per component (an extension, a torcx image), the highest version
//! a run of this node staged. Nothing lower is staged again, whatever is offered, signed, fresh
//! or already on disk (equal is a repair), unless a setting names the exact version
//! (`--allow-downgrade NAME=VERSION`), which lowers the floor and is recorded. Each payload
//! keeps its floors in its own file under /var/lib/nodestrap, which outlives the images
//! (docs/bootstrap.md, "Versions only go forward").

use serde::{Deserialize, Serialize};

/// Floors kept: a node manages a handful of components.
const MAX: usize = 32;

/// A release version: dot-separated numbers (`1.32.4`, `17.03`), compared number by number.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version(pub Vec<u64>);

impl Version {
    /// `v1.32.4`, `1.32.4`, `17.03`: 1 to 4 numbers of at most 9 digits.
    pub fn parse(s: &str) -> Option<Version> {
        let s = s.strip_prefix('v').unwrap_or(s);
        let parts: Option<Vec<u64>> = s
            .split('.')
            .map(|p| {
                (!p.is_empty() && p.len() <= 9 && p.bytes().all(|b| b.is_ascii_digit()))
                    .then(|| p.parse().ok())?
            })
            .collect();
        parts.filter(|p| (1..=4).contains(&p.len())).map(Version)
    }

    /// `(major, minor)`; a lone major has minor 0.
    pub(crate) fn minor(&self) -> (u64, u64) {
        (self.0[0], self.0.get(1).copied().unwrap_or(0))
    }

    /// Whether `self` is `prefix` or in its stream (`1.7.24` is in `1.7`).
    pub(crate) fn within(&self, prefix: &Version) -> bool {
        self.0.starts_with(&prefix.0)
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s: Vec<String> = self.0.iter().map(u64::to_string).collect();
        f.write_str(&s.join("."))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Floor {
    pub name: String,
    /// As the component's name spells it (`v1.37.2`, `1.7.24`, `17.03`).
    pub(crate) version: String,
    /// RFC 3339, when it was staged.
    pub(crate) at: String,
    /// `raised` by a run that staged it, `lowered` by an explicit downgrade, or `back` to the
    /// known-good version when the boot check refused the image that raised it.
    pub(crate) how: String,
}

/// The floors of one payload, one per component.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Floors(Vec<Floor>);

impl Floors {
    pub fn iter(&self) -> std::slice::Iter<'_, Floor> {
        self.0.iter()
    }

    /// The floor of `name`, parsed; `None` without one (or one not a version).
    pub fn of(&self, name: &str) -> Option<(Version, &Floor)> {
        let f = self.0.iter().find(|f| f.name == name)?;
        Some((Version::parse(&f.version)?, f))
    }

    /// `name` staged at `version` (`label` as it is spelled): the floor rises to it, or,
    /// `lowered` (an explicit downgrade), goes down to it.
    pub fn staged(&mut self, name: &str, version: &Version, label: &str, at: &str, lowered: bool) {
        let higher = self.of(name).is_none_or(|(f, _)| *version > f);
        if !higher && !lowered {
            return;
        }
        let f = Floor {
            name: name.to_string(),
            version: label.to_string(),
            at: at.to_string(),
            how: if lowered && !higher {
                "lowered"
            } else {
                "raised"
            }
            .to_string(),
        };
        if let Some(x) = self.0.iter_mut().find(|x| x.name == name) {
            *x = f;
        } else if self.0.len() < MAX {
            self.0.push(f);
        }
    }

    /// The boot check refused `name` at `version`: a version that did not run as named holds
    /// no floor; it goes back to `known` (the known-good version), or away without one.
    pub(crate) fn back(&mut self, name: &str, version: &str, known: Option<&str>, at: &str) {
        let Some(i) = self
            .0
            .iter()
            .position(|f| f.name == name && f.version == version)
        else {
            return;
        };
        match known {
            Some(v) => {
                self.0[i] = Floor {
                    name: name.to_string(),
                    version: v.to_string(),
                    at: at.to_string(),
                    how: "back".to_string(),
                }
            }
            None => {
                self.0.remove(i);
            }
        }
    }
}

/// The version `--allow-downgrade` names for `name`, if it names one.
pub(crate) fn allowed(downgrades: &[(String, String)], name: &str) -> Option<Version> {
    downgrades
        .iter()
        .find(|(n, _)| n == name)
        .and_then(|(_, v)| Version::parse(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_only_rises_unless_lowered_or_sent_back() {
        let mut k = Floors::default();
        let v = |s: &str| Version::parse(s).unwrap();
        k.staged("kubernetes", &v("1.37.2"), "v1.37.2", "t1", false);
        k.staged("kubernetes", &v("1.37.1"), "v1.37.1", "t2", false);
        assert_eq!(k.of("kubernetes").unwrap().1.version, "v1.37.2");
        k.staged("kubernetes", &v("1.37.1"), "v1.37.1", "t3", true);
        let (_, f) = k.of("kubernetes").unwrap();
        assert_eq!((f.version.as_str(), f.how.as_str()), ("v1.37.1", "lowered"));
        k.staged("kubernetes", &v("1.37.3"), "v1.37.3", "t4", false);
        assert_eq!(k.of("kubernetes").unwrap().1.how, "raised");
        assert!(k.of("containerd").is_none());
        k.back("kubernetes", "v1.37.3", Some("v1.37.1"), "t5");
        assert_eq!(k.of("kubernetes").unwrap().1.how, "back");
        k.back("kubernetes", "v1.37.1", None, "t6");
        assert!(k.of("kubernetes").is_none());
        k.staged("docker", &v("17.09"), "17.09", "t7", false);
        k.staged("docker", &v("17.03"), "17.03", "t8", false);
        assert_eq!(k.of("docker").unwrap().1.version, "17.09");
    }

    #[test]
    fn versions_compare_number_by_number() {
        let v = |s: &str| Version::parse(s).unwrap();
        assert!(v("17.09") > v("17.3"));
        assert!(v("v1.37.10") > v("1.37.9"));
        assert_eq!(v("17.03"), v("17.3"));
        assert!(Version::parse("com.coreos.cl").is_none());
        assert!(Version::parse("1.2.3.4.5").is_none());
        assert_eq!(
            allowed(&[("docker".into(), "17.03".into())], "docker"),
            Some(v("17.3"))
        );
    }
}
