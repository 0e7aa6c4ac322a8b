//! torcx formats and store layout: the signed package list (`torcx-package-list-v0`), the
//! versioned user store, profiles (`profile-manifest-v0`) and next-profile. Shared by the
//! bootstrap and the pre-reboot hook.

use serde::{Deserialize, Serialize};

use crate::crypto::digest::Digest;
use crate::error::{Context, Error, Result};
use crate::net::oci::{self, Reference};
use crate::node::dir::Dir;
use crate::node::root::{plain_name, Root};
use crate::node::undo::Undo;
use crate::node::verified::{unchecked, write_verified, Expect, Staging, VerifiedWrite};
use crate::torcx::layout::{Layout, VENDOR_STORE};

pub(crate) const PACKAGE_LIST_KIND: &str = "torcx-package-list-v0";
pub(crate) const PROFILE_KIND: &str = "profile-manifest-v0";
/// The first Container Linux release with remote torcx manifests.
pub(crate) const MIN_REMOTE_OS: &str = "1520.3.0";
/// The profile the boot check returns to: a copy of the last profile torcx applied in a boot
/// that worked (docs/verify.md, "torcx nodes"). nodestrap never edits it as the user's.
pub(crate) const KNOWN_GOOD: &str = "nodestrap-known-good";

#[derive(Debug, Deserialize)]
pub struct PackageList {
    pub(crate) kind: String,
    pub value: PackageListValue,
}

#[derive(Debug, Deserialize)]
pub struct PackageListValue {
    pub packages: Vec<Package>,
}

#[derive(Debug, Deserialize)]
pub struct Package {
    pub name: String,
    #[serde(default)]
    pub versions: Vec<PackageVersion>,
}

#[derive(Debug, Deserialize)]
pub struct PackageVersion {
    pub version: String,
    pub(crate) hash: String,
    #[serde(default)]
    pub(crate) locations: Vec<Location>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct Location {
    pub(crate) path: Option<String>,
    pub(crate) url: Option<String>,
}

/// Where one image version comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// Shipped in that OS's `/usr/share/torcx/store/`: nothing to download.
    Vendored(String),
    Remote {
        url: String,
        digest: Digest,
    },
}

impl PackageList {
    /// Parse a manifest whose signature has already been checked. Every name, version, hash
    /// and URL is validated here so later steps never see a hostile value.
    pub fn parse(data: &[u8], name: &str) -> Result<PackageList> {
        let list: PackageList = serde_json::from_slice(data)
            .map_err(|e| Error::failed(format!("{name}: invalid package list JSON: {e}")))?;
        if list.kind != PACKAGE_LIST_KIND {
            return Err(Error::failed(format!(
                "{name}: kind is {:?}, expected {PACKAGE_LIST_KIND:?}",
                list.kind
            )));
        }
        for p in &list.value.packages {
            if !plain_name(&p.name) {
                return Err(Error::failed(format!(
                    "{name}: package name {:?} is not a plain name",
                    p.name
                )));
            }
            for v in &p.versions {
                let field = format!("{name}: package {} version {:?}", p.name, v.version);
                if !plain_name(&v.version) {
                    return Err(Error::failed(format!("{field}: not a plain version")));
                }
                if Digest::parse(&v.hash).is_none() {
                    return Err(Error::failed(format!(
                        "{field}: hash {:?} is not sha256-/sha384-/sha512-<hex>",
                        v.hash
                    )));
                }
                for l in &v.locations {
                    if let Some(u) = &l.url {
                        if u.starts_with("oci://") {
                            Reference::parse(u)
                                .map_err(|e| Error::failed(format!("{field}: location: {e}")))?;
                        } else if !(u.starts_with("https://") || u.starts_with("http://")) {
                            return Err(Error::failed(format!(
                                "{field}: location {u:?} is not an http(s) URL or an oci:// reference"
                            )));
                        }
                    }
                }
            }
        }
        Ok(list)
    }

    /// The versions of `name` this list offers, in its order.
    pub(crate) fn versions_of(&self, name: &str) -> Vec<&str> {
        self.value
            .packages
            .iter()
            .filter(|p| p.name == name)
            .flat_map(|p| p.versions.iter().map(|v| v.version.as_str()))
            .collect()
    }

    /// The source of `name:version`, if this OS offers it: a vendored store path wins,
    /// else the first URL.
    pub fn source_for(&self, name: &str, version: &str) -> Option<Source> {
        let p = self.value.packages.iter().find(|p| p.name == name)?;
        let v = p.versions.iter().find(|v| v.version == version)?;
        if let Some(path) = v
            .locations
            .iter()
            .filter_map(|l| l.path.as_ref())
            .find(|p| p.starts_with(&format!("{VENDOR_STORE}/")))
        {
            return Some(Source::Vendored(path.clone()));
        }
        let url = v.locations.iter().find_map(|l| l.url.clone())?;
        Some(Source::Remote {
            url,
            digest: Digest::parse(&v.hash)?,
        })
    }
}

/// Compare dotted numeric OS versions; `None` when either is not one (treated as new enough).
pub(crate) fn os_version_cmp(a: &str, b: &str) -> Option<std::cmp::Ordering> {
    let parse = |s: &str| {
        s.split('.')
            .map(|p| p.parse::<u64>().ok())
            .collect::<Option<Vec<_>>>()
    };
    Some(parse(a)?.cmp(&parse(b)?))
}

pub(crate) fn supports_remote(os_version: &str) -> bool {
    os_version_cmp(os_version, MIN_REMOTE_OS) != Some(std::cmp::Ordering::Less)
}

pub(crate) fn image_file(name: &str, version: &str) -> String {
    format!("{name}:{version}.torcx.tgz")
}

#[derive(Debug, PartialEq)]
pub(crate) enum Staged {
    /// Already in the store with the right hash.
    Kept,
    /// Copied from another store on this node after its hash matched.
    Copied(String),
    Downloaded(u64),
}

/// What to stage: `name:version` for OS `os_version`, from `url`, verified against `digest`,
/// at most `cap` bytes.
pub(crate) struct Wanted<'a> {
    pub(crate) os_version: &'a str,
    pub(crate) name: &'a str,
    pub(crate) version: &'a str,
    pub(crate) url: &'a str,
    pub(crate) digest: &'a Digest,
    pub(crate) cap: u64,
}

/// Put the image into the OS's user store (`<base_dir>/store/<os_version>/`), verified; every
/// change recorded in `undo` (a store this run made goes again on undo, so that torcx and the
/// hook never see an empty store of a version as present).
pub(crate) fn stage_image(
    root: &Root,
    registry: &oci::Client,
    layout: &Layout,
    w: &Wanted,
    undo: &mut Undo,
) -> Result<Staged> {
    if !plain_name(w.os_version) || !plain_name(w.name) || !plain_name(w.version) {
        return Err(Error::failed(format!(
            "refusing image {}:{} for OS {}: not plain names",
            w.name, w.version, w.os_version
        )));
    }
    let file = image_file(w.name, w.version);
    let store = layout.user_store(w.os_version);
    let dir = undo.make_dir(&store)?;
    dir.sweep_leftovers(false);
    if let Some(f) = root.open_file(&dir.node_path(&file))? {
        if w.digest.matches(f).with_ctx(|| dir.show(&file))? {
            return Ok(Staged::Kept);
        }
        crate::warn!(
            "{} does not match {}; replacing it",
            dir.show(&file),
            w.digest
        );
    }
    // The same image staged for another OS version (the hook stages current and next).
    for other in local_copies(root, layout, &file, &store)? {
        // Other stores are only a shortcut: one that cannot be read (a loose file named like
        // a version, a broken entry) just means downloading.
        let mut f = match root.open_file(&other) {
            Ok(Some(f)) => f,
            Ok(None) => continue,
            Err(e) => {
                crate::debug!("not copying from it: {e}");
                continue;
            }
        };
        if let Ok(m) = f.metadata() {
            dir.check_room(&file, m.len())?;
        }
        match write_verified(
            &dir,
            &file,
            0o644,
            &Expect::Digest(
                w.digest,
                crate::node::status::signed(crate::node::status::List::Manifest),
            ),
            &|_| Ok(()),
            &mut f,
            Some(&mut *undo),
        ) {
            Ok(_) => return Ok(Staged::Copied(root.show(&other))),
            Err(Staging::Mismatch { .. }) => {
                crate::debug!("{} does not match {}", root.show(&other), w.digest)
            }
            // Another store is only a shortcut: a copy that cannot be read is downloaded.
            Err(Staging::Read(e)) => crate::warn!("not copying from {}: {e}", root.show(&other)),
            Err(Staging::Write(e)) => return Err(e),
        }
    }
    let mut sink = into_store(&dir, &file, w.digest, undo);
    Ok(Staged::Downloaded(registry.download(
        w.url,
        w.cap,
        (&dir, &file),
        &mut sink,
    )?))
}

/// A download's sink: the body into file `name` of `dir` (mode 0644) through a temp file,
/// renamed into place (recorded in `undo`) only if it matches `digest`, the signed manifest's.
fn into_store<'a, 'u>(
    dir: &'a Dir,
    name: &'a str,
    digest: &'a Digest,
    undo: &'a mut Undo<'u>,
) -> VerifiedWrite<'a, 'u> {
    let expect = Expect::Digest(
        digest,
        crate::node::status::signed(crate::node::status::List::Manifest),
    );
    VerifiedWrite::new(dir, name, 0o644, expect, &unchecked, Some(undo))
}

fn local_copies(root: &Root, layout: &Layout, file: &str, except: &str) -> Result<Vec<String>> {
    let top = layout.store_root();
    let mut out = vec![format!("{top}/{file}")];
    if let Some(d) = root.dir(&top)? {
        for e in d.entries()? {
            let p = format!("{top}/{e}");
            if p != except && plain_name(&e) {
                out.push(format!("{p}/{file}"));
            }
        }
    }
    Ok(out)
}

#[derive(Debug, Serialize, Deserialize, Default)]
pub struct Profile {
    pub kind: String,
    pub value: ProfileValue,
}

#[derive(Debug, Serialize, Deserialize, Default)]
pub struct ProfileValue {
    pub images: Vec<ProfileImage>,
}

#[derive(Debug, Serialize, Deserialize, Clone, PartialEq)]
pub struct ProfileImage {
    pub name: String,
    pub(crate) reference: String,
    /// profile-manifest-v1's optional remote, kept if present.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub(crate) remote: Option<String>,
}

impl Profile {
    pub fn parse(data: &[u8], name: &str) -> Result<Profile> {
        let p: Profile = serde_json::from_slice(data)
            .map_err(|e| Error::failed(format!("{name}: invalid profile JSON: {e}")))?;
        if p.kind != PROFILE_KIND && p.kind != "profile-manifest-v1" {
            return Err(Error::failed(format!(
                "{name}: kind is {:?}, expected {PROFILE_KIND:?}",
                p.kind
            )));
        }
        Ok(p)
    }

    pub fn reference(&self, image: &str) -> Option<&str> {
        self.value
            .images
            .iter()
            .find(|i| i.name == image)
            .map(|i| i.reference.as_str())
    }
}

/// The profile to edit: an existing user (non-vendor) next-profile, else `default`.
/// Returns the name and a phrase saying why.
pub(crate) fn choose_profile(
    root: &Root,
    layout: &Layout,
    default: &str,
) -> Result<(String, String)> {
    let next = layout.next_profile();
    if let Some(t) = root.read_text(&next)? {
        let n = t.trim();
        let n = n.strip_suffix(".json").unwrap_or(n);
        if !n.is_empty()
            && n != "vendor"
            && n != KNOWN_GOOD
            && plain_name(n)
            && root.exists(&format!("{}/{n}.json", layout.profiles_dir()))
        {
            return Ok((
                n.to_string(),
                format!("existing next-profile in {}", root.show(&next)),
            ));
        }
        if !n.is_empty() {
            return Ok((
                default.to_string(),
                format!(
                    "{} names {n:?}, which is not a user profile",
                    root.show(&next)
                ),
            ));
        }
    }
    Ok((default.to_string(), "no user next-profile".to_string()))
}

/// The known-good profile's node path.
pub(crate) fn known_good_path(layout: &Layout) -> String {
    format!("{}/{KNOWN_GOOD}.json", layout.profiles_dir())
}

/// Before a run first changes the node's profile: the profile torcx applied in this boot (the
/// node booted with it) becomes the known-good profile the boot check can return to, unless
/// the node keeps one already (a boot check's, newer).
pub(crate) fn keep_known_good(root: &Root, layout: &Layout, undo: &mut Undo) -> Result<()> {
    let path = known_good_path(layout);
    if root.exists(&path) {
        return Ok(());
    }
    let applied = layout.applied_profile();
    let Some(b) = root.read(&applied, crate::node::root::CONFIG_CAP)? else {
        return Ok(());
    };
    Profile::parse(&b, &root.show(&applied))?;
    undo.write(&path, &b, 0o644)?;
    crate::info!(
        "{} kept as {}: the profile this boot runs, for the boot check to return to",
        root.show(&applied),
        root.show(&path)
    );
    Ok(())
}

/// Make `profile` hold `image:reference` (replacing that image's entry, keeping the others)
/// and select it for the next boot. Both files are replaced atomically, through `undo`.
pub(crate) fn set_profile_image(
    root: &Root,
    layout: &Layout,
    profile: &str,
    image: &str,
    reference: &str,
    undo: &mut Undo,
) -> Result<()> {
    if !plain_name(profile) {
        return Err(Error::config(format!(
            "profile name {profile:?} is not a plain name"
        )));
    }
    let path = format!("{}/{profile}.json", layout.profiles_dir());
    let mut p = match root.read(&path, crate::node::root::CONFIG_CAP)? {
        Some(b) => Profile::parse(&b, &root.show(&path))?,
        None => Profile {
            kind: PROFILE_KIND.into(),
            value: ProfileValue::default(),
        },
    };
    match p.value.images.iter_mut().find(|i| i.name == image) {
        Some(i) => i.reference = reference.to_string(),
        None => p.value.images.push(ProfileImage {
            name: image.into(),
            reference: reference.into(),
            remote: None,
        }),
    }
    let mut json = serde_json::to_vec_pretty(&p)?;
    json.push(b'\n');
    undo.write(&path, &json, 0o644)?;
    undo.write(
        &layout.next_profile(),
        format!("{profile}\n").as_bytes(),
        0o644,
    )
}

/// What torcx applied in this boot (`/run/torcx/profile.json`), if it ran.
/// The vendor reference `com.coreos.cl` is resolved through the vendor store's symlink
/// (`docker:com.coreos.cl.torcx.tgz -> docker:17.06.torcx.tgz`), so a vendor runtime that is the
/// chosen version does not count as a change.
pub(crate) fn applied_reference(
    root: &Root,
    layout: &Layout,
    image: &str,
) -> Result<Option<Option<String>>> {
    let applied = layout.applied_profile();
    let Some(b) = root.read(&applied, crate::node::root::CONFIG_CAP)? else {
        return Ok(None);
    };
    let reference = Profile::parse(&b, &root.show(&applied))?
        .reference(image)
        .map(str::to_string);
    Ok(Some(
        reference.map(|r| vendor_version(root, image, &r).unwrap_or(r)),
    ))
}

const DEFAULT_REFERENCE: &str = "com.coreos.cl";

/// `image`'s `reference` as a version: the vendor reference resolved through the vendor store's
/// symlink (as `applied_reference` reads it), any other as it is.
pub(crate) fn resolved_reference(root: &Root, image: &str, reference: &str) -> String {
    vendor_version(root, image, reference).unwrap_or_else(|| reference.to_string())
}

fn vendor_version(root: &Root, image: &str, reference: &str) -> Option<String> {
    if reference != DEFAULT_REFERENCE {
        return None;
    }
    let target = root.read_link(&format!("{VENDOR_STORE}/{}", image_file(image, reference)))?;
    let file = target.rsplit('/').next()?;
    let version = file
        .strip_prefix(&format!("{image}:"))?
        .strip_suffix(".torcx.tgz")?;
    plain_name(version).then(|| version.to_string())
}

/// Whether the hook's GC removes store `name`: a dotted version (`^\d+\.\d+\.\d+$`, as
/// tectonic-torcx) older than `current`, and neither `current` nor `next` (an update may go
/// back to an older version).
pub(crate) fn gc_candidate(name: &str, current: &str, next: &str) -> bool {
    let parts: Vec<&str> = name.split('.').collect();
    let dotted = parts.len() == 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    dotted
        && name != current
        && name != next
        && os_version_cmp(name, current) == Some(std::cmp::Ordering::Less)
}

/// What the GC did: the stores removed, and those that could not be (with why), as shown in
/// messages.
#[derive(Debug, Default)]
pub(crate) struct Collected {
    pub(crate) removed: Vec<String>,
    pub(crate) skipped: Vec<(String, Error)>,
}

/// Remove the versioned stores `gc_candidate` picks (directories only; files and symlinks
/// stay). A store that cannot be removed (a mount point, EBUSY, EXDEV, a permission error) is
/// skipped, and the others are still collected, whatever their order.
pub(crate) fn gc_stores(
    root: &Root,
    layout: &Layout,
    current: &str,
    next: &str,
) -> Result<Collected> {
    let Some(d) = root.dir(&layout.store_root())? else {
        return Ok(Collected::default());
    };
    let mut done = Collected::default();
    for e in d.entries()? {
        if !gc_candidate(&e, current, next) {
            continue;
        }
        match d.remove_dir_tree(&e) {
            Ok(true) => done.removed.push(d.show(&e)),
            Ok(false) => {}
            Err(err) => done.skipped.push((d.show(&e), err)),
        }
    }
    Ok(done)
}

/// The runtime unit that wipes docker's data dir at shutdown when the runtime version changes
/// (docker cannot downgrade its data dir). It lives in /run, so it is gone after the reboot.
pub(crate) const CLEANUP_UNIT: &str = "torcx-docker-cleanup.service";
const CLEANUP_UNIT_TEXT: &str = "\
[Unit]
Description=Clean docker datadir for torcx changes
DefaultDependencies=no
Before=docker.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/bin/rm -rf /var/lib/docker

[Install]
RequiredBy=umount.target
";

pub(crate) fn install_cleanup_unit(undo: &mut Undo) -> Result<()> {
    undo.write(
        &format!("/run/systemd/system/{CLEANUP_UNIT}"),
        CLEANUP_UNIT_TEXT.as_bytes(),
        0o644,
    )?;
    undo.link(
        &format!("/run/systemd/system/umount.target.requires/{CLEANUP_UNIT}"),
        &format!("../{CLEANUP_UNIT}"),
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_versions() {
        assert!(plain_name("17.03") && plain_name("docker") && plain_name("1.12.6-r1"));
        for bad in [
            "", "..", "../x", "a/b", "a:b", ".hidden", "-rf", "a b", "x\n",
        ] {
            assert!(!plain_name(bad), "{bad:?}");
        }
        assert!(
            supports_remote("1520.3.0")
                && supports_remote("1632.3.0")
                && supports_remote("nightly")
        );
        assert!(!supports_remote("1520.2.9") && !supports_remote("1298.7.0"));
    }

    #[test]
    fn gc_picks_only_older_dotted_versions() {
        let (cur, next) = ("2345.3.0", "2400.0.0");
        for old in ["1000.0.0", "1500.0.0", "2345.2.9", "999.99.99"] {
            assert!(gc_candidate(old, cur, next), "{old}");
        }
        for keep in [
            cur,
            next,
            "2345.03.0",
            "2345.3.1",
            "3000.0.0",
            "custom",
            "1000.0",
            "1000.0.0.1",
            "1000.0.0-r1",
            "v1000.0.0",
            "1000..0",
            ".1000.0.0",
            "docker:17.03.torcx.tgz",
            "",
        ] {
            assert!(!gc_candidate(keep, cur, next), "{keep}");
        }
        // An update back to an older release keeps that release's store.
        assert!(!gc_candidate("2300.0.0", cur, "2300.0.0"));
        // A current version that is not dotted numbers removes nothing.
        assert!(!gc_candidate("1000.0.0", "nightly", next));
    }

    #[test]
    fn source_prefers_vendored_path() {
        let j = br#"{"kind":"torcx-package-list-v0","value":{"packages":[{"name":"docker","defaultVersion":"1.12","versions":[
          {"version":"1.12","hash":"sha512-0e3e75234abc68f4378a86b3f4b32a198ba301845b0cd6e50106e874345700cc6663a86c1ea125dc5e92be17c98f9a0f85ca9d5f595db2012f7cc3571945c123","sourcePackage":"x","casDigest":"y",
           "locations":[{"url":"https://e/a.tgz"},{"path":"/usr/share/torcx/store/docker:1.12.torcx.tgz"}]},
          {"version":"17.06","hash":"sha512-0e3e75234abc68f4378a86b3f4b32a198ba301845b0cd6e50106e874345700cc6663a86c1ea125dc5e92be17c98f9a0f85ca9d5f595db2012f7cc3571945c123",
           "locations":[{"url":"https://e/b.tgz"}]}]}]}}"#;
        let l = PackageList::parse(j, "m").unwrap();
        assert_eq!(
            l.source_for("docker", "1.12"),
            Some(Source::Vendored(
                "/usr/share/torcx/store/docker:1.12.torcx.tgz".into()
            ))
        );
        assert!(
            matches!(l.source_for("docker", "17.06"), Some(Source::Remote { url, .. }) if url == "https://e/b.tgz")
        );
        assert_eq!(l.source_for("docker", "18.06"), None);
        let hostile = String::from_utf8_lossy(j).replace("\"17.06\"", "\"../../etc\"");
        assert!(PackageList::parse(hostile.as_bytes(), "m")
            .unwrap_err()
            .to_string()
            .contains("not a plain version"));
    }
}
