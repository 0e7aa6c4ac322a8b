//! Which merge puts the staged images into /usr at boot. systemd 261 and later can merge the
//! real root's extensions in the initramfs (`systemd-sysext-sysroot.service`, ordered before
//! `initrd-root-fs.target`); without that unit, the real root's `systemd-sysext.service` merges
//! them before `sysinit.target`. nodestrap stages after Ignition's files, hence after the
//! initramfs merge (before it would be an ordering cycle: docs/where-it-runs.md), so on an
//! initramfs that merges it restarts that unit once the links are in place: the merge
//! switch-root carries is the one with nodestrap's images, made by the distro's own unit under
//! the policy the real root configures.

use std::path::Path;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::node::dbus::{self, UnitState};
use crate::node::{cmdline, status};
use crate::sysext::merge;

pub(crate) const SYSROOT_UNIT: &str = "systemd-sysext-sysroot.service";
/// The unit's own `TimeoutStartSec` is systemd's default (90 s); a merge of two images takes
/// seconds.
const MERGE_DEADLINE: Duration = Duration::from_secs(120);

/// Who merges the staged images at this boot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Merge {
    /// The initramfs's `systemd-sysext-sysroot.service`: this run restarts it after staging.
    Initramfs,
    /// The real root's `systemd-sysext.service`; why not the initramfs.
    RealRoot(String),
    /// No merge at this boot (`systemd.sysext=` false): why.
    Off(String),
}

impl Merge {
    pub(crate) fn word(&self) -> &'static str {
        match self {
            Merge::Initramfs => "initramfs",
            Merge::RealRoot(_) => "real-root",
            Merge::Off(_) => "off",
        }
    }
}

/// Who will merge what this run stages into `/sysroot` from the initramfs.
pub(crate) fn plan() -> Merge {
    let line = cmdline::read().unwrap_or_default();
    let unit = dbus::systemd_unit(SYSROOT_UNIT);
    decide(&line, unit)
}

/// The rules of `plan`, from the kernel command line and what systemd says of the unit.
fn decide(line: &str, unit: Result<UnitState>) -> Merge {
    // systemd-sysext reads `systemd.sysext=` (not `rd.systemd.sysext=`) when it merges with
    // --root, and the real root's unit the same: both are off.
    if cmdline::systemd_bool(line, "systemd.sysext") == Some(false) {
        return Merge::Off(
            "systemd.sysext= on the kernel command line turns off both the initramfs's systemd-sysext-sysroot.service and the real root's systemd-sysext.service: the images merge at the first boot without it".into(),
        );
    }
    let unit = match unit {
        Ok(u) => u,
        Err(e) => {
            return Merge::RealRoot(format!(
                "systemd in the initramfs could not be asked about {SYSROOT_UNIT}: {e}"
            ))
        }
    };
    match (unit.load.as_str(), unit.file.as_str()) {
        ("loaded", "enabled" | "enabled-runtime" | "static" | "generated" | "alias") => {
            Merge::Initramfs
        }
        ("loaded", state) => Merge::RealRoot(format!(
            "this initramfs has {SYSROOT_UNIT}, {state}: nothing pulls it in"
        )),
        ("masked", _) => Merge::RealRoot(format!(
            "{SYSROOT_UNIT} is masked in this initramfs (rd.systemd.mask=)"
        )),
        _ => Merge::RealRoot(format!(
            "this initramfs has no {SYSROOT_UNIT} (systemd before 261, or dracut without its systemd-sysext module)"
        )),
    }
}

/// Logs and records the plan; `rd.systemd.sysext=0` named when it is set, since it does not do
/// what its name suggests for the real root's extensions.
pub(crate) fn record(m: &Merge) {
    let line = cmdline::read().unwrap_or_default();
    if cmdline::systemd_bool(&line, "rd.systemd.sysext") == Some(false) {
        crate::info!(
            "rd.systemd.sysext= on the kernel command line turns off the initramfs's own extensions only (systemd-sysext-initrd.service), not the merge of the real root's"
        );
    }
    let why = match m {
        Merge::Initramfs => format!(
            "the initramfs's {SYSROOT_UNIT}, restarted once the links are in place (kernel command line, systemd)"
        ),
        Merge::RealRoot(why) => format!("the real root's systemd-sysext.service: {why}"),
        Merge::Off(why) => why.clone(),
    };
    match m {
        Merge::Off(_) => crate::warn!("merge: none at this boot: {why}"),
        _ => crate::info!("merge: {why}"),
    }
    status::decide("merge", m.word(), why);
}

/// Restarts the initramfs's merge so that it takes what this run linked, and proves it holds
/// `names` (`systemd-sysext --root /sysroot status`).
pub(crate) fn run(sysroot: &Path, names: &[&str]) -> Result<()> {
    again()?;
    let (merged, missing) = merged_and_missing(sysroot, names)?;
    if !missing.is_empty() {
        return Err(Error::failed(format!(
            "{SYSROOT_UNIT} merged {} but not {}: it skipped them; run `SYSTEMD_LOG_LEVEL=debug systemd-sysext --root={} refresh` for its reason",
            if merged.is_empty() { "nothing".into() } else { merged.join(", ") },
            missing.join(", "),
            sysroot.display()
        )));
    }
    crate::info!(
        "{SYSROOT_UNIT} merged {} into {}/usr before switch-root",
        merged.join(", "),
        sysroot.display()
    );
    Ok(())
}

/// What the initramfs merge of `sysroot` holds, and which of `names` it does not.
fn merged_and_missing(sysroot: &Path, names: &[&str]) -> Result<(Vec<String>, Vec<String>)> {
    let merged = merge::status_in(sysroot)?;
    let missing = names
        .iter()
        .filter(|n| !merged.iter().any(|m| m == *n))
        .map(|n| n.to_string())
        .collect();
    Ok((merged, missing))
}

/// Whether the initramfs merge of `sysroot` already holds every extension of `names`.
pub(crate) fn holds(sysroot: &Path, names: &[&str]) -> bool {
    merged_and_missing(sysroot, names).is_ok_and(|(_, missing)| missing.is_empty())
}

/// Restarts the initramfs merge and waits for it: it must end active, its conditions met.
pub(crate) fn again() -> Result<()> {
    let u = dbus::systemd_restart_wait(SYSROOT_UNIT, MERGE_DEADLINE)?;
    if u.active != "active" || !u.condition {
        return Err(Error::failed(format!(
            "{SYSROOT_UNIT} after its restart: {} ({}{}): journalctl -b -u {SYSROOT_UNIT} says why",
            u.active,
            if u.result.is_empty() {
                "no result"
            } else {
                &u.result
            },
            if u.condition {
                ""
            } else {
                ", a condition failed"
            }
        )));
    }
    Ok(())
}

/// Which merge made the running system's /usr: the initramfs's when systemd-sysext's `since`
/// for /usr is older than the real root's systemd (`UserspaceTimestamp`), else the real
/// root's. `None` when nothing is merged or either time is unknown (the reason logged).
pub(crate) fn which_took() -> Option<&'static str> {
    let since = match merge::since_usr() {
        Ok(Some(t)) => t,
        Ok(None) => return None,
        Err(e) => {
            crate::info!("which merge took the images: unknown: {e}");
            return None;
        }
    };
    match dbus::systemd_userspace_start() {
        Ok(start) => Some(took(since, start)),
        Err(e) => {
            crate::info!("which merge took the images: unknown: {e}");
            None
        }
    }
}

fn took(since_us: u64, userspace_us: u64) -> &'static str {
    if since_us < userspace_us {
        "initramfs"
    } else {
        "real-root"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(load: &str, file: &str) -> Result<UnitState> {
        Ok(UnitState {
            load: load.into(),
            file: file.into(),
            active: "inactive".into(),
            result: String::new(),
            condition: true,
        })
    }

    #[test]
    fn the_initramfs_merges_only_with_its_unit_pulled_in() {
        assert_eq!(decide("ro", unit("loaded", "enabled")), Merge::Initramfs);
        assert_eq!(decide("ro", unit("not-found", "")).word(), "real-root");
        assert_eq!(decide("ro", unit("masked", "masked")).word(), "real-root");
        assert_eq!(decide("ro", unit("loaded", "disabled")).word(), "real-root");
        assert_eq!(
            decide("ro", Err(Error::failed("no bus"))).word(),
            "real-root"
        );
    }

    #[test]
    fn the_kill_switches_are_systemds() {
        // systemd.sysext=0 stops both merges; rd.systemd.sysext=0 neither of them.
        assert_eq!(
            decide("systemd.sysext=0", unit("loaded", "enabled")).word(),
            "off"
        );
        assert_eq!(
            decide("systemd.sysext=no", unit("not-found", "")).word(),
            "off"
        );
        assert_eq!(
            decide("rd.systemd.sysext=0", unit("loaded", "enabled")),
            Merge::Initramfs
        );
    }

    #[test]
    fn a_merge_before_the_real_root_started_is_the_initramfs() {
        assert_eq!(took(1_000, 2_000), "initramfs");
        assert_eq!(took(3_000, 2_000), "real-root");
    }
}
