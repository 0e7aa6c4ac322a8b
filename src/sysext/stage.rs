//! Flatcar's layout on the node: images in `/opt/extensions/<name>/`, the current one named by
//! the symlink `/etc/extensions/<name>.raw`, and older ones kept for rollback (docs/bootstrap.md,
//! "sysext").

use crate::sysext::trust::Trust;
use rustix::fs::FileType;

use crate::error::{Error, Result};
use crate::node::dir::Dir;
use crate::node::root::Root;
use crate::node::status;
use crate::node::undo::Undo;
use crate::node::verified::{Expect, VerifiedWrite, Written};
use crate::sysext::host::Host;
use crate::sysext::image;
use crate::sysext::source::Source;
use crate::sysext::sums::{Image, Version};

/// systemd-sysext's highest-precedence search directory: symlinks only.
pub(crate) const LINKS: &str = "/etc/extensions";
/// Where the images are kept (never in a search directory: an unchecked or foreign file there
/// can stop every extension from merging).
pub(crate) const STORE: &str = "/opt/extensions";
/// Versions kept per extension: the current one and two older ones (systemd-sysupdate's
/// `InstancesMax=3` in Flatcar's sysext-bakery transfer files).
pub(crate) const KEEP: usize = 3;

/// What `/etc/extensions/<name>.raw` is now.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Link {
    Absent,
    /// A link into our store.
    Ours,
    /// The user's opt-out: a link to /dev/null, or a directory of that name.
    Masked(String),
    /// Something nodestrap did not make (another path, a plain file): left alone.
    Foreign(String),
}

impl Link {
    pub(crate) fn of(root: &Root, name: &str) -> Result<Link> {
        let Some(dir) = root.dir(LINKS)? else {
            return Ok(Link::Absent);
        };
        if dir.kind_of(name) == Some(FileType::Directory) {
            return Ok(Link::Masked(format!(
                "the directory {} hides it",
                dir.show(name)
            )));
        }
        let file = format!("{name}.raw");
        Ok(match dir.kind_of(&file) {
            None => Link::Absent,
            Some(FileType::Symlink) => {
                let t = dir.link_target(&file).unwrap_or_default();
                if t == "/dev/null" {
                    Link::Masked(format!("{} links to /dev/null", dir.show(&file)))
                } else if t.starts_with(&format!("{STORE}/{name}/")) && !t.contains("/../") {
                    Link::Ours
                } else {
                    Link::Foreign(format!("{} links to {t}", dir.show(&file)))
                }
            }
            Some(_) => Link::Foreign(format!("{} is not a symlink", dir.show(&file))),
        })
    }

    /// Whether systemd-sysext would merge something under this name from /etc/extensions.
    pub(crate) fn active(&self) -> bool {
        matches!(self, Link::Ours | Link::Foreign(_))
    }
}

/// The image's place in the store.
pub(crate) fn image_path(img: &Image) -> String {
    format!("{STORE}/{}/{}", img.name, img.file)
}

/// Put `img` from `dir_url` into the store, verified: streamed into a temp file next to its
/// final name while SHA-256 is computed, checked as systemd-sysext will check it, and only then
/// fsynced and renamed (recorded in `undo` first). An image already there is hashed and checked
/// again instead; one that does not match is set aside and fetched again. At most `cap` bytes.
pub(crate) fn fetch_image(
    source: &Source,
    dir_url: &str,
    img: &Image,
    host: &Host,
    trust: &Trust,
    cap: u64,
    undo: &mut Undo,
) -> Result<()> {
    // What vouches for the image once it is on the disk: the record says it per image.
    let vouched = |c: &image::Checked| {
        status::decide(
            &format!("{}-trust", img.name),
            match c.signer {
                Some(i) => trust.root_of(i),
                None => format!(
                    "none once on the disk: a plain image (its SHA-256 in {}, checked as fetched)",
                    status::signed(status::List::Sums)
                ),
            },
            img.file.as_str(),
        )
    };
    let dir = store_dir(&img.name, undo)?;
    let shown = dir.show(&img.file);
    if dir.kind_of(&img.file) == Some(FileType::RegularFile) {
        let f = dir.open(&img.file)?;
        if img
            .digest
            .matches(&f)
            .map_err(|e| Error::from(e).context(shown.clone()))?
        {
            vouched(&image::check(&f, &img.name, host, trust, &shown)?);
            crate::info!("{shown}: already in place, SHA-256 and contents checked again");
            status::staged(&image_path(img), &img.digest);
            return Ok(());
        }
        crate::warn!(
            "{shown}: its SHA-256 is not the one {} gives: fetching it again",
            status::signed(status::List::Sums)
        );
    }
    let check =
        |f: &std::fs::File| image::check(f, &img.name, host, trust, &shown).map(|c| vouched(&c));
    let sums = status::signed(status::List::Sums);
    let expect = Expect::Digest(&img.digest, sums);
    let mut sink = VerifiedWrite::new(&dir, &img.file, 0o644, expect, &check, Some(&mut *undo));
    let (Written { bytes: n, .. }, from) =
        source.image(dir_url, img, cap, (&dir, &img.file), &mut sink)?;
    crate::info!("{shown}: {n} bytes from {from}, SHA-256 matches {sums}, contents checked");
    status::staged(&image_path(img), &img.digest);
    Ok(())
}

/// The store of `name`, made (and recorded) if missing, with what killed runs left there swept.
fn store_dir(name: &str, undo: &mut Undo) -> Result<Dir> {
    let path = format!("{STORE}/{name}");
    let dir = undo.make_dir(&path)?;
    if dir.read_only() {
        return Err(Error::failed(format!(
            "{} is read-only: is an extension that ships /opt merged over it? (systemd-sysext makes all of /opt read-only then)",
            dir.show("")
        )));
    }
    dir.sweep_leftovers(false);
    Ok(dir)
}

/// Hold `/etc/extensions` (made if missing) for the rest of the run, so that no other run
/// switches links meanwhile, and sweep the temp links of runs killed while switching.
pub(crate) fn lock_links(undo: &mut Undo) -> Result<()> {
    let dir = undo.make_dir(LINKS)?;
    undo.keep_locked(dir.lock(std::time::Duration::from_secs(60))?);
    dir.sweep_leftovers(true);
    Ok(())
}

/// Point `/etc/extensions/<name>.raw` at the image in one step (nothing when it already does).
/// Returns whether the link changed.
pub(crate) fn switch_link(root: &Root, img: &Image, undo: &mut Undo) -> Result<bool> {
    relink(root, &img.name, &image_path(img), undo)
}

/// Point `/etc/extensions/<name>.raw` at `image`, a node path in the store.
pub(crate) fn relink(root: &Root, name: &str, image: &str, undo: &mut Undo) -> Result<bool> {
    let link = format!("{LINKS}/{name}.raw");
    let changed = undo.link(&link, image)?;
    if changed {
        crate::info!("{} -> {image}", root.show(&link));
    } else {
        crate::info!("{} already links to {image}", root.show(&link));
    }
    Ok(changed)
}

/// Set aside all but the `KEEP` newest versions of `name` for `arch`, to be deleted once the run
/// is done; the files in `keep` (the new image, the link's target) always stay. Returns the
/// files set aside.
pub(crate) fn prune(
    root: &Root,
    name: &str,
    arch: &str,
    keep: &[&str],
    undo: &mut Undo,
) -> Result<Vec<String>> {
    let Some(dir) = root.dir(&format!("{STORE}/{name}"))? else {
        return Ok(Vec::new());
    };
    let mut found: Vec<(Version, String)> = dir
        .entries()?
        .into_iter()
        .filter(|f| !f.starts_with('.'))
        .filter_map(|f| Some((version_of(&f, name, arch)?, f)))
        .collect();
    found.sort_by(|a, b| b.0.cmp(&a.0));
    let mut kept: Vec<&str> = keep.to_vec();
    let mut removed = Vec::new();
    for (_, f) in &found {
        if kept.contains(&f.as_str()) {
            continue;
        }
        if kept.len() < KEEP {
            kept.push(f);
            continue;
        }
        undo.set_aside(&dir.node_path(f))?;
        crate::info!(
            "removing {} (more than {KEEP} versions kept): set aside, deleted once the run is done",
            dir.show(f)
        );
        removed.push(f.clone());
    }
    Ok(removed)
}

fn version_of(file: &str, name: &str, arch: &str) -> Option<Version> {
    let mid = file
        .strip_prefix(name)?
        .strip_prefix('-')?
        .strip_suffix(".raw")?
        .strip_suffix(arch)?
        .strip_suffix('-')?;
    Version::parse(mid)
}

/// The first line of the systemd-sysupdate transfer files earlier versions wrote.
const TRANSFER_MARK: &str = "# Written by nodestrap:";

/// Take away the systemd-sysupdate transfer files (`.transfer`, `.conf`) that nodestrap wrote
/// in `/etc/sysupdate.<name>.d` before: they promised a patch stream that never ran
/// (docs/bootstrap.md, "No systemd-sysupdate files"). Files without nodestrap's first line
/// are the admin's and stay. Through `undo`, so a failed run puts them back.
pub(crate) fn remove_transfers(root: &Root, name: &str, undo: &mut Undo) -> Result<()> {
    let dir_path = format!("/etc/sysupdate.{name}.d");
    let Some(dir) = root.dir(&dir_path)? else {
        return Ok(());
    };
    for f in dir.entries()? {
        let candidate = f.starts_with(&format!("{name}-"))
            && (f.ends_with(".transfer") || f.ends_with(".conf"))
            && dir.kind_of(&f) == Some(FileType::RegularFile);
        if !candidate {
            continue;
        }
        let path = format!("{dir_path}/{f}");
        let ours = root
            .read(&path, 64 << 10)?
            .is_some_and(|b| b.starts_with(TRANSFER_MARK.as_bytes()));
        if ours {
            undo.remove(&path)?;
            crate::info!(
                "removed {}: nodestrap no longer writes systemd-sysupdate files",
                dir.show(&f)
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_from_store_names() {
        assert_eq!(
            version_of("kubernetes-v1.32.4-x86-64.raw", "kubernetes", "x86-64"),
            Version::parse("1.32.4")
        );
        assert_eq!(
            version_of("kubernetes-v1.32.4-arm64.raw", "kubernetes", "x86-64"),
            None
        );
        assert_eq!(
            version_of("kubernetes-cni-v1.6-x86-64.raw", "kubernetes", "x86-64"),
            None
        );
        assert_eq!(
            version_of("containerd-1.7.24-x86-64.raw", "containerd", "x86-64"),
            Version::parse("1.7.24")
        );
    }
}
