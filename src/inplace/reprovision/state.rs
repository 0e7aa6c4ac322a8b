//! The state file: how far a reprovision got, in which boot.

use super::setup::*;
use crate::error::Result;
use crate::node::dir::Dir;
use crate::node::root::{Root, CONFIG_CAP};

/// `<root>/var/lib/nodestrap/reprovision/state.json`.
#[derive(serde::Serialize, serde::Deserialize, Clone, PartialEq, Debug)]
pub(super) struct State {
    pub(super) flow: Flow,
    pub(super) target: String,
    pub(super) phase: Phase,
    #[serde(rename = "bootId")]
    pub(super) boot_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) config: Option<String>,
}

/// How far a reprovision got, in the order it goes; persisted by these names (state files of
/// earlier releases hold the same strings).
#[derive(serde::Serialize, serde::Deserialize, Clone, Copy, PartialEq, Eq, Debug)]
#[serde(rename_all = "kebab-case")]
pub(super) enum Phase {
    /// The node has its new configuration.
    Configured,
    /// About to hand over to the MCD or the reboot.
    HandedOff,
    /// The MCD applied it, or the reboot was accepted or left to the node: nothing more to do
    /// in this boot.
    RebootPending,
    /// The node came back with it.
    Done,
}

pub(super) fn read_state(root: &Root) -> Result<Option<State>> {
    let p = format!("{WORK}/{STATE}");
    let Some(data) = root.read(&p, CONFIG_CAP)? else {
        return Ok(None);
    };
    match serde_json::from_slice(&data) {
        Ok(s) => Ok(Some(s)),
        // A state we cannot read says nothing: start over (every step is safe to repeat).
        Err(e) => {
            crate::warn!("{}: unreadable ({e}); starting over", root.show(&p));
            Ok(None)
        }
    }
}

pub(super) fn write_state(work: &Dir, st: &State) -> Result<()> {
    let data = serde_json::to_vec_pretty(st).expect("serialisable");
    work.write_atomic(STATE, &data, 0o600)?;
    // The run's status record follows the state file's phases (docs/status.md).
    crate::node::status::decide(
        "reprovision-phase",
        serde_json::to_value(st.phase)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default(),
        work.show(STATE),
    );
    Ok(())
}
