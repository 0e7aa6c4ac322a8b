//! Rollout control of the patch stream: a hold and a canary share that the operator sets once
//! for the whole fleet, in the ConfigMap `kube-system/nodestrap-rollout`, read by every patch
//! run (a node already bootstrapped) before it changes anything (docs/bootstrap.md, "Rollout
//! control"). A node reads it with its own credentials; deploy/rollout.yaml grants the group
//! `system:nodes` `get` on that one object, which the Node authorizer alone does not.

use crate::error::{Error, Result};
use crate::net::kube::Kube;
use crate::node::root::Root;

pub(crate) const NAMESPACE: &str = "kube-system";
pub(crate) const NAME: &str = "nodestrap-rollout";

/// What the fleet's rollout setting says to this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Rollout {
    /// No setting: every node takes what the cluster's version calls for. The reason.
    Open(String),
    /// `hold`: no patch run changes anything. The reason it gives.
    Hold(String),
    /// `canary-percent`: only nodes whose share point is below it take a change.
    Canary(u8),
    /// The setting could not be read (no rights, no answer): the run goes on, and says so.
    Unread(String),
}

impl Rollout {
    /// The ConfigMap's `hold` (`true`, or any reason text; `false` or empty: no hold) and
    /// `canary-percent` (0 to 100). A value that means neither is refused: the operator's
    /// switch must never be misread.
    pub(crate) fn read(kube: &Kube) -> Result<Rollout> {
        let at = format!("ConfigMap {NAMESPACE}/{NAME}");
        let data = match kube.configmap(NAMESPACE, NAME) {
            Ok(Some(d)) => d,
            Ok(None) => return Ok(Rollout::Open(format!("no {at}"))),
            Err(e) => return Ok(Rollout::Unread(format!("{at}: {}", e.error))),
        };
        let text = |k: &str| data.get(k).and_then(|v| v.as_str()).map(str::trim);
        match text("hold") {
            None | Some("") | Some("false") => {}
            Some("true") => return Ok(Rollout::Hold(format!("{at} hold=true"))),
            Some(reason) => {
                return Ok(Rollout::Hold(format!(
                    "{at} hold: {}",
                    crate::error::excerpt(reason, 200)
                )))
            }
        }
        match text("canary-percent") {
            None | Some("") => Ok(Rollout::Open(format!("{at} sets no hold nor canary-percent"))),
            Some(v) => match v.parse::<u8>() {
                Ok(p) if p <= 100 => Ok(Rollout::Canary(p)),
                _ => Err(Error::failed(format!(
                    "{at}: canary-percent {:?} is not a whole number from 0 to 100: fix it with kubectl -n {NAMESPACE} edit configmap {NAME}",
                    crate::error::excerpt(v, 40)
                ))),
            },
        }
    }

    /// `None` when this node may change what it runs; else why not.
    pub(crate) fn stops(&self, point: Option<u8>) -> Option<String> {
        match self {
            Rollout::Open(_) | Rollout::Unread(_) => None,
            Rollout::Hold(why) => Some(format!("held by {why}")),
            Rollout::Canary(p) => match point {
                Some(x) if x < *p => None,
                Some(x) => Some(format!(
                    "outside the canary share: {NAMESPACE}/{NAME} canary-percent={p}, this node's share point is {x}"
                )),
                None => Some(format!(
                    "outside the canary share: {NAMESPACE}/{NAME} canary-percent={p}, and this node has no /etc/machine-id to place it"
                )),
            },
        }
    }
}

/// This node's place in the fleet, 0 to 99, the same at every run: from the SHA-256 of its
/// machine ID, so that a canary share of 10 takes the same tenth of the fleet each time and
/// widening it only adds nodes.
pub(crate) fn share_point(root: &Root) -> Option<u8> {
    let id = root.read_text("/etc/machine-id").ok()??;
    let id = id.trim();
    if id.is_empty() {
        return None;
    }
    let d = crate::crypto::digest::sha256(id.as_bytes());
    Some((u16::from_be_bytes([d[0], d[1]]) % 100) as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hold_stops_every_node_and_a_canary_the_nodes_above_its_share() {
        assert!(Rollout::Hold("x".into()).stops(Some(0)).is_some());
        assert_eq!(Rollout::Canary(10).stops(Some(9)), None);
        assert!(Rollout::Canary(10)
            .stops(Some(10))
            .unwrap()
            .contains("share point is 10"));
        assert!(Rollout::Canary(100).stops(Some(99)).is_none());
        assert!(Rollout::Canary(0).stops(Some(0)).is_some());
        assert!(Rollout::Canary(50).stops(None).is_some());
        assert_eq!(Rollout::Open("no".into()).stops(None), None);
        assert_eq!(Rollout::Unread("403".into()).stops(None), None);
    }
}
