//! On the running system: `systemd-sysext refresh`, a daemon-reload so that units inside the
//! images are seen, and proof that each extension is merged at the version chosen. The exit
//! code of systemd-sysext proves nothing (it exits 0 when it skipped every image), so the proof
//! is its `status --json`, `/usr` being an overlay, and the merged binary's own version.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::node::dbus;
use crate::node::exec::{self, Command};

const SYSEXT: &str = "systemd-sysext";
const TIMEOUT: Duration = Duration::from_secs(120);
const OUTPUT_CAP: usize = 1 << 20;

/// An extension expected in the merged /usr after a refresh.
pub(crate) struct Expect<'a> {
    pub(crate) name: &'a str,
    /// The version as its image's file name spells it (`v1.32.4`, `1.7.24`).
    pub(crate) label: String,
    pub(crate) version: String,
}

/// `systemd-sysext refresh` (under `policy`, the one the boot's merge uses, when nodestrap set
/// one), then daemon-reload.
pub(crate) fn refresh(policy: Option<&str>) -> Result<()> {
    let mut argv = vec![SYSEXT.to_string(), "refresh".into()];
    argv.extend(policy.map(|p| format!("--image-policy={p}")));
    let c = Command::new(&argv, TIMEOUT)?;
    let out = exec::capture(&c, SYSEXT, OUTPUT_CAP)?;
    for l in String::from_utf8_lossy(&out.stdout)
        .lines()
        .chain(out.tail.lines())
    {
        if !l.trim().is_empty() {
            crate::info!("{SYSEXT} refresh: {l}");
        }
    }
    if !out.exit.success() {
        return Err(Error::failed(format!(
            "{SYSEXT} refresh: {}: {}",
            out.exit,
            out.tail.trim()
        )));
    }
    // Units inside the images (kubelet's, containerd's) exist for systemd only after a reload;
    // systemd 252 never reloads by itself.
    dbus::systemd_reload()?;
    crate::info!("systemd reloaded: units inside the extensions are visible");
    Ok(())
}

/// Prove every extension in `want` is merged into /usr at its version.
pub(crate) fn prove(want: &[Expect]) -> Result<()> {
    let merged = status_usr()?;
    if !usr_is_overlay()? {
        return Err(Error::failed(
            "/usr is not an overlay after systemd-sysext refresh: nothing is merged",
        ));
    }
    for e in want {
        if !merged.iter().any(|m| m == e.name) {
            return Err(Error::failed(format!(
                "{SYSEXT} status does not list {} for /usr after refresh (merged: {}): it skipped the image; run `SYSTEMD_LOG_LEVEL=debug {SYSEXT} refresh` for its reason",
                e.name,
                if merged.is_empty() { "none".into() } else { merged.join(", ") }
            )));
        }
        if let Some(argv) = version_probe(e.name) {
            let said = exec::version_line(&argv).map_err(|why| {
                Error::failed(format!("{} after the merge: {why}", argv.join(" ")))
            })?;
            if !exec::says_version(&said, &e.version) {
                return Err(Error::failed(format!(
                    "{} after the merge: expected version {}, got {said}",
                    argv.join(" "),
                    e.label,
                )));
            }
            crate::info!(
                "{} merged into /usr: {} says {said}",
                e.name,
                argv.join(" ")
            );
        } else {
            crate::info!("{} merged into /usr ({SYSEXT} status)", e.name);
        }
    }
    Ok(())
}

/// The program whose `--version` tells which image of `name` is merged.
pub(crate) fn version_probe(name: &str) -> Option<Vec<String>> {
    let bin = match name {
        "kubernetes" => "/usr/bin/kubelet",
        "containerd" => "/usr/bin/containerd",
        "docker" => "/usr/bin/docker",
        _ => return None,
    };
    Some(vec![bin.into(), "--version".into()])
}

/// The extensions `systemd-sysext status --json=short` lists for /usr.
pub(crate) fn status_usr() -> Result<Vec<String>> {
    parse_status(&status_json(None)?)
}

/// The same for the root at `root` (`--root`: the initramfs's view of /sysroot).
pub(crate) fn status_in(root: &std::path::Path) -> Result<Vec<String>> {
    parse_status(&status_json(Some(root))?)
}

/// When /usr was merged (`since`, microseconds since the epoch); `None` when it is not.
pub(crate) fn since_usr() -> Result<Option<u64>> {
    parse_since(&status_json(None)?)
}

fn status_json(root: Option<&std::path::Path>) -> Result<Vec<u8>> {
    let mut argv = vec![SYSEXT.to_string()];
    argv.extend(root.map(|r| format!("--root={}", r.display())));
    argv.extend(["status".into(), "--json=short".into()]);
    let c = Command::new(&argv, TIMEOUT)?;
    let out = exec::capture(&c, SYSEXT, OUTPUT_CAP)?;
    if !out.exit.success() {
        return Err(Error::failed(format!(
            "{}: {}: {}",
            argv.join(" "),
            out.exit,
            out.tail.trim()
        )));
    }
    Ok(out.stdout)
}

fn usr_entry(json: &[u8]) -> Result<Option<serde_json::Value>> {
    let bad = |why: &str| Error::failed(format!("{SYSEXT} status --json: {why}"));
    let v: serde_json::Value =
        serde_json::from_slice(json).map_err(|e| bad(&format!("not JSON: {e}")))?;
    let list = v.as_array().ok_or_else(|| bad("not an array"))?;
    Ok(list
        .iter()
        .find(|h| h.get("hierarchy").and_then(|h| h.as_str()) == Some("/usr"))
        .cloned())
}

fn parse_since(json: &[u8]) -> Result<Option<u64>> {
    Ok(usr_entry(json)?.and_then(|u| u.get("since")?.as_u64()))
}

/// `[{"hierarchy":"/usr","extensions":["a","b"],…}]`; `extensions` is the string "none" when
/// nothing is merged.
pub(crate) fn parse_status(json: &[u8]) -> Result<Vec<String>> {
    let bad = |why: &str| Error::failed(format!("{SYSEXT} status --json: {why}"));
    let Some(usr) = usr_entry(json)? else {
        return Ok(Vec::new());
    };
    match usr.get("extensions") {
        Some(serde_json::Value::Array(a)) => a
            .iter()
            .map(|n| {
                n.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| bad("a name is not a string"))
            })
            .collect(),
        Some(serde_json::Value::String(s)) if s == "none" => Ok(Vec::new()),
        _ => Err(bad("/usr has no extensions field")),
    }
}

/// Whether the last mount on /usr in this mount namespace is an overlay.
fn usr_is_overlay() -> Result<bool> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| Error::failed(format!("/proc/self/mountinfo: {e}")))?;
    Ok(usr_fstype(&text).as_deref() == Some("overlay"))
}

fn usr_fstype(mountinfo: &str) -> Option<String> {
    mountinfo
        .lines()
        .rfind(|l| l.split(' ').nth(4) == Some("/usr"))
        .and_then(|l| l.split(" - ").nth(1)?.split(' ').next().map(str::to_string))
}

/// The service that runs from extension `name`'s image.
pub(crate) fn service_of(name: &str) -> Option<&'static str> {
    match name {
        "kubernetes" => Some("kubelet.service"),
        "containerd" => Some("containerd.service"),
        "docker" => Some("docker.service"),
        _ => None,
    }
}

/// After a merge that changed images: restart what runs from them (`systemctl try-restart`: a
/// service that is not running stays stopped), and nothing else. A restart that fails fails
/// the run, naming the command that finishes the job; the merge stays.
pub(crate) fn restart_changed(restart: &[(&'static str, String)]) -> Result<()> {
    for (unit, version) in restart {
        dbus::systemd_try_restart(unit).map_err(|e| {
            e.hint(format!(
                "{version} is merged and recorded, but {unit} still runs the previous binary: systemctl restart {unit}"
            ))
        })?;
        crate::info!("{unit} restarted (if it ran): its extension changed to {version}");
        crate::node::status::decide(
            unit,
            "restarted",
            format_args!("its extension changed to {version}"),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_whole_words() {
        assert!(exec::says_version("Kubernetes v1.32.3", "1.32.3"));
        assert!(exec::says_version(
            "containerd github.com/containerd/containerd v1.7.24 88bf19b2",
            "1.7.24"
        ));
        assert!(exec::says_version(
            "Docker version 24.0.9+dfsg1, build 2936816",
            "24.0.9"
        ));
        // Debian 13's containerd, as the QEMU guests run it.
        assert!(exec::says_version(
            "containerd github.com/containerd/containerd 1.7.24~ds1 1.7.24~ds1-6+deb13u1",
            "1.7.24"
        ));
        assert!(!exec::says_version("containerd 1.7.24", "1.7.2"));
        assert!(!exec::says_version("Kubernetes v1.32.30", "1.32.3"));
    }

    #[test]
    fn status_as_252_and_257_print_it() {
        let j = br#"[{"hierarchy":"/opt","extensions":"none","since":null},{"hierarchy":"/usr","extensions":["containerd","kubernetes"],"since":1795417018415437}]"#;
        assert_eq!(parse_status(j).unwrap(), vec!["containerd", "kubernetes"]);
        let none = br#"[{"hierarchy":"/usr","extensions":"none","since":null}]"#;
        assert!(parse_status(none).unwrap().is_empty());
        assert!(parse_status(b"{}").is_err());
        assert_eq!(parse_since(j).unwrap(), Some(1795417018415437));
        assert_eq!(parse_since(none).unwrap(), None);
    }

    #[test]
    fn last_usr_mount_wins() {
        let m = "22 1 8:1 / / rw - ext4 /dev/vda rw\n30 22 8:1 /usr /usr rw - ext4 /dev/vda rw\n41 30 0:40 / /usr ro,nodev,relatime - overlay overlay ro,lowerdir=/run/systemd/sysext/meta/usr:/run/systemd/sysext/extensions/k/usr:/usr\n";
        assert_eq!(usr_fstype(m).as_deref(), Some("overlay"));
        assert_eq!(usr_fstype("22 1 8:1 / / rw - ext4 /dev/vda rw\n"), None);
    }
}
