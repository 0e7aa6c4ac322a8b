//! This run's place in time and on the system: wall-clock and boot time, its process's start,
//! and the running system's run folder (`/run/nodestrap`), where the status records and the
//! events spool live. Below `status` and `events`, which both use it.

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::{Context, Error, Result};
use crate::node::dir::Durability;
use crate::node::root::Root;

/// `2026-11-25T01:40:00Z`: UTC, whole seconds (civil date from days since 1970, H. Hinnant);
/// the status record's times and reprovision's progress events.
pub(crate) fn rfc3339(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Time since the kernel started (CLOCK_BOOTTIME: the same as now less /proc/stat's btime, but
/// immune to the wall clock being set meanwhile): how long the node waited for its kubelet.
pub(crate) fn since_boot() -> std::time::Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    std::time::Duration::new(
        t.tv_sec.max(0) as u64,
        t.tv_nsec.clamp(0, 999_999_999) as u32,
    )
}

/// Field 22 of /proc/PID/stat (after the command name, which may hold spaces and parentheses).
pub(crate) fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// The running system's copy (a host path: in the initramfs, the /run that switch-root carries
/// over).
pub(crate) fn run_dir() -> PathBuf {
    crate::node::seams::Seam::RunDir.path()
}

/// A file of the running system's run folder.
pub(crate) fn run_file_named(name: &str) -> PathBuf {
    run_dir().join(name)
}

/// Replace `name` in the running system's run folder atomically, without fsync: /run is a
/// tmpfs, gone at the next boot anyway, and a run should not wait on a disk for its reports.
pub(crate) fn save_run_file(name: &str, bytes: &[u8]) -> Result<()> {
    let dir = run_dir();
    let at = dir.join(name);
    let save = || -> Result<()> {
        std::fs::create_dir_all(&dir).with_ctx(|| "creating it".to_string())?;
        let d = Root::open(&dir)?
            .dir("/")?
            .ok_or_else(|| Error::failed("gone while being written"))?;
        d.replace(name, bytes, 0o644, Durability::Volatile)?;
        d.sweep_leftovers(false);
        Ok(())
    };
    save().map_err(|e| Error::failed(format!("{}: {e}", at.display())))
}
