//! The torcx payload's version floors: per torcx image name (`docker`), the highest version a
//! bootstrap or the pre-reboot hook staged on this node. Kept at
//! `/var/lib/nodestrap/torcx-floor.json`, which outlives the store's images and torcx's own
//! garbage collection (docs/bootstrap.md, "Versions only go forward").

use serde::{Deserialize, Serialize};

use crate::node::floor::Floors;
use crate::node::state_file::StateFile;

pub(crate) const PATH: &str = "/var/lib/nodestrap/torcx-floor.json";

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TorcxFloor {
    pub(crate) schema: u32,
    pub floor: Floors,
}

impl StateFile for TorcxFloor {
    const PATH: &'static str = PATH;
    const WHAT: &'static str = "nodestrap's torcx floor";
    const SCHEMA: u32 = 1;
    const CAP: u64 = 64 << 10;

    fn schema(&self) -> u32 {
        self.schema
    }

    fn empty() -> Self {
        TorcxFloor {
            schema: Self::SCHEMA,
            floor: Floors::default(),
        }
    }
}
