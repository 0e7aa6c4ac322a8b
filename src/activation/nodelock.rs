//! The node lock: one-way, taken at most once per node, by whichever of init or join has every
//! input authenticated and validated first. Taking it writes a durable marker on the node's
//! root (atomic, fsynced) before anything else happens, so a crash or a restart after that
//! point can never init or join the node a second time. There is no unlock: the marker only
//! moves `committed` → `done`, or `committed` → `reset` when the activation failed for good.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::node::root::Root;

/// The durable marker (a node path).
pub(crate) const STATE_PATH: &str = "/var/lib/nodestrap/node-state.json";

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Role {
    ControlPlane,
    Worker,
}

impl Role {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Role::ControlPlane => "control-plane",
            Role::Worker => "worker",
        }
    }
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub(crate) enum State {
    Committed,
    Done,
    Reset,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct Marker {
    pub(crate) state: State,
    pub(crate) role: Role,
    /// The cluster's name, as the init request or the ticket gave it.
    pub(crate) cluster: String,
    /// `sha256:<hex>` of the cluster CA's public key, once known (the ticket's discovery hash;
    /// after an init, the CA kubeadm left in /etc/kubernetes/pki).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) ca_cert_hash: Option<String>,
    /// `init` or `join`, and from whom: who decided this node's fate.
    pub(crate) source: String,
    pub(crate) committed_at: u64,
    pub(crate) updated_at: u64,
    /// Why the activation failed (state `reset`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) reason: Option<String>,
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The marker left by an earlier run, if any. One that does not parse is still a marker: the
/// lock was taken once, so the node is not fresh (exit 2, as for any other state; a restart
/// cannot fix it).
pub(crate) fn read(root: &Root) -> Result<Option<Marker>> {
    let Some(text) = root.read_text(STATE_PATH)? else {
        return Ok(None);
    };
    // from_slice, as every other JSON read of the binary: from_str is another copy of
    // serde_json's reader (6 KB).
    serde_json::from_slice(text.as_bytes())
        .map(Some)
        .map_err(|e| {
            Error::config(format!(
            "{}: not a node state ({e}); a marker is there, so this node is not fresh and will \
             not init or join again; reprovision it",
            root.show(STATE_PATH)
        ))
        })
}

pub(crate) struct NodeLock<'r> {
    root: &'r Root,
    taken: AtomicBool,
    marker: Mutex<Option<Marker>>,
}

impl<'r> NodeLock<'r> {
    pub(crate) fn new(root: &'r Root) -> Self {
        NodeLock {
            root,
            taken: AtomicBool::new(false),
            marker: Mutex::new(None),
        }
    }

    pub(crate) fn is_taken(&self) -> bool {
        self.taken.load(Ordering::SeqCst)
    }

    /// The state last recorded by this lock (`None`: not taken, or its marker never written).
    pub(crate) fn state(&self) -> Option<State> {
        self.marker
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|m| m.state)
    }

    /// Take the lock for `role` in `cluster`. `Ok(false)`: the other side has it. `Ok(true)`:
    /// ours, and the `committed` marker is on disk. `Err`: ours, but the marker could not be
    /// written; the lock stays taken (the other side must not start either) and the caller
    /// treats it like any failure after the lock.
    pub(crate) fn try_lock(
        &self,
        role: Role,
        cluster: &str,
        ca_cert_hash: Option<&str>,
        source: &str,
    ) -> Result<bool> {
        if self
            .taken
            .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            return Ok(false);
        }
        let t = now();
        let m = Marker {
            state: State::Committed,
            role,
            cluster: cluster.to_string(),
            ca_cert_hash: ca_cert_hash.map(str::to_string),
            source: source.to_string(),
            committed_at: t,
            updated_at: t,
            reason: None,
        };
        self.write(&m)?;
        crate::info!(
            "node lock taken: {} of cluster {cluster} ({source}); recorded as committed in {}",
            role.as_str(),
            self.root.show(STATE_PATH)
        );
        *self.marker.lock().unwrap_or_else(|e| e.into_inner()) = Some(m);
        Ok(true)
    }

    /// What the lock says of the node, for a refused init request: `worker of cluster demo
    /// (ticket from https://…), committed`.
    pub(crate) fn describe(&self) -> String {
        match self
            .marker
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            Some(m) => format!(
                "{} of cluster {} ({}), {}",
                m.role.as_str(),
                m.cluster,
                m.source,
                match m.state {
                    State::Committed => "committed",
                    State::Done => "done",
                    State::Reset => "reset",
                }
            ),
            None => "its node lock is taken".into(),
        }
    }

    /// `committed` → `done`.
    pub(crate) fn done(&self, ca_cert_hash: Option<String>) -> Result<()> {
        self.update(State::Done, |m| {
            if ca_cert_hash.is_some() {
                m.ca_cert_hash = ca_cert_hash;
            }
        })
    }

    /// `committed` → `reset`: the node is spent and must be reprovisioned.
    pub(crate) fn reset(&self, reason: &str) -> Result<()> {
        self.update(State::Reset, |m| m.reason = Some(reason.to_string()))
    }

    fn update(&self, state: State, f: impl FnOnce(&mut Marker)) -> Result<()> {
        let mut guard = self.marker.lock().unwrap_or_else(|e| e.into_inner());
        let Some(m) = guard.as_mut() else {
            // Taken, but the committed marker never made it to disk: still record the end.
            if state == State::Reset && self.is_taken() {
                let mut m = Marker {
                    state,
                    role: Role::Worker,
                    cluster: String::new(),
                    ca_cert_hash: None,
                    source: "unknown (the committed marker was not written)".into(),
                    committed_at: now(),
                    updated_at: now(),
                    reason: None,
                };
                f(&mut m);
                self.write(&m)?;
                *guard = Some(m);
                return Ok(());
            }
            return Err(Error::failed("node lock not held: no marker to update"));
        };
        m.state = state;
        m.updated_at = now();
        f(m);
        self.write(m)?;
        crate::info!(
            "node state {} recorded in {}",
            match state {
                State::Committed => "committed",
                State::Done => "done",
                State::Reset => "reset",
            },
            self.root.show(STATE_PATH)
        );
        Ok(())
    }

    fn write(&self, m: &Marker) -> Result<()> {
        let mut text = serde_json::to_vec_pretty(m)?;
        text.push(b'\n');
        self.root
            .write_atomic(STATE_PATH, &text, 0o644)
            .map_err(|e| e.context("writing the node state marker"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    fn tmp_root(tag: &str) -> (std::path::PathBuf, Root) {
        let p = std::env::temp_dir().join(format!("nodestrap-lock-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        let r = Root::open(&p).unwrap();
        (p, r)
    }

    #[test]
    fn taken_once_by_many_racers_and_never_released() {
        let (p, root) = tmp_root("race");
        let lock = NodeLock::new(&root);
        let wins = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for i in 0..16 {
                let (lock, wins) = (&lock, &wins);
                s.spawn(move || {
                    if lock
                        .try_lock(Role::Worker, "c", None, &format!("racer {i}"))
                        .unwrap()
                    {
                        wins.fetch_add(1, Ordering::SeqCst);
                    }
                });
            }
        });
        assert_eq!(wins.load(Ordering::SeqCst), 1);
        assert!(lock.is_taken());
        assert!(!lock.try_lock(Role::Worker, "c", None, "late").unwrap());
        let m = read(&root).unwrap().unwrap();
        assert_eq!(m.state, State::Committed);
        assert!(m.source.starts_with("racer "));
        lock.done(Some("sha256:ab".into())).unwrap();
        let m = read(&root).unwrap().unwrap();
        assert_eq!(
            (m.state, m.ca_cert_hash.as_deref()),
            (State::Done, Some("sha256:ab"))
        );
        std::fs::remove_dir_all(&p).unwrap();
    }

    #[test]
    fn marker_failure_keeps_the_lock_and_still_records_reset() {
        let (p, root) = tmp_root("fail");
        // A file where the marker's directory should be: the committed marker cannot be written.
        std::fs::create_dir_all(p.join("var/lib")).unwrap();
        std::fs::write(p.join("var/lib/nodestrap"), "in the way").unwrap();
        let lock = NodeLock::new(&root);
        assert!(lock.try_lock(Role::Worker, "c", None, "t").is_err());
        // The other side must not start either.
        assert!(!lock
            .try_lock(Role::ControlPlane, "c", None, "other")
            .unwrap());
        std::fs::remove_file(p.join("var/lib/nodestrap")).unwrap();
        assert_eq!(lock.state(), None);
        lock.reset("marker write failed").unwrap();
        assert_eq!(lock.state(), Some(State::Reset));
        let m = read(&root).unwrap().unwrap();
        assert_eq!(m.state, State::Reset);
        assert_eq!(m.reason.as_deref(), Some("marker write failed"));
        std::fs::remove_dir_all(&p).unwrap();
    }

    #[test]
    fn unreadable_marker_names_the_file() {
        let (p, root) = tmp_root("bad");
        std::fs::create_dir_all(p.join("var/lib/nodestrap")).unwrap();
        std::fs::write(
            p.join("var/lib/nodestrap/node-state.json"),
            "{\"state\":\"maybe\"}",
        )
        .unwrap();
        let e = read(&root).unwrap_err();
        assert_eq!(e.exit_code(), 2, "not fresh, as any marker: {e}");
        let e = e.to_string();
        assert!(
            e.contains("node-state.json")
                && e.contains("not a node state (unknown variant `maybe`")
                && e.contains("not fresh"),
            "{e}"
        );
        std::fs::remove_dir_all(&p).unwrap();
    }
}
