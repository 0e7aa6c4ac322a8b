//! The one way to reboot the node. Everything that may reboot takes a `&dyn Rebooter`; the real
//! one comes only from `for_run` (the host root, `--reboot auto`, no `--dry-run`) or from
//! `for_host_mount` (a pod told explicitly that its root is the host's, no `--dry-run`). Tests
//! and dry runs get one that only says what it would have done.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::root::Root;

pub trait Rebooter {
    /// Reboot for `reason`. The real executor does not return on success.
    fn reboot(&self, reason: &str) -> Result<()>;
    /// Whether this executor really reboots (tests check the gate with it).
    #[cfg(test)]
    fn is_real(&self) -> bool;
}

/// systemd's `reboot.target`, queued over D-Bus.
struct Systemd;

impl Rebooter for Systemd {
    fn reboot(&self, reason: &str) -> Result<()> {
        log::warn!("rebooting now: {reason}");
        let job = crate::dbus::systemd_reboot()?;
        log::info!("reboot queued as systemd job {job}; waiting to be stopped");
        // In ExecStartPre, returning would let the unit start (and the kubelet after it) while
        // the node goes down; stay until systemd stops us.
        std::thread::sleep(Duration::from_secs(600));
        Err(Error::failed(
            "reboot was queued but the node is still up after 10 minutes",
        ))
    }
    #[cfg(test)]
    fn is_real(&self) -> bool {
        true
    }
}

/// Says a reboot is needed and why it is not done here.
struct Decline(String);

impl Rebooter for Decline {
    fn reboot(&self, reason: &str) -> Result<()> {
        log::warn!("reboot needed ({reason}); not rebooting: {}", self.0);
        Ok(())
    }
    #[cfg(test)]
    fn is_real(&self) -> bool {
        false
    }
}

pub fn for_run(root: &Root, allow: bool, dry_run: bool) -> Box<dyn Rebooter> {
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
pub fn for_host_mount(dry_run: bool) -> Box<dyn Rebooter> {
    if dry_run {
        Box::new(Decline("--dry-run".into()))
    } else {
        Box::new(Systemd)
    }
}
