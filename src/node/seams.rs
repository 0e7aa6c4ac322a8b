//! The host paths the tests move, each read here and nowhere else. All five are for tests
//! only: an operator has options, config files and the kernel command line, never a
//! `NODESTRAP_*` variable. An empty variable is an unset one.

use std::path::PathBuf;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Seam {
    /// The kernel command line (`/proc/cmdline`).
    ProcCmdline,
    /// The pod's service account folder (token, ca.crt).
    ServiceAccount,
    /// This boot's ID (`/proc/sys/kernel/random/boot_id`).
    BootId,
    /// The running system's copy of the status record (`/run/nodestrap`).
    RunDir,
    /// systemd-timesyncd's mark of a synchronised clock.
    TimesyncFile,
}

impl Seam {
    /// Where the running system has it.
    fn default_path(self) -> &'static str {
        match self {
            Seam::ProcCmdline => "/proc/cmdline",
            Seam::ServiceAccount => "/var/run/secrets/kubernetes.io/serviceaccount",
            Seam::BootId => "/proc/sys/kernel/random/boot_id",
            Seam::RunDir => "/run/nodestrap",
            Seam::TimesyncFile => "/run/systemd/timesync/synchronized",
        }
    }

    /// The variable a test sets to move it.
    fn var(self) -> &'static str {
        match self {
            Seam::ProcCmdline => "NODESTRAP_PROC_CMDLINE",
            Seam::ServiceAccount => "NODESTRAP_SA_DIR",
            Seam::BootId => "NODESTRAP_BOOT_ID",
            Seam::RunDir => "NODESTRAP_RUN_DIR",
            Seam::TimesyncFile => "NODESTRAP_TIMESYNC_FILE",
        }
    }

    /// The host path: the running system's, or where a test moved it.
    pub(crate) fn path(self) -> PathBuf {
        std::env::var_os(self.var())
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(self.default_path()))
    }
}

/// This boot's ID (a test moves it with `NODESTRAP_BOOT_ID`).
pub(crate) fn boot_id() -> crate::error::Result<String> {
    let p = Seam::BootId.path();
    std::fs::read_to_string(&p)
        .map(|s| s.trim().to_string())
        .map_err(|e| crate::error::Error::failed(format!("{}: {e}", p.display())))
}
