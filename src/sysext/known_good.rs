//! The node's known-good set: the extensions `nodestrap verify` last found running as chosen
//! after a boot, and the images it found lying (another version runs than the name says, or
//! the image missing from the merge). A mismatch returns the node to the known-good set; the
//! bootstrap never stages a refused image again and never prunes a known-good one.
//! Kept at `/var/lib/nodestrap/known-good.json` (docs/verify.md).

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::node::root::Root;
use crate::node::status::Chosen;

pub const PATH: &str = "/var/lib/nodestrap/known-good.json";
const SCHEMA: u32 = 1;
/// A small file; a larger one is not ours.
const CAP: u64 = 256 << 10;
/// Refusals kept, newest last: a node refuses a handful of images in its life.
const MAX_REFUSED: usize = 32;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct KnownGood {
    pub schema: u32,
    /// The last set found running as chosen; empty before the first verified boot.
    pub set: Vec<Chosen>,
    /// RFC 3339, when `set` was verified.
    pub verified: Option<String>,
    pub refused: Vec<Refused>,
    /// The boot in which a check last returned the node to `set`: once per boot, whatever
    /// bootstraps ran since.
    #[serde(default)]
    pub returned_boot: Option<String>,
}

/// An image that failed the boot check: never staged again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refused {
    pub name: String,
    pub version: String,
    pub digest: String,
    pub why: String,
    /// RFC 3339.
    pub at: String,
}

impl KnownGood {
    /// The file under `root`, or an empty one when there is none. A file that is not ours is an
    /// error naming it: a node that cannot tell its refused images must not guess.
    pub fn load(root: &Root) -> Result<KnownGood> {
        let Some(bytes) = root.read(PATH, CAP)? else {
            return Ok(KnownGood {
                schema: SCHEMA,
                ..Default::default()
            });
        };
        KnownGood::from_json(&bytes, &root.show(PATH))
    }

    /// The file's bytes as read from `name` (serde_json's depth limit of 128 bounds nesting;
    /// the caller bounds the size).
    pub fn from_json(bytes: &[u8], name: &str) -> Result<KnownGood> {
        let k: KnownGood = serde_json::from_slice(bytes)
            .map_err(|e| Error::failed(format!("{name}: not nodestrap's known-good set: {e}")))?;
        if k.schema != SCHEMA {
            return Err(Error::failed(format!(
                "{name}: schema {} (this nodestrap reads {SCHEMA})",
                k.schema
            )));
        }
        Ok(k)
    }

    pub fn to_json(&self) -> Result<Vec<u8>> {
        let mut json =
            serde_json::to_vec_pretty(self).map_err(|e| Error::failed(format!("{PATH}: {e}")))?;
        json.push(b'\n');
        Ok(json)
    }

    pub fn save(&self, root: &Root) -> Result<()> {
        root.write_atomic(PATH, &self.to_json()?, 0o644)
    }

    /// Why `digest` of `name` was refused, if it was.
    pub fn refusal(&self, name: &str, digest: &str) -> Option<&Refused> {
        self.refused
            .iter()
            .find(|r| r.name == name && r.digest == digest)
    }

    pub fn refuse(&mut self, r: Refused) {
        if self.refusal(&r.name, &r.digest).is_some() {
            return;
        }
        self.refused.push(r);
        if self.refused.len() > MAX_REFUSED {
            self.refused.remove(0);
        }
    }

    /// The known-good image of extension `name`, if there is one.
    pub fn image_of(&self, name: &str) -> Option<&Chosen> {
        self.set.iter().find(|c| c.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
