//! The clock's floor. Early in boot the real-time clock can be years behind (a flat CMOS
//! battery, a VM image restored from a snapshot); then every certificate looks not yet valid and
//! every signature made later looks like it comes from the future, and the error a user sees
//! names a certificate, not the clock. Before anything checks a validity period, the clock is
//! compared with a floor (the newest of nodestrap's build date and the node's own timestamps, as
//! systemd and systemd-timesyncd bump the clock at boot); a clock below it is waited on, for a
//! bounded time, until time synchronisation moves it, and otherwise is the error. nodestrap
//! never sets the clock itself.

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::{Error, Result};
use crate::node::root::Root;
use crate::node::status::{self, rfc3339};

/// The commit's time (or `SOURCE_DATE_EPOCH`), from build.rs; 0 when neither was known.
const BUILD_EPOCH: &str = env!("NODESTRAP_BUILD_EPOCH");
/// The node's files whose modification time the clock cannot be behind: os-release (written
/// when the image was built), systemd's epoch file, and the time systemd-timesyncd last saved.
const NODE_STAMPS: [&str; 3] = [
    "/usr/lib/os-release",
    "/usr/lib/clock-epoch",
    "/var/lib/systemd/timesync/clock",
];
const POLL: Duration = Duration::from_millis(500);

/// The newest time the clock cannot be before, and where it comes from.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Floor {
    pub(crate) at: SystemTime,
    pub(crate) source: String,
}

/// The floor: the newest of the build date and the node's stamps (whole seconds).
pub(crate) fn floor(root: &Root) -> Floor {
    let build = BUILD_EPOCH.parse::<u64>().unwrap_or(0);
    let mut f = Floor {
        at: UNIX_EPOCH + Duration::from_secs(build),
        source: "nodestrap's build date".into(),
    };
    for p in NODE_STAMPS {
        let Some(t) = root.modified(p) else { continue };
        // Whole seconds: a file written a moment ago is not ahead of the clock.
        let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let t = UNIX_EPOCH + Duration::from_secs(secs);
        if t > f.at {
            f = Floor {
                at: t,
                source: format!("the modification time of {}", root.show(p)),
            };
        }
    }
    f
}

/// systemd-timesyncd creates it once the clock is synchronised (a host path: the running
/// system's).
fn synchronized_file() -> PathBuf {
    crate::node::seams::Seam::TimesyncFile.path()
}

/// Go on when the clock is at or past the floor; else wait up to `wait` for it to get there
/// or for time synchronisation to vouch for it, then fail saying the clock is wrong.
pub(crate) fn check(root: &Root, wait: Duration) -> Result<()> {
    let f = floor(root);
    let sync = synchronized_file();
    let start = std::time::Instant::now();
    let mut said = false;
    loop {
        let now = SystemTime::now();
        if now >= f.at {
            if said {
                crate::info!(
                    "the clock now says {}, past {} ({}): going on",
                    rfc3339(now),
                    rfc3339(f.at),
                    f.source
                );
            }
            status::decide(
                "clock",
                rfc3339(now),
                format_args!("at or past {} ({})", rfc3339(f.at), f.source),
            );
            return Ok(());
        }
        if sync.exists() {
            // A synchronised clock outranks a floor from files: their times may be wrong.
            crate::warn!(
                "the clock says {}, before {} ({}), but time synchronisation vouches for it ({}): going on",
                rfc3339(now),
                rfc3339(f.at),
                f.source,
                sync.display()
            );
            status::decide(
                "clock",
                rfc3339(now),
                format_args!(
                    "synchronised ({}), although before {}",
                    sync.display(),
                    f.source
                ),
            );
            return Ok(());
        }
        let waited = start.elapsed();
        if !said {
            said = true;
            crate::warn!(
                "the clock is wrong: it says {}, before {} ({}); waiting up to {} s for time synchronisation ({}) before anything checks a certificate or a signature",
                rfc3339(now),
                rfc3339(f.at),
                f.source,
                wait.as_secs(),
                sync.display()
            );
        }
        if waited >= wait {
            return Err(Error::failed(format!(
                "the clock is wrong: it says {}, before {} ({}), and it was not synchronised within {} s ({} never appeared; --clock-wait); certificates and signatures cannot be checked against it, and nodestrap does not set the clock",
                rfc3339(now),
                rfc3339(f.at),
                f.source,
                wait.as_secs(),
                sync.display()
            )));
        }
        std::thread::sleep(POLL.min(wait - waited));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_build_date_is_embedded() {
        // Built from a git checkout (or with SOURCE_DATE_EPOCH): some time after 2024.
        assert!(
            BUILD_EPOCH.parse::<u64>().unwrap() > 1_704_067_200,
            "{BUILD_EPOCH}"
        );
    }
}
