//! The kernel command line of the system we run on: the same kernel the node boots with in the
//! initramfs, on the real root and in a pod (a pod's /proc shows its host's).

use crate::error::Result;
use crate::node::root::read_host_file;

/// Larger than the kernel's own limit on any architecture.
const CAP: u64 = 64 << 10;

/// /proc/cmdline as text.
pub(crate) fn read() -> Result<String> {
    let p = crate::node::seams::Seam::ProcCmdline.path();
    let bytes = read_host_file(&p, CAP, "kernel command line")?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// The value of the first `key=value` argument, the line split on blanks without unquoting
/// (as torcx reads `torcx_config=`: `strings.Fields`, first match).
pub(crate) fn first_value<'a>(cmdline: &'a str, key: &str) -> Option<&'a str> {
    cmdline
        .split_whitespace()
        .find_map(|a| a.strip_prefix(key)?.strip_prefix('='))
}

/// A boolean kernel argument as systemd reads it (`proc_cmdline_get_bool`): the last `key=value`
/// wins, `-` and `_` in the key are the same, a bare `key` is true; `None` when absent or not
/// a boolean (systemd then keeps its default).
pub(crate) fn systemd_bool(cmdline: &str, key: &str) -> Option<bool> {
    let same = |a: &str| a.replace('_', "-") == key.replace('_', "-");
    let mut found = None;
    for w in cmdline.split_whitespace() {
        let (k, v) = w.split_once('=').unwrap_or((w, "1"));
        if same(k) {
            found = Some(v);
        }
    }
    // systemd unquotes the word and compares the value without regard to case.
    match found?.trim_matches('"').to_ascii_lowercase().as_str() {
        "1" | "yes" | "y" | "true" | "t" | "on" => Some(true),
        "0" | "no" | "n" | "false" | "f" | "off" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn systemd_booleans() {
        use super::systemd_bool as b;
        assert_eq!(b("ro systemd.sysext=0", "systemd.sysext"), Some(false));
        assert_eq!(
            b("systemd.sysext=0 systemd.sysext=yes", "systemd.sysext"),
            Some(true)
        );
        assert_eq!(b("systemd.sysext", "systemd.sysext"), Some(true));
        assert_eq!(b("rd.systemd.sysext=0", "systemd.sysext"), None);
        assert_eq!(b("rd.systemd.sysext=off", "rd.systemd.sysext"), Some(false));
        assert_eq!(b("systemd_sysext=no", "systemd.sysext"), None);
        assert_eq!(b("systemd.sys_ext=no", "systemd.sys-ext"), Some(false));
        assert_eq!(b("systemd.sysext=maybe", "systemd.sysext"), None);
        assert_eq!(b("systemd.sysext=No", "systemd.sysext"), Some(false));
        assert_eq!(b("systemd.sysext=\"off\"", "systemd.sysext"), Some(false));
    }

    #[test]
    fn values() {
        let c = "ro torcx_config=/a torcx_config_x=1 quiet torcx_config=/b\n";
        assert_eq!(super::first_value(c, "torcx_config"), Some("/a"));
        assert_eq!(super::first_value("torcx_config", "torcx_config"), None);
        assert_eq!(
            super::first_value("torcx_config=", "torcx_config"),
            Some("")
        );
    }
}
