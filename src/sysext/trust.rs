//! Who vouches for an extension once it sits on the disk (docs/bootstrap.md, "Signed images").
//! `plain`: its SHA-256 in the signed SHA256SUMS, checked while it is fetched; a signed DDI is
//! taken too when its signer is a configured certificate. `signed`: only signed DDIs, merged
//! under systemd's strict policy, so that an image swapped on the disk later merges nothing of
//! itself. The certificates go where systemd's userspace check looks for the merge that counts
//! (the real root's /etc/verity.d; /run/verity.d too for a merge made now on the running
//! system); the policy goes where the node's systemd reads it, and into every systemd-sysext
//! call nodestrap makes.

use crate::crypto::digest::{hex, sha256};
use crate::crypto::pkcs7::Cert;
use crate::error::{Error, Result};
use crate::node::root::Root;
use crate::node::status;
use crate::node::undo::Undo;

/// The only policy strict on every systemd version: an image is signed, or absent. Never
/// `verity+signed`: from 259 that merges an image signed by an unknown key without checking.
pub(crate) const POLICY: &str = "root=signed+absent:usr=signed+absent";
/// Where systemd's userspace check looks first, on the real root; and this boot's.
const VERITY_D: &str = "/etc/verity.d";
const RUN_VERITY_D: &str = "/run/verity.d";
/// nodestrap's certificates there: `nodestrap-<first 16 hex of the SHA-256 of the DER>.crt`.
const PREFIX: &str = "nodestrap-";
/// systemd 257 and 258 read the policy only from the command line: a drop-in gives it to the
/// boot's merge.
const DROPIN: &str = "/etc/systemd/system/systemd-sysext.service.d/50-nodestrap-image-policy.conf";
/// systemd 259 and later: its configuration file's drop-in folder (`man sysext.conf`: 60–90 is
/// the range for drop-ins in /etc).
const CONF_DROPIN: &str = "/etc/systemd/sysext.conf.d/60-nodestrap-image-policy.conf";
/// Where systemd finds the drop-ins of systemd-sysext.service and of sysext.conf, first folder
/// first: a name in an earlier folder hides the same name in a later one, and the files apply
/// in the order of their names, the last one setting a key winning (systemd.unit(5),
/// sysext.conf(5); seen with systemd 262).
const UNIT_DROPIN_DIRS: [&str; 4] = [
    "/etc/systemd/system/systemd-sysext.service.d",
    "/run/systemd/system/systemd-sysext.service.d",
    "/usr/local/lib/systemd/system/systemd-sysext.service.d",
    "/usr/lib/systemd/system/systemd-sysext.service.d",
];
const CONF_DROPIN_DIRS: [&str; 4] = [
    "/etc/systemd/sysext.conf.d",
    "/run/systemd/sysext.conf.d",
    "/usr/local/lib/systemd/sysext.conf.d",
    "/usr/lib/systemd/sysext.conf.d",
];
/// A drop-in is a few lines; more than this is not one nodestrap reads.
const DROPIN_MAX: u64 = 64 << 10;
/// Folders hold a few drop-ins; more than this fail the check rather than go unread.
const DROPINS_MAX: usize = 256;
/// The first systemd with `--image-policy=`.
const MIN_POLICY_SYSTEMD: u32 = 254;

pub(crate) use crate::cli::SysextTrust as Mode;

/// The run's trust: the mode and the certificates (with where they came from).
pub(crate) struct Trust {
    pub(crate) mode: Mode,
    pub(crate) certs: Vec<Cert>,
    pub(crate) from: String,
    /// The node's systemd, which merges what is staged (`systemd_version`).
    pub(crate) systemd: Option<u32>,
}

impl Trust {
    /// The policy every merge of this node runs under, if nodestrap sets one.
    pub(crate) fn policy(&self) -> Option<&'static str> {
        (self.mode == Mode::Signed).then_some(POLICY)
    }

    /// The file name a certificate gets in a verity.d folder.
    fn file_name(c: &Cert) -> String {
        format!("{PREFIX}{}.crt", &hex(&sha256(&c.der))[..16])
    }

    /// How the record names the trust root of an image `signer` signed.
    pub(crate) fn root_of(&self, signer: usize) -> String {
        let c = &self.certs[signer];
        format!(
            "signed by {} (SHA-256 {}), trusted through {VERITY_D}/{}",
            c.name,
            hex(&sha256(&c.der)),
            Self::file_name(c)
        )
    }

    /// Signed mode on a node that cannot merge verity images is refused before anything is
    /// staged, naming what is missing: systemd 254 or later (the policy), dm-verity in its
    /// kernel, libcryptsetup.so.12 (which systemd loads to activate verity) and kmod (without
    /// it no module loads: not even loop). So is a node whose own drop-ins would have systemd
    /// merge under another policy (`overrides`), naming each file.
    pub(crate) fn check_node(&self, root: &Root) -> Result<()> {
        if self.mode == Mode::Plain {
            return Ok(());
        }
        let mut missing = Vec::new();
        match self.systemd {
            Some(v) if v >= MIN_POLICY_SYSTEMD => {}
            Some(v) => missing.push(format!(
                "systemd {v} has no --image-policy (254 or later needed)"
            )),
            None => missing.push("no libsystemd-shared-*.so: the node's systemd is unknown".into()),
        }
        if !has_verity(root) {
            missing.push(
                "no dm-verity in the kernel (neither /sys/module/dm_verity nor dm-verity.ko under /usr/lib/modules/$(uname -r))".into(),
            );
        }
        if lib_dirs()
            .iter()
            .all(|d| !root.exists(&format!("{d}/libcryptsetup.so.12")))
        {
            missing.push("no libcryptsetup.so.12 (Debian: libcryptsetup12), which systemd loads to activate verity".into());
        }
        if ![
            "/usr/bin/kmod",
            "/usr/sbin/modprobe",
            "/sbin/modprobe",
            "/bin/kmod",
        ]
        .iter()
        .any(|p| root.exists(p))
        {
            missing.push("no kmod: no module loads, not even loop".into());
        }
        if !missing.is_empty() {
            return Err(Error::failed(format!(
                "--sysext-trust signed: the node {} cannot merge signed images: {}",
                root.show("/"),
                missing.join("; ")
            )));
        }
        let overrides = overrides(root, systemd_version(root).unwrap_or(0))?;
        if overrides.is_empty() {
            return Ok(());
        }
        Err(Error::failed(format!(
            "--sysext-trust signed: the node's own configuration would merge under another image policy than {POLICY}: {}; take it away (or make it set the same policy) and run again",
            overrides.join("; ")
        )))
    }

    /// The certificates and the policy on the node, through `undo`: each configured
    /// certificate in /etc/verity.d (and /run/verity.d when `live`), nodestrap's certificates
    /// no longer configured taken away, and the policy set (signed) or nodestrap's policy
    /// files taken away (plain). Decisions record each.
    pub(crate) fn install(&self, root: &Root, live: bool, undo: &mut Undo) -> Result<()> {
        let mut dirs = vec![VERITY_D];
        if live {
            dirs.push(RUN_VERITY_D);
        }
        let want: Vec<(String, &Cert)> =
            self.certs.iter().map(|c| (Self::file_name(c), c)).collect();
        for dir in dirs {
            for (name, c) in &want {
                let pem = pem(&c.der);
                let path = format!("{dir}/{name}");
                if root.read(&path, 64 << 10)?.as_deref() != Some(pem.as_bytes()) {
                    undo.write(&path, pem.as_bytes(), 0o644)?;
                    crate::info!("{}: certificate {} installed", root.show(&path), c.name);
                }
            }
            let Some(d) = root.dir(dir)? else { continue };
            for n in d.entries()? {
                if n.starts_with(PREFIX)
                    && n.ends_with(".crt")
                    && !want.iter().any(|(w, _)| *w == n)
                {
                    undo.remove(&format!("{dir}/{n}"))?;
                    crate::info!(
                        "{}: removed: no longer a configured certificate ({})",
                        d.show(&n),
                        self.from
                    );
                }
            }
        }
        let version = systemd_version(root);
        let (path, text) = if version.is_some_and(|v| v >= 259) {
            (
                CONF_DROPIN,
                format!("# nodestrap --sysext-trust signed (docs/bootstrap.md, \"Signed images\").\n[SysExt]\nImagePolicy={POLICY}\n"),
            )
        } else {
            (
                DROPIN,
                format!(
                    "# nodestrap --sysext-trust signed (docs/bootstrap.md, \"Signed images\"): systemd {} reads\n# the image policy only from the command line.\n[Service]\nExecStart=\nExecStart=systemd-sysext refresh --image-policy={POLICY}\nExecReload=\nExecReload=systemd-sysext refresh --image-policy={POLICY}\n",
                    version.map_or("?".to_string(), |v| v.to_string())
                ),
            )
        };
        match self.mode {
            Mode::Signed => {
                if root.read(path, 64 << 10)?.as_deref() != Some(text.as_bytes()) {
                    undo.write(path, text.as_bytes(), 0o644)?;
                }
                for other in [DROPIN, CONF_DROPIN].into_iter().filter(|p| *p != path) {
                    undo.remove(other)?;
                }
                status::decide("image-policy", POLICY, root.show(path));
            }
            Mode::Plain => {
                for p in [DROPIN, CONF_DROPIN] {
                    undo.remove(p)?;
                }
                status::decide("image-policy", "systemd's default", "--sysext-trust plain");
            }
        }
        Ok(())
    }
}

/// What on the node would make its systemd-sysext merge under another policy than nodestrap's,
/// each naming its file: on systemd `version` 259 and later, an `ImagePolicy=` of sysext.conf's
/// drop-ins applied after nodestrap's; on every version, a drop-in of systemd-sysext.service
/// applied after nodestrap's (before 259) or anywhere (259 and later, where the command line
/// beats the configuration) that gives it another command line.
fn overrides(root: &Root, version: u32) -> Result<Vec<String>> {
    let mut found = Vec::new();
    let own_unit = DROPIN.rsplit('/').next().unwrap_or(DROPIN);
    let own_conf = CONF_DROPIN.rsplit('/').next().unwrap_or(CONF_DROPIN);
    let ours = format!("systemd-sysext refresh --image-policy={POLICY}");
    for (path, text) in dropins(root, &UNIT_DROPIN_DIRS)? {
        let name = path.rsplit('/').next().unwrap_or(&path);
        if version < 259 && name <= own_unit {
            continue;
        }
        for (section, key, value) in settings(&text) {
            // An empty value only resets the list: nothing runs under another policy.
            let command = section == "Service"
                && (key == "ExecStart" || key == "ExecReload")
                && !value.is_empty();
            let weaker = if version < 259 {
                value != ours
            } else {
                value.contains("--image-policy=") && value != ours
            };
            if command && weaker {
                found.push(format!("{} sets {key}={value}", root.show(&path)));
            }
        }
    }
    if version >= 259 {
        for (path, text) in dropins(root, &CONF_DROPIN_DIRS)? {
            if path.rsplit('/').next().unwrap_or(&path) <= own_conf {
                continue;
            }
            for (section, key, value) in settings(&text) {
                if section == "SysExt" && key == "ImagePolicy" && value != POLICY {
                    found.push(format!("{} sets ImagePolicy={value}", root.show(&path)));
                }
            }
        }
    }
    Ok(found)
}

/// The `*.conf` drop-ins of `dirs` that apply, as (node path, text), in the order systemd
/// applies them: by name, a name in an earlier folder hiding the same name in a later one.
fn dropins(root: &Root, dirs: &[&str]) -> Result<Vec<(String, String)>> {
    let mut by_name: std::collections::BTreeMap<String, String> = Default::default();
    for dir in dirs {
        let Some(d) = root.dir(dir)? else { continue };
        for n in d.entries()? {
            if n.ends_with(".conf") {
                by_name
                    .entry(n.clone())
                    .or_insert_with(|| format!("{dir}/{n}"));
            }
        }
        // Fail closed: a drop-in not read could be the one that weakens the policy.
        if by_name.len() > DROPINS_MAX {
            return Err(Error::failed(format!(
                "more than {DROPINS_MAX} drop-ins (up to {}): not read",
                root.show(dir)
            )));
        }
    }
    let mut out = Vec::new();
    for path in by_name.into_values() {
        // A drop-in linked to /dev/null (masked), or gone meanwhile, says nothing.
        if let Some(b) = root.read(&path, DROPIN_MAX)? {
            out.push((path, String::from_utf8_lossy(&b).into_owned()));
        }
    }
    Ok(out)
}

/// The (section, key, value) settings of a systemd configuration file, as systemd reads them
/// for what nodestrap asks: comments (`#`, `;`) and blank lines skipped, a `\` at a line's end
/// joining the next, keys and values trimmed. Never fails: a line that is no setting is none.
pub(crate) fn settings(text: &str) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let mut section = String::new();
    let mut lines = text.lines();
    while let Some(first) = lines.next() {
        let mut line = first.trim().to_string();
        if line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        while line.ends_with('\\') {
            line.pop();
            line.push(' ');
            match lines.next() {
                Some(next) => line.push_str(next.trim()),
                None => break,
            }
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.trim().to_string();
        } else if let Some((k, v)) = line.split_once('=') {
            out.push((section.clone(), k.trim().to_string(), v.trim().to_string()));
        }
    }
    out
}

/// The policy the run that wrote `record` set for the node's merges (its `image-policy`
/// decision), for every later systemd-sysext call on its behalf.
pub(crate) fn policy_of(record: &status::Record) -> Option<&'static str> {
    record
        .decisions
        .iter()
        .any(|d| d.what == "image-policy" && d.value == POLICY)
        .then_some(POLICY)
}

/// The node's systemd version, from its shared library's name (`libsystemd-shared-257.so`).
pub(crate) fn systemd_version(root: &Root) -> Option<u32> {
    for d in lib_dirs().iter().map(|d| format!("{d}/systemd")) {
        let Ok(Some(dir)) = root.dir(&d) else {
            continue;
        };
        for n in dir.entries().ok()? {
            if let Some(v) = n
                .strip_prefix("libsystemd-shared-")
                .and_then(|r| r.split(['.', '-']).next())
                .and_then(|v| v.parse().ok())
            {
                return Some(v);
            }
        }
    }
    None
}

fn lib_dirs() -> &'static [&'static str] {
    &[
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
        "/lib/x86_64-linux-gnu",
        "/lib/aarch64-linux-gnu",
    ]
}

/// dm-verity loaded, built in, or a module of the running kernel on the node.
fn has_verity(root: &Root) -> bool {
    if std::path::Path::new("/sys/module/dm_verity").exists() {
        return true;
    }
    let Ok(release) = std::fs::read_to_string("/proc/sys/kernel/osrelease") else {
        return false;
    };
    let base = format!("/usr/lib/modules/{}", release.trim());
    if root
        .read(&format!("{base}/modules.builtin"), 4 << 20)
        .ok()
        .flatten()
        .is_some_and(|b| String::from_utf8_lossy(&b).contains("/dm-verity.ko"))
    {
        return true;
    }
    ["", ".xz", ".zst", ".gz"]
        .iter()
        .any(|z| root.exists(&format!("{base}/kernel/drivers/md/dm-verity.ko{z}")))
}

fn pem(der: &[u8]) -> String {
    let b = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, der);
    let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in b.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}

#[cfg(test)]
mod tests {
    use super::settings;

    #[test]
    fn settings_read_as_systemd_writes_them() {
        let text = "# a comment\n; another\n[Service]\nExecStart=\nExecStart = systemd-sysext \\\n  refresh\n\n[SysExt]\nImagePolicy=root=signed+absent\nno setting here\n";
        let got: Vec<(String, String, String)> = settings(text);
        let want: Vec<(String, String, String)> = [
            ("Service", "ExecStart", ""),
            ("Service", "ExecStart", "systemd-sysext  refresh"),
            ("SysExt", "ImagePolicy", "root=signed+absent"),
        ]
        .iter()
        .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
        .collect();
        assert_eq!(got, want);
    }
}
