//! The node's known-good set: the extensions `nodestrap verify` last found running as chosen
//! after a boot, and the images it found lying (another version runs than the name says, or
//! the image missing from the merge). A mismatch returns the node to the known-good set; the
//! bootstrap never stages a refused image again and never prunes a known-good one.
//! It also keeps what only goes forward: per extension the highest version a bootstrap staged
//! (the floor: never a lower one again, whatever is offered), and per source list the newest
//! BEST-BEFORE date accepted (an older signed list is stale). Kept at
//! `/var/lib/nodestrap/known-good.json` (docs/verify.md), which outlives the images.

use serde::{Deserialize, Serialize};

use crate::node::floor::Floors;
use crate::node::state_file::StateFile;
use crate::node::status::Chosen;
use crate::sysext::sums::Date;

pub(crate) const PATH: &str = "/var/lib/nodestrap/known-good.json";
/// Refusals kept, newest last: a node refuses a handful of images in its life.
const MAX_REFUSED: usize = 32;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct KnownGood {
    pub(crate) schema: u32,
    /// The last set found running as chosen; empty before the first verified boot.
    pub(crate) set: Vec<Chosen>,
    /// RFC 3339, when `set` was verified.
    pub(crate) verified: Option<String>,
    pub refused: Vec<Refused>,
    /// The boot in which a check last returned the node to `set`: once per boot, whatever
    /// bootstraps ran since.
    #[serde(default)]
    pub(crate) returned_boot: Option<String>,
    /// Per extension, the highest version staged: never a lower one again, unless a setting
    /// names it (docs/bootstrap.md, "Versions only go forward").
    #[serde(default)]
    pub floor: Floors,
    /// Per signed list (its URL), the newest BEST-BEFORE date accepted.
    #[serde(default)]
    pub(crate) lists: Vec<ListSeen>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ListSeen {
    pub(crate) url: String,
    /// `YYYY-MM-DD`.
    pub(crate) best_before: String,
    /// RFC 3339, when a run accepted it.
    pub(crate) at: String,
}

/// An image that failed the boot check: never staged again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refused {
    pub name: String,
    pub(crate) version: String,
    pub digest: String,
    pub(crate) why: String,
    /// RFC 3339.
    pub(crate) at: String,
}

impl StateFile for KnownGood {
    const PATH: &'static str = PATH;
    const WHAT: &'static str = "nodestrap's known-good set";
    const SCHEMA: u32 = 1;
    const CAP: u64 = 256 << 10;

    fn schema(&self) -> u32 {
        self.schema
    }

    /// Empty: before the first verified boot, nothing refused, no floor.
    fn empty() -> Self {
        KnownGood {
            schema: Self::SCHEMA,
            ..Default::default()
        }
    }
}

impl KnownGood {
    /// Why `digest` of `name` was refused, if it was.
    pub fn refusal(&self, name: &str, digest: &str) -> Option<&Refused> {
        self.refused
            .iter()
            .find(|r| r.name == name && r.digest == digest)
    }

    pub(crate) fn refuse(&mut self, r: Refused) {
        if self.refusal(&r.name, &r.digest).is_some() {
            return;
        }
        self.refused.push(r);
        if self.refused.len() > MAX_REFUSED {
            self.refused.remove(0);
        }
    }

    /// The newest BEST-BEFORE date accepted for `url`.
    pub(crate) fn list_seen(&self, url: &str) -> Option<(Date, &ListSeen)> {
        let l = self.lists.iter().find(|l| l.url == url)?;
        Some((Date::parse(&l.best_before)?, l))
    }

    /// `url`'s list with `best_before` accepted: remembered when newer than the last.
    pub(crate) fn saw_list(&mut self, url: &str, best_before: Date, at: &str) {
        if self.list_seen(url).is_some_and(|(d, _)| d >= best_before) {
            return;
        }
        let l = ListSeen {
            url: url.to_string(),
            best_before: best_before.to_string(),
            at: at.to_string(),
        };
        match self.lists.iter_mut().find(|x| x.url == url) {
            Some(x) => *x = l,
            None => {
                self.lists.push(l);
                if self.lists.len() > MAX_REFUSED {
                    self.lists.remove(0);
                }
            }
        }
    }

    /// The known-good image of extension `name`, if there is one.
    pub(crate) fn image_of(&self, name: &str) -> Option<&Chosen> {
        self.set.iter().find(|c| c.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_only_get_newer() {
        let mut k = KnownGood::default();
        let d = |s: &str| Date::parse(s).unwrap();
        k.saw_list("u", d("2026-12-01"), "a");
        k.saw_list("u", d("2026-11-01"), "b");
        assert_eq!(k.list_seen("u").unwrap().1.best_before, "2026-12-01");
        k.saw_list("u", d("2027-01-01"), "c");
        assert_eq!(k.list_seen("u").unwrap().1.at, "c");
    }

    #[test]
    fn refusals_are_kept_once_and_bounded() {
        let mut k = KnownGood::default();
        for i in 0..40 {
            let r = Refused {
                name: "kubernetes".into(),
                version: format!("v1.32.{i}"),
                digest: format!("sha256-{i}"),
                why: "lies".into(),
                at: String::new(),
            };
            k.refuse(r.clone());
            k.refuse(r);
        }
        assert_eq!(k.refused.len(), MAX_REFUSED);
        assert!(k.refusal("kubernetes", "sha256-39").is_some());
        assert!(k.refusal("kubernetes", "sha256-0").is_none());
        assert!(k.refusal("containerd", "sha256-39").is_none());
    }
}
