//! nodestrap's own small JSON files under /var/lib/nodestrap that outlive the images (the
//! sysext known-good set, the torcx floor): one way to read one, check its schema and write
//! it back. A file that is there but not ours is an error naming it: a node that cannot tell
//! what it recorded must not guess it away.

use serde::{de::DeserializeOwned, Serialize};

use crate::error::{Error, Result};
use crate::node::root::Root;

pub trait StateFile: Serialize + DeserializeOwned {
    /// Where it lives on the node.
    const PATH: &'static str;
    /// What it is, for errors: `nodestrap's torcx floor`.
    const WHAT: &'static str;
    /// The only schema this nodestrap reads and writes.
    const SCHEMA: u32;
    /// A small file; a larger one is not ours.
    const CAP: u64;

    fn schema(&self) -> u32;
    /// The file before anything was recorded, at `SCHEMA`.
    fn empty() -> Self;

    /// The file under `root`, or `empty()` without one.
    fn load(root: &Root) -> Result<Self> {
        match root.read(Self::PATH, Self::CAP)? {
            None => Ok(Self::empty()),
            Some(bytes) => Self::from_json(&bytes, &root.show(Self::PATH)),
        }
    }

    /// The file's bytes as read from `name` (serde_json's depth limit of 128 bounds nesting;
    /// the caller bounds the size).
    fn from_json(bytes: &[u8], name: &str) -> Result<Self> {
        let v: Self = serde_json::from_slice(bytes)
            .map_err(|e| Error::failed(format!("{name}: not {}: {e}", Self::WHAT)))?;
        if v.schema() != Self::SCHEMA {
            return Err(Error::failed(format!(
                "{name}: schema {} (this nodestrap reads {})",
                v.schema(),
                Self::SCHEMA
            )));
        }
        Ok(v)
    }

    /// Pretty JSON with a final newline, as it is written.
    fn to_json(&self) -> Result<Vec<u8>> {
        let mut json = serde_json::to_vec_pretty(self)
            .map_err(|e| Error::failed(format!("{}: {e}", Self::PATH)))?;
        json.push(b'\n');
        Ok(json)
    }

    /// Written in place of the old one, atomically.
    fn save(&self, root: &Root) -> Result<()> {
        root.write_atomic(Self::PATH, &self.to_json()?, 0o644)
    }
}
