//! The kernel privileges a command needs, checked before it touches the node: a run as an
//! ordinary user says so first, naming the capability and the fix, rather than failing later on
//! the first mount or node path it is refused.

use crate::error::{Error, Result};

/// A capability of capabilities(7), by its bit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cap {
    /// `mount(2)`: each sysext image is mounted read-only and checked as systemd-sysext will.
    SysAdmin,
}

impl Cap {
    fn bit(self) -> u32 {
        match self {
            Cap::SysAdmin => 21,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Cap::SysAdmin => "CAP_SYS_ADMIN",
        }
    }
}

/// The effective capability set of this process (`CapEff:` of /proc/self/status); `None` when
/// it cannot be read (no /proc): the command then goes on and the kernel says no where it does.
fn effective(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
}

/// `Ok` when this process holds `cap`, else exit 2 naming the command, the capability, what
/// it is for and the fix.
pub(crate) fn require(cap: Cap, command: &str, what_for: &str) -> Result<()> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    match effective(&status) {
        Some(set) if set & (1 << cap.bit()) == 0 => Err(Error::config(format!(
            "nodestrap {command} needs {} ({what_for}), which this process (uid {}) does not hold: run it as root, as its units and the initramfs do",
            cap.name(),
            rustix::process::geteuid().as_raw()
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_effective_set_is_read_from_proc_status() {
        let root = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\n";
        assert_eq!(effective(root), Some(0x1ff_ffff_ffff));
        assert!(effective(root).unwrap() & (1 << Cap::SysAdmin.bit()) != 0);
        let user = "CapEff:\t0000000000000000\n";
        assert_eq!(effective(user), Some(0));
        assert_eq!(effective("no such line\n"), None);
    }
}
