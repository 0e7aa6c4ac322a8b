//! The one way to reboot the node. Everything that may reboot takes a `&dyn Rebooter`; the real
//! one comes only from `for_run` (the host root, `--reboot auto`, no `--dry-run`) or from
//! `for_host_mount` (a pod told explicitly that its root is the host's, no `--dry-run`). Tests
//! and dry runs get one that only says what it would have done.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::node::root::Root;

/// What became of a reboot request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Requested {
    /// systemd accepted it: the node is going down (the job's path).
    Queued(String),
    /// Not done here, and why (`--dry-run`, `--reboot=never`, another root).
    Declined(String),
}

pub(crate) trait Rebooter {
    /// Ask for the reboot; `Queued` once systemd accepted the job.
    fn request(&self, reason: &str) -> Result<Requested>;

    /// Ask, and once it is queued wait to be stopped: in ExecStartPre, returning would let the
    /// unit start (and the kubelet after it) while the node goes down. SIGTERM (systemd
    /// stopping us for the reboot) ends the wait at once with `Ok`; after 10 minutes still up,
    /// the reboot did not happen and that is an error.
    fn reboot(&self, reason: &str) -> Result<()> {
        match self.request(reason)? {
            Requested::Declined(_) => Ok(()),
            Requested::Queued(_) => wait_to_be_stopped(Duration::from_secs(600)),
        }
    }

    /// Whether this executor really reboots (tests check the gate with it).
    #[cfg(test)]
    fn is_real(&self) -> bool;
}

/// After a queued reboot: until SIGTERM (then `Ok`, promptly) or `limit` (then an error).
pub(crate) fn wait_to_be_stopped(limit: Duration) -> Result<()> {
    crate::node::signals::catch_sigterm();
    let start = std::time::Instant::now();
    while start.elapsed() < limit {
        if crate::node::signals::signalled() {
            crate::info!("stopped by SIGTERM while the node reboots");
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(Error::failed(format!(
        "reboot was queued but the node is still up after {} s",
        limit.as_secs()
    )))
}

/// systemd's `reboot.target`, queued over D-Bus.
struct Systemd;

impl Rebooter for Systemd {
    fn request(&self, reason: &str) -> Result<Requested> {
        crate::warn!("rebooting now: {reason}");
        let job = crate::node::dbus::systemd_reboot()?;
        crate::info!("reboot queued as systemd job {job}; waiting to be stopped");
        Ok(Requested::Queued(job))
    }
    #[cfg(test)]
    fn is_real(&self) -> bool {
        true
    }
}

/// Says a reboot is needed and why it is not done here.
struct Decline(String);

impl Rebooter for Decline {
    fn request(&self, reason: &str) -> Result<Requested> {
        crate::warn!("reboot needed ({reason}); not rebooting: {}", self.0);
        Ok(Requested::Declined(self.0.clone()))
    }
    #[cfg(test)]
    fn is_real(&self) -> bool {
        false
    }
}

pub(crate) fn for_run(root: &Root, allow: bool, dry_run: bool) -> Box<dyn Rebooter> {
    if dry_run {
        Box::new(Decline("--dry-run".into()))
    } else if !allow {
        Box::new(Decline("--reboot=never".into()))
    } else if !root.is_host() {
        Box::new(Decline(
            "--root is not /, the node reboots on its own terms".into(),
        ))
    } else {
        Box::new(Systemd)
    }
}

/// For a pod that has the host's root mounted and the host's system bus reachable
/// (`DBUS_SYSTEM_BUS_ADDRESS`): the caller says explicitly that rebooting means the host.
pub(crate) fn for_host_mount(dry_run: bool) -> Box<dyn Rebooter> {
    if dry_run {
        Box::new(Decline("--dry-run".into()))
    } else {
        Box::new(Systemd)
    }
}
