//! The file ledger (`--ledger file`): one JSON file, for a join service that runs alone.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{now, stamp, Claim, Held};
use crate::activation::nodelock::Role;
use crate::error::{Error, Result};
use crate::node::root::Root;

/// The file record: who got a ticket, by identity (`sha256:<hex>` of the node's public key):
/// `{"issued": {IDENTITY: {"node": CN, "role": ROLE, "at": UNIX_SECONDS}}}`. Read strictly: a
/// record that loses an entry would let that node get a second ticket.
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

pub struct FileLedger<'r> {
    root: &'r Root,
    path: String,
    issued: Issued,
}

impl<'r> FileLedger<'r> {
    pub fn open(root: &'r Root, path: &str) -> Result<FileLedger<'r>> {
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
        })
    }

    /// Where the record is, for the log.
    pub(super) fn describe(&self) -> String {
        self.root.show(&self.path)
    }

    pub(super) fn claim(&mut self, identity: &str, node: &str, role: Role) -> Claim {
        if let Some(r) = self.issued.get(identity) {
            let (code, m) = refused_before(&r.node, r.at);
            return Claim::Refused(code, m);
        }
        Claim::Granted(Held {
            identity: identity.to_string(),
            node: node.to_string(),
            role,
            record: None,
        })
    }

    /// Written durably before the ticket leaves: a restart does not issue again. A failure
    /// to send after this stays recorded: the file ledger has no retry window.
    pub(super) fn commit(&mut self, held: &Held) -> std::result::Result<(), String> {
        let entry = IssuedTo {
            node: held.node.clone(),
            role: held.role,
            at: now(),
        };
        self.issued.insert(held.identity.clone(), entry);
        self.save().map_err(|e| {
            self.issued.remove(&held.identity);
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
        let good = r#"{"issued": {"sha256:ab": {"node": "n1", "role": "control-plane", "at": 7}}}"#;
        let issued = parse_record(good, "/x/issued.json").unwrap();
        assert_eq!(
            issued["sha256:ab"],
            IssuedTo {
                node: "n1".into(),
                role: Role::ControlPlane,
                at: 7
            }
        );
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
