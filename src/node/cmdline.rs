//! The kernel command line of the system we run on: the same kernel the node boots with in the
//! initramfs, on the real root and in a pod (a pod's /proc shows its host's).

use crate::error::Result;
use crate::node::root::read_host_file;

/// Larger than the kernel's own limit on any architecture.
const CAP: u64 = 64 << 10;

/// /proc/cmdline as text.
pub fn read() -> Result<String> {
    let p = crate::node::seams::Seam::ProcCmdline.path();
    let bytes = read_host_file(&p, CAP, "kernel command line")?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// The value of the first `key=value` argument, the line split on blanks without unquoting
/// (as torcx reads `torcx_config=`: `strings.Fields`, first match).
pub fn first_value<'a>(cmdline: &'a str, key: &str) -> Option<&'a str> {
    cmdline
        .split_whitespace()
        .find_map(|a| a.strip_prefix(key)?.strip_prefix('='))
}

#[cfg(test)]
mod tests {
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
