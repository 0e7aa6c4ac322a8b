//! join-service's ledger: which node identities got a join ticket. Two homes, one question
//! ("may this identity get a ticket now?") and one order (the record is durable before the
//! ticket leaves):
//!
//! - `cluster` (the default): one ConfigMap per node identity in `--ledger-namespace`, shared
//!   by every join-service instance. The claim is a create that fails when the object exists,
//!   so of any number of instances asked at once exactly one issues; the states after it move
//!   by updates that carry the `resourceVersion` read (optimistic concurrency).
//! - `file` (`--state`): one JSON file, for a join service that runs alone without a cluster.
//!
//! A ticket is final once the node says it keeps it (`POST /v1/ticket/kept`, after its node
//! lock is durable). Until then the same identity may ask again from a new run (another
//! session) for --retry-window: a node killed between the ticket's arrival and its lock holds
//! none.
//!
//! docs/join-service.md ("The ledger") has the object's fields and the states.

mod cluster;
mod file;

pub(crate) use cluster::judge;
pub(crate) use cluster::{ClusterLedger, LEASE_MARGIN};
pub(crate) use file::FileLedger;
pub(crate) use file::{parse_record, RecordOut};

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::activation::nodelock::Role;
use crate::node::status::rfc3339;
use cluster::Entry;

pub(crate) fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn stamp(secs: u64) -> String {
    rfc3339(UNIX_EPOCH + Duration::from_secs(secs))
}

/// What the ledger answers a node that asks.
pub(crate) enum Claim {
    /// This instance issues the ticket, then tells the ledger how it went (`Ledger::settle`).
    Granted(Held),
    /// Not now and not later (409): the answer's code and why.
    Refused(&'static str, String),
    /// The ledger could not be asked or written (the API server busy or down): the node asks
    /// again later (503 with Retry-After). No ticket leaves unrecorded.
    Unavailable(String),
}

/// Who asks for a ticket.
pub(crate) struct Asking<'a> {
    /// `sha256:<hex>` of the node's public key.
    pub(crate) identity: &'a str,
    /// The certificate's common name.
    pub(crate) node: &'a str,
    pub(crate) role: Role,
    /// The node's run (`TicketRequest::session`), if it said.
    pub(crate) session: Option<&'a str>,
}

impl Asking<'_> {
    fn held(&self) -> Held {
        Held {
            identity: self.identity.to_string(),
            node: self.node.to_string(),
            role: self.role,
            session: self.session.map(str::to_string),
            record: None,
        }
    }

    /// Whether a ticket recorded for `recorded`'s session may go to this ask as well: only to
    /// another run, which says so.
    fn another_run_than(&self, recorded: Option<&str>) -> bool {
        self.session.is_some() && self.session != recorded
    }
}

/// What the ledger answers a node that says it keeps its ticket.
pub(crate) enum Keep {
    /// Recorded (or it was already): the identity is refused for good.
    Kept,
    /// No ticket of this identity to keep (409): the code and why.
    Refused(&'static str, String),
    /// The ledger could not be asked or written: the node may say it again (503).
    Unavailable(String),
}

/// A claim this instance holds, until `settle`.
pub(crate) struct Held {
    identity: String,
    node: String,
    role: Role,
    /// The asking run's session, recorded with the ticket.
    session: Option<String>,
    /// The cluster record as claimed, with its resourceVersion.
    record: Option<Box<(Entry, String)>>,
}

impl Held {
    /// Which claim of this identity it is (1, then one more after each failure), for the log.
    pub(crate) fn attempt(&self) -> u32 {
        self.record.as_ref().map(|r| r.0.attempt()).unwrap_or(1)
    }
}

pub(crate) enum Ledger<'r> {
    File(FileLedger<'r>),
    Cluster(Box<ClusterLedger>),
}

impl Ledger<'_> {
    /// Where the records are, for the log.
    pub(crate) fn describe(&self) -> String {
        match self {
            Ledger::File(f) => f.describe(),
            Ledger::Cluster(c) => c.describe(),
        }
    }

    /// May `asking` get a ticket now?
    pub(crate) fn claim(&mut self, asking: &Asking) -> Claim {
        match self {
            Ledger::File(f) => f.claim(asking),
            Ledger::Cluster(c) => c.claim(asking),
        }
    }

    /// The node says it keeps the ticket it got (its node lock is durable).
    pub(crate) fn keep(&mut self, identity: &str) -> Keep {
        match self {
            Ledger::File(f) => f.keep(identity),
            Ledger::Cluster(c) => c.keep(identity),
        }
    }

    /// The ticket is ready and about to leave: the file ledger records it now (its only
    /// record); an error means it must not leave. The cluster's record is the claim.
    pub(crate) fn commit(&mut self, held: &Held) -> std::result::Result<(), String> {
        match self {
            Ledger::File(f) => f.commit(held),
            Ledger::Cluster(_) => Ok(()),
        }
    }

    /// How the issuance ended: the ticket was written to the node (`Ok`), or not (why).
    pub(crate) fn settle(&mut self, held: Held, outcome: std::result::Result<(), String>) {
        if let Ledger::Cluster(c) = self {
            c.settle(held, outcome)
        }
    }

    /// Records not yet written because the API server could not be reached: tried again
    /// before each answer and once when stopping.
    pub(crate) fn flush(&mut self) {
        if let Ledger::Cluster(c) = self {
            c.flush()
        }
    }
}
