//! The torcx payload's version floors: per torcx image name (`docker`), the highest version a
//! bootstrap or the pre-reboot hook staged on this node. Kept at
//! `/var/lib/nodestrap/torcx-floor.json`, which outlives the store's images and torcx's own
//! garbage collection (docs/bootstrap.md, "Versions only go forward").

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::node::floor::Floors;
use crate::node::root::Root;

pub const PATH: &str = "/var/lib/nodestrap/torcx-floor.json";
const SCHEMA: u32 = 1;
/// A small file; a larger one is not ours.
const CAP: u64 = 64 << 10;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TorcxFloor {
    pub schema: u32,
    pub floor: Floors,
}

impl TorcxFloor {
    /// The file under `root`, or no floors without one. A file that is not ours is an error
    /// naming it: a node that cannot tell its floor must not guess it away.
    pub fn load(root: &Root) -> Result<TorcxFloor> {
        let Some(bytes) = root.read(PATH, CAP)? else {
            return Ok(TorcxFloor {
                schema: SCHEMA,
                floor: Floors::default(),
            });
        };
        TorcxFloor::from_json(&bytes, &root.show(PATH))
    }

    /// The file's bytes as read from `name` (serde_json's depth limit of 128 bounds nesting;
    /// the caller bounds the size).
    pub fn from_json(bytes: &[u8], name: &str) -> Result<TorcxFloor> {
        let f: TorcxFloor = serde_json::from_slice(bytes)
            .map_err(|e| Error::failed(format!("{name}: not nodestrap's torcx floor: {e}")))?;
        if f.schema != SCHEMA {
            return Err(Error::failed(format!(
                "{name}: schema {} (this nodestrap reads {SCHEMA})",
                f.schema
            )));
        }
        Ok(f)
    }

    pub fn to_json(&self) -> Result<Vec<u8>> {
        let mut json =
            serde_json::to_vec_pretty(self).map_err(|e| Error::failed(format!("{PATH}: {e}")))?;
        json.push(b'\n');
        Ok(json)
    }
}
