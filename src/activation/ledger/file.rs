//! The file ledger (`--ledger file`): one JSON file, for a join service that runs alone.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{now, stamp, Asking, Claim, Held, Keep};
use crate::activation::nodelock::Role;
use crate::error::{Error, Result};
use crate::node::root::Root;

/// The file record: who got a ticket, by identity (`sha256:<hex>` of the node's public key):
/// `{"issued": {IDENTITY: {"node": CN, "role": ROLE, "at": UNIX_SECONDS, "kept": BOOL}}}`. Read
/// strictly: a record that loses an entry would let that node get a second ticket.
#[derive(Serialize, Deserialize, Debug, Default, PartialEq)]
#[serde(deny_unknown_fields)]
struct Record {
    issued: Issued,
}

pub(crate) type Issued = BTreeMap<String, IssuedTo>;

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct IssuedTo {
    /// The certificate's common name.
    pub(super) node: String,
    pub(super) role: Role,
    /// Unix seconds.
    pub(super) at: u64,
    /// The node said it keeps the ticket. Until then the same identity may ask again within
    /// --retry-window of `at`. Absent in the records of earlier versions: those are final.
    #[serde(default = "final_record")]
    pub(super) kept: bool,
    /// The session of the run that asked (`TicketRequest::session`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) session: Option<String>,
}

fn final_record() -> bool {
    true
}

/// The record file's text (`name` for messages); any flaw is an error, never an empty record.
pub(crate) fn parse_record(text: &str, name: &str) -> Result<Issued> {
    // from_slice, as every other JSON read of the binary: from_str is another copy of
    // serde_json's reader (6 KB).
    serde_json::from_slice::<Record>(text.as_bytes())
        .map(|r| r.issued)
        .map_err(|e| Error::failed(format!("{name}: not a ticket record: {e}")))
}

fn refused_before(node: &str, at: u64) -> (&'static str, String) {
    (
        "already_issued",
        format!(
            "this node identity already got a ticket (as {node:?} at {}); refused",
            stamp(at)
        ),
    )
}

pub(crate) struct FileLedger<'r> {
    root: &'r Root,
    path: String,
    issued: Issued,
    /// --retry-window: how long a ticket the node never said it kept may be asked for again.
    window: u64,
}

impl<'r> FileLedger<'r> {
    pub(crate) fn open(root: &'r Root, path: &str, window: u64) -> Result<FileLedger<'r>> {
        let issued = match root.read_text(path)? {
            Some(t) => parse_record(&t, &root.show(path))?,
            None => Issued::new(),
        };
        crate::info!(
            "{} node identities already have a ticket (from {})",
            issued.len(),
            root.show(path)
        );
        Ok(FileLedger {
            root,
            path: path.to_string(),
            issued,
            window,
        })
    }

    /// Where the record is, for the log.
    pub(super) fn describe(&self) -> String {
        self.root.show(&self.path)
    }

    pub(super) fn claim(&mut self, asking: &Asking) -> Claim {
        match self.issued.get(asking.identity) {
            Some(r)
                if r.kept
                    || now() >= r.at.saturating_add(self.window)
                    || !asking.another_run_than(r.session.as_deref()) =>
            {
                let (code, m) = refused_before(&r.node, r.at);
                return Claim::Refused(code, m);
            }
            Some(r) => crate::info!(
                "{}: {} ({}) asks again from another run after the ticket of {} it never said \
                 it kept; issuing again",
                self.describe(),
                asking.node,
                asking.identity,
                stamp(r.at)
            ),
            None => {}
        }
        Claim::Granted(asking.held())
    }

    /// Written durably before the ticket leaves: a restart does not issue again unless the
    /// node asks again, within the window, without having said it kept it.
    pub(super) fn commit(&mut self, held: &Held) -> std::result::Result<(), String> {
        let entry = IssuedTo {
            node: held.node.clone(),
            role: held.role,
            at: now(),
            kept: false,
            session: held.session.clone(),
        };
        let old = self.issued.insert(held.identity.clone(), entry);
        self.save().map_err(|e| {
            match old {
                Some(o) => self.issued.insert(held.identity.clone(), o),
                None => self.issued.remove(&held.identity),
            };
            // A write that failed after its rename (the folder's fsync) left the new record in
            // place: the old one goes back, so that the file says what the answer says.
            if let Err(undo) = self.save() {
                crate::warn!(
                    "{}: could not put the record back without {}: {undo}",
                    self.describe(),
                    held.identity
                );
            }
            e.to_string()
        })
    }

    /// The node says it keeps its ticket: recorded durably, then the identity is final.
    pub(super) fn keep(&mut self, identity: &str) -> Keep {
        let Some(r) = self.issued.get_mut(identity) else {
            return Keep::Refused(
                "not_issued",
                format!("{}: no ticket for this node identity", self.describe()),
            );
        };
        if r.kept {
            return Keep::Kept;
        }
        // Kept in memory whatever the write does: refusing is the safe direction, and the
        // next write of the record carries it.
        r.kept = true;
        match self.save() {
            Ok(()) => Keep::Kept,
            Err(e) => Keep::Unavailable(e.to_string()),
        }
    }

    fn save(&self) -> Result<()> {
        let mut text = serde_json::to_vec_pretty(&RecordOut {
            issued: &self.issued,
        })?;
        text.push(b'\n');
        self.root.write_atomic(&self.path, &text, 0o644)
    }
}

/// `Record` as written, borrowing the map.
#[derive(Serialize)]
pub(crate) struct RecordOut<'a> {
    pub(crate) issued: &'a Issued,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticket_record_is_read_strictly() {
        // An earlier version's record has no `kept`: it is final.
        let good = r#"{"issued": {"sha256:ab": {"node": "n1", "role": "control-plane", "at": 7}}}"#;
        let issued = parse_record(good, "/x/issued.json").unwrap();
        assert_eq!(
            issued["sha256:ab"],
            IssuedTo {
                node: "n1".into(),
                role: Role::ControlPlane,
                at: 7,
                kept: true,
                session: None,
            }
        );
        let unkept = r#"{"issued": {"sha256:ab": {"node": "n1", "role": "worker", "at": 7, "kept": false}}}"#;
        assert!(!parse_record(unkept, "x").unwrap()["sha256:ab"].kept);
        // What save writes reads back the same.
        let text = serde_json::to_string(&Record {
            issued: issued.clone(),
        })
        .unwrap();
        assert_eq!(parse_record(&text, "x").unwrap(), issued);
        assert!(parse_record(r#"{"issued": {}}"#, "x").unwrap().is_empty());
        // Valid JSON that is not a full record: an error naming the file and serde's reason,
        // never an empty record (which would hand out second tickets).
        for (bad, why) in [
            ("{}", "missing field `issued`"),
            (r#"{"issued": []}"#, "invalid type"),
            (
                r#"{"issued": {"sha256:ab": {"node": "n1"}}}"#,
                "missing field `role`",
            ),
            (
                r#"{"issued": {"sha256:ab": {"node": "n1", "role": "boss", "at": 1}}}"#,
                "unknown variant `boss`",
            ),
            (
                r#"{"issued": {}, "issuedd": {"sha256:ab": {}}}"#,
                "unknown field `issuedd`",
            ),
            ("[]", "expected struct Record"),
            ("", "EOF"),
        ] {
            let e = parse_record(bad, "/var/lib/x/issued.json").unwrap_err();
            let m = e.to_string();
            assert!(
                m.starts_with("/var/lib/x/issued.json: not a ticket record: ") && m.contains(why),
                "{bad}: {m}"
            );
        }
    }
}
