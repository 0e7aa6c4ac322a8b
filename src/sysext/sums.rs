//! `SHA256SUMS`, the signed version index of a sysext source, read with systemd-sysupdate's
//! strictness (docs/bootstrap.md, "sysext"): valid UTF-8 without NUL, every line newline-
//! terminated, 64 hex digits, one space, then ` ` or `*`, then a bare file name. One bad line
//! refuses the whole list. `BEST-BEFORE-YYYY-MM-DD` lines are freshness markers, not payloads.

use crate::crypto::digest::Digest;
use crate::error::{excerpt, Error, Result};
pub use crate::node::floor::Version;

/// The budget of one list: the bakery's per-extension list holds a few hundred lines.
pub(crate) const MAX_BYTES: u64 = 1 << 20;
pub const MAX_LINES: usize = 20_000;
const BEST_BEFORE: &str = "BEST-BEFORE-";

#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub file: String,
    pub digest: Digest,
}

/// A calendar date from a `BEST-BEFORE-` marker, valid from 00:00 UTC of that day.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Date {
    pub(crate) y: u32,
    pub(crate) m: u32,
    pub(crate) d: u32,
}

impl Date {
    /// Only the normalised spelling (`2026-01-05`) of a real date, as sysupdate takes it.
    pub(crate) fn parse(s: &str) -> Option<Date> {
        let b = s.as_bytes();
        if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
            return None;
        }
        let num = |r: std::ops::Range<usize>| -> Option<u32> {
            let p = &s[r];
            p.bytes()
                .all(|c| c.is_ascii_digit())
                .then(|| p.parse().ok())?
        };
        let (y, m, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
        let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
        let days = [
            31,
            if leap { 29 } else { 28 },
            31,
            30,
            31,
            30,
            31,
            31,
            30,
            31,
            30,
            31,
        ];
        (y >= 1970 && (1..=12).contains(&m) && d >= 1 && d <= days[m as usize - 1])
            .then_some(Date { y, m, d })
    }

    /// Seconds since the epoch at 00:00 UTC of this day.
    pub fn epoch_secs(&self) -> u64 {
        // Days from civil (Howard Hinnant's algorithm), for dates from 1970 on.
        let (y, m, d) = (self.y as i64, self.m as i64, self.d as i64);
        let y = if m <= 2 { y - 1 } else { y };
        let era = y.div_euclid(400);
        let yoe = y - era * 400;
        let mp = (m + 9) % 12;
        let doy = (153 * mp + 2) / 5 + d - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        let days = era * 146_097 + doe - 719_468;
        (days.max(0) as u64) * 86_400
    }
}

impl std::fmt::Display for Date {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:04}-{:02}-{:02}", self.y, self.m, self.d)
    }
}

#[derive(Debug, Default, Clone, PartialEq)]
pub struct Sums {
    pub entries: Vec<Entry>,
    pub best_before: Vec<Date>,
}

impl Sums {
    /// Parse `data`; `name` (the URL) is how errors name the list.
    pub fn parse(data: &[u8], name: &str) -> Result<Sums> {
        let bad = |why: String| Error::failed(format!("{name}: {why}"));
        if data.len() as u64 > MAX_BYTES {
            return Err(bad(format!("over the {MAX_BYTES}-byte limit")));
        }
        if data.contains(&0) {
            return Err(bad("contains a NUL byte".into()));
        }
        let text = std::str::from_utf8(data).map_err(|_| bad("not UTF-8 text".into()))?;
        if !text.is_empty() && !text.ends_with('\n') {
            return Err(bad("the last line is not terminated by a newline".into()));
        }
        let mut out = Sums::default();
        for (i, line) in text.split_terminator('\n').enumerate() {
            let n = i + 1;
            if n > MAX_LINES {
                return Err(bad(format!("more than {MAX_LINES} lines")));
            }
            let err = |why: &str| bad(format!("line {n}: {why}: \"{}\"", excerpt(line, 100)));
            let (hex, rest) = (line.get(..64), line.get(64..));
            let (Some(hex), Some(rest)) = (hex, rest) else {
                return Err(err("expected a SHA-256 in hex, a space, and a file name"));
            };
            let digest = Digest::parse(&format!("sha256-{hex}"))
                .ok_or_else(|| err("not a SHA-256 in hex"))?;
            let file = rest
                .strip_prefix("  ")
                .or_else(|| rest.strip_prefix(" *"))
                .ok_or_else(|| err("expected two spaces or \" *\" after the digest"))?;
            if file.is_empty()
                || file.contains('/')
                || file.starts_with('\\')
                || file == "."
                || file == ".."
                || file.chars().any(char::is_control)
            {
                return Err(err("not a bare file name"));
            }
            if let Some(date) = file.strip_prefix(BEST_BEFORE) {
                match Date::parse(date) {
                    Some(d) => out.best_before.push(d),
                    None => crate::warn!(
                        "{name}: line {n}: {file:?} is not a normalised BEST-BEFORE-YYYY-MM-DD date: ignored, as systemd-sysupdate ignores it"
                    ),
                }
                continue;
            }
            out.entries.push(Entry {
                file: file.to_string(),
                digest,
            });
        }
        Ok(out)
    }

    /// Refuse a list past any of its `BEST-BEFORE-` dates (00:00 UTC of that day), naming it.
    pub fn check_fresh(&self, now_secs: u64, name: &str) -> Result<()> {
        match self.best_before.iter().find(|d| now_secs >= d.epoch_secs()) {
            Some(d) => Err(Error::failed(format!(
                "{name}: out of date: its BEST-BEFORE-{d} marker passed at {d} 00:00 UTC; the source must publish a fresh signed list"
            ))),
            None => Ok(()),
        }
    }

    /// The images of extension `name` for architecture `arch`, named
    /// `<name>-v<version>-<arch>.raw` (the bakery drops the `v` for some: both are taken).
    pub fn images(&self, name: &str, arch: &str) -> Vec<Image> {
        self.named(name, arch, ".raw")
    }

    /// The release executables of `name` (nodestrap's own) for `arch`, named
    /// `<name>-v<version>-<arch>`, as `deploy/sign-sysext-source` lists them.
    pub(crate) fn executables(&self, name: &str, arch: &str) -> Vec<Image> {
        self.named(name, arch, "")
    }

    fn named(&self, name: &str, arch: &str, suffix: &str) -> Vec<Image> {
        self.entries
            .iter()
            .filter_map(|e| {
                let mid = e
                    .file
                    .strip_prefix(name)?
                    .strip_prefix('-')?
                    .strip_suffix(suffix)?
                    .strip_suffix(arch)?
                    .strip_suffix('-')?;
                let (v_prefix, v) = match mid.strip_prefix('v') {
                    Some(v) => (true, v),
                    None => (false, mid),
                };
                Some(Image {
                    name: name.to_string(),
                    version: Version::parse(v)?,
                    v_prefix,
                    arch: arch.to_string(),
                    file: e.file.clone(),
                    digest: e.digest.clone(),
                })
            })
            .collect()
    }
}

/// One image a list offers.
#[derive(Debug, Clone, PartialEq)]
pub struct Image {
    pub(crate) name: String,
    pub version: Version,
    /// Whether the file name spells the version with a `v` (`kubernetes-v1.32.4-…`).
    pub(crate) v_prefix: bool,
    pub(crate) arch: String,
    pub file: String,
    pub(crate) digest: Digest,
}

impl Image {
    /// The version as the file name spells it.
    pub fn label(&self) -> String {
        format!("{}{}", if self.v_prefix { "v" } else { "" }, self.version)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    #[test]
    fn strict_like_sysupdate() {
        let ok = format!("{H}  kubernetes-v1.32.4-x86-64.raw\n{H} *kubernetes-v1.31.9-x86-64.raw\n{H}  BEST-BEFORE-2030-01-31\n");
        let s = Sums::parse(ok.as_bytes(), "u").unwrap();
        assert_eq!(s.entries.len(), 2);
        assert_eq!(
            s.best_before,
            vec![Date {
                y: 2030,
                m: 1,
                d: 31
            }]
        );
        for (bad, why) in [
            (format!("{H}  a.raw"), "not terminated"),
            (format!("{H} a.raw\n"), "two spaces"),
            (format!("{}  a.raw\n", &H[1..]), "SHA-256"),
            (format!("{H}  dir/a.raw\n"), "bare file name"),
            (format!("{H}  \\a.raw\n"), "bare file name"),
            (format!("{H}  a\tb.raw\n"), "bare file name"),
            (format!("{H}  a.raw\n\n"), "line 2"),
            (format!("{H}  a.raw\0\n"), "NUL"),
        ] {
            let e = Sums::parse(bad.as_bytes(), "u").unwrap_err().to_string();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
        assert!(Sums::parse(&[0xff, b'\n'], "u").is_err());
        // An unnormalised date is ignored with a warning, as sysupdate does.
        let s = Sums::parse(format!("{H}  BEST-BEFORE-2030-1-31\n").as_bytes(), "u").unwrap();
        assert!(s.best_before.is_empty() && s.entries.is_empty());
    }

    #[test]
    fn best_before_from_midnight_utc() {
        let d = Date::parse("2026-11-24").unwrap();
        assert_eq!(d.epoch_secs(), 1_795_478_400);
        assert_eq!(Date::parse("1970-01-01").unwrap().epoch_secs(), 0);
        assert_eq!(Date::parse("2000-03-01").unwrap().epoch_secs(), 951_868_800);
        assert!(Date::parse("2025-02-29").is_none());
        assert!(Date::parse("2024-02-29").is_some());
        assert!(Date::parse("2024-13-01").is_none());
        let s = Sums {
            entries: vec![],
            best_before: vec![d],
        };
        assert!(s.check_fresh(d.epoch_secs() - 1, "u").is_ok());
        let e = s.check_fresh(d.epoch_secs(), "u").unwrap_err().to_string();
        assert!(e.contains("BEST-BEFORE-2026-11-24"), "{e}");
    }

    #[test]
    fn images_by_name_and_arch() {
        let text = format!(
            "{H}  kubernetes-v1.32.4-x86-64.raw\n{H}  kubernetes-v1.32.4-arm64.raw\n{H}  containerd-1.7.24-x86-64.raw\n{H}  kubernetes-v1.33.0-rc.1-x86-64.raw\n{H}  kubernetes-cni-v1.6.0-x86-64.raw\n{H}  kubernetes.conf\n"
        );
        let s = Sums::parse(text.as_bytes(), "u").unwrap();
        let k = s.images("kubernetes", "x86-64");
        assert_eq!(k.len(), 1);
        assert_eq!(k[0].label(), "v1.32.4");
        let c = s.images("containerd", "x86-64");
        assert_eq!((c[0].label().as_str(), c[0].v_prefix), ("1.7.24", false));
        assert!(Version::parse("1.7.24")
            .unwrap()
            .within(&Version::parse("1.7").unwrap()));
        assert!(!Version::parse("1.70.1")
            .unwrap()
            .within(&Version::parse("1.7").unwrap()));
        assert!(Version::parse("1.32.10").unwrap() > Version::parse("1.32.9").unwrap());
    }

    #[test]
    fn executables_have_no_suffix() {
        let text = format!(
            "{H}  nodestrap-v0.2.0-x86-64\n{H}  nodestrap-v0.2.0-arm64\n{H}  nodestrap-v0.3.0-x86-64.raw\n{H}  nodestrap-v0.2.0-x86-64.sig\n"
        );
        let s = Sums::parse(text.as_bytes(), "u").unwrap();
        let n = s.executables("nodestrap", "x86-64");
        assert_eq!(n.len(), 1);
        assert_eq!(
            (n[0].label().as_str(), n[0].file.as_str()),
            ("v0.2.0", "nodestrap-v0.2.0-x86-64")
        );
        assert_eq!(s.images("nodestrap", "x86-64")[0].label(), "v0.3.0");
    }
}
