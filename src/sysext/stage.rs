//! Flatcar's layout on the node: images in `/opt/extensions/<name>/`, the current one named by
//! the symlink `/etc/extensions/<name>.raw`, older ones kept for rollback, and sysupdate
//! transfer files that follow the chosen minor's patch stream (docs/bootstrap.md, "sysext").

use std::io::Read;

use rustix::fs::FileType;

use crate::crypto::digest::{copy_hashing, CopyError};
use crate::error::{Error, Result};
use crate::net::fetch::{Http, Request, Staging};
use crate::node::root::{Dir, Root};
use crate::node::status;
use crate::sysext::host::Host;
use crate::sysext::image;
use crate::sysext::sums::{Image, Version};

/// systemd-sysext's highest-precedence search directory: symlinks only.
pub const LINKS: &str = "/etc/extensions";
/// Where the images are kept (never in a search directory: an unchecked or foreign file there
/// can stop every extension from merging).
pub const STORE: &str = "/opt/extensions";
/// Versions kept per extension: the current one and two older ones, as sysupdate's
/// `InstancesMax=3` keeps, so that nodestrap and sysupdate prune alike.
pub const KEEP: usize = 3;
/// Largest image taken.
pub const IMAGE_CAP: u64 = 4 << 30;

/// What `/etc/extensions/<name>.raw` is now.
#[derive(Debug, Clone, PartialEq)]
pub enum Link {
    Absent,
    /// A link into our store: the image's node path.
    Ours(String),
    /// The user's opt-out: a link to /dev/null, or a directory of that name.
    Masked(String),
    /// Something nodestrap did not make (another path, a plain file): left alone.
    Foreign(String),
}

impl Link {
    pub fn of(root: &Root, name: &str) -> Result<Link> {
        let Some(dir) = root.dir(LINKS, false)? else {
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
                    Link::Ours(t)
                } else {
                    Link::Foreign(format!("{} links to {t}", dir.show(&file)))
                }
            }
            Some(_) => Link::Foreign(format!("{} is not a symlink", dir.show(&file))),
        })
    }

    /// Whether systemd-sysext would merge something under this name from /etc/extensions.
    pub fn active(&self) -> bool {
        matches!(self, Link::Ours(_) | Link::Foreign(_))
    }
}

/// The image's place in the store.
pub fn image_path(img: &Image) -> String {
    format!("{STORE}/{}/{}", img.name, img.file)
}

/// Put `img` from `dir_url` into the store, verified: streamed into a temp file next to its
/// final name while SHA-256 is computed, checked as systemd-sysext will check it, and only then
/// fsynced and renamed. An image already there is hashed and checked again instead.
pub fn fetch_image(
    root: &Root,
    http: &Http,
    dir_url: &str,
    img: &Image,
    host: &Host,
) -> Result<()> {
    let dir = store_dir(root, &img.name)?;
    let shown = dir.show(&img.file);
    if dir.kind_of(&img.file) == Some(FileType::RegularFile) {
        let f = dir.open(&img.file)?;
        if img
            .digest
            .matches(&f)
            .map_err(|e| Error::from(e).context(shown.clone()))?
        {
            image::check(&f, &img.name, host, &shown)?;
            log::info!("{shown}: already in place, SHA-256 and contents checked again");
            status::staged(&image_path(img), &img.digest);
            return Ok(());
        }
        log::warn!("{shown}: its SHA-256 is not the signed one: fetching it again");
    }
    let url = format!("{dir_url}{}", img.file);
    let n = http.stream(&Request::get(&url), IMAGE_CAP, |body, total| {
        if let Some(t) = total {
            dir.check_room(&img.file, t).map_err(Staging::Write)?;
        }
        write_checked(&dir, img, host, body)
    })?;
    log::info!("{shown}: {n} bytes from {url}, SHA-256 matches the signed list, contents checked");
    status::staged(&image_path(img), &img.digest);
    Ok(())
}

fn store_dir(root: &Root, name: &str) -> Result<Dir> {
    let dir = root
        .dir(&format!("{STORE}/{name}"), true)?
        .expect("created");
    if dir.read_only() {
        return Err(Error::failed(format!(
            "{} is read-only: is an extension that ships /opt merged over it? (systemd-sysext makes all of /opt read-only then)",
            dir.show("")
        )));
    }
    Ok(dir)
}

fn write_checked(
    dir: &Dir,
    img: &Image,
    host: &Host,
    r: &mut dyn Read,
) -> std::result::Result<u64, Staging> {
    let mut tmp = dir.create_temp(&img.file, 0o644).map_err(Staging::Write)?;
    let mut hasher = img.digest.hasher();
    let n = match copy_hashing(&mut &mut *r, &mut hasher, tmp.file()) {
        Ok(n) => n,
        Err(CopyError::Read(e)) => return Err(Staging::Read(e)),
        Err(CopyError::Write(e)) => {
            return Err(Staging::Write(Error::from(e).context(dir.show(&img.file))))
        }
    };
    let got = hasher.finish_hex();
    if got != img.digest.hex {
        return Err(Staging::Mismatch(
            format!("sha256-{got}"),
            format!("the signed SHA256SUMS says {}", img.digest),
        ));
    }
    let f = tmp.reopen().map_err(Staging::Write)?;
    image::check(&f, &img.name, host, &dir.show(&img.file)).map_err(Staging::Write)?;
    tmp.persist().map_err(Staging::Write)?;
    Ok(n)
}

/// Point `/etc/extensions/<name>.raw` at the image in one step.
pub fn switch_link(root: &Root, img: &Image) -> Result<()> {
    let dir = root.dir(LINKS, true)?.expect("created");
    dir.replace_symlink(&image_path(img), &format!("{}.raw", img.name))?;
    log::info!(
        "{} -> {}",
        dir.show(&format!("{}.raw", img.name)),
        image_path(img)
    );
    Ok(())
}

/// Put the link back as it was before `switch_link`.
pub fn restore_link(root: &Root, name: &str, before: &Link) -> Result<()> {
    let dir = root.dir(LINKS, true)?.expect("created");
    let file = format!("{name}.raw");
    match before {
        Link::Ours(t) => dir.replace_symlink(t, &file)?,
        _ => dir.remove(&file)?,
    }
    log::warn!(
        "{} restored to {}",
        dir.show(&file),
        match before {
            Link::Ours(t) => t.as_str(),
            _ => "(none)",
        }
    );
    Ok(())
}

/// Remove all but the `KEEP` newest versions of `name` for `arch`; the link's target and `new`
/// are always kept. Returns the files removed.
pub fn prune(root: &Root, name: &str, arch: &str, keep: &[&str]) -> Result<Vec<String>> {
    let Some(dir) = root.dir(&format!("{STORE}/{name}"), false)? else {
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
        dir.remove(f)?;
        log::info!("removed {} (more than {KEEP} versions kept)", dir.show(f));
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

/// The sysupdate transfer for `img`'s minor: `/etc/sysupdate.<name>.d/<name>-<minor>.transfer`
/// and the same bytes as `.conf` (systemd < 257 reads only those). Files of other minors that
/// nodestrap wrote there are removed, so sysupdate follows exactly one patch stream.
pub fn write_transfer(root: &Root, img: &Image, dir_url: &str, signed: bool) -> Result<String> {
    let (major, minor) = img.version.minor();
    let v = if img.v_prefix { "v" } else { "" };
    let stream = format!("{}-{v}{major}.{minor}", img.name);
    let pattern = format!("{stream}.@v-%a.raw");
    // systemd expands %-specifiers in Path=: a literal % in the URL must be doubled.
    let path = dir_url.replace('%', "%%");
    let text = format!(
        "# Written by nodestrap: {name} follows the {v}{major}.{minor} patch stream of {dir_url}\n\
[Transfer]\nVerify={verify}\n\n\
[Source]\nType=url-file\nPath={path}\nMatchPattern={pattern}\n\n\
[Target]\nType=regular-file\nPath={STORE}/{name}\nMatchPattern={pattern}\nCurrentSymlink={LINKS}/{name}.raw\nInstancesMax={KEEP}\n",
        name = img.name,
        verify = if signed { "yes" } else { "no" },
    );
    let dir_path = format!("/etc/sysupdate.{}.d", img.name);
    let dir = root.dir(&dir_path, true)?.expect("created");
    let ours = [format!("{stream}.transfer"), format!("{stream}.conf")];
    for f in &ours {
        dir.write_atomic(f, text.as_bytes(), 0o644)?;
    }
    for f in dir.entries()? {
        let old = f.starts_with(&format!("{}-", img.name))
            && (f.ends_with(".transfer") || f.ends_with(".conf"))
            && !ours.contains(&f);
        if old {
            dir.remove(&f)?;
            log::info!("removed {} (another minor's patch stream)", dir.show(&f));
        }
    }
    Ok(dir.show(&ours[0]))
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
