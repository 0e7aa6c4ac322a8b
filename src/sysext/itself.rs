//! `--self-update`: nodestrap itself, where Ignition installs it on a stock node
//! (`/opt/bin/nodestrap`: a stock Flatcar's `/usr` is the OS vendor's), moved forward by the
//! patch stream under an extension's rules (docs/bootstrap.md, "nodestrap itself"): the newest
//! release the signed source lists in its `nodestrap` folder, never below the version floor,
//! its SHA-256 checked against the signed list while it streams, then run (`--version` must
//! name that release: it runs on this node and is what the list says) before it takes the
//! name, through the run's undo log.

use crate::error::{Error, Result};
use crate::node::dir::{temp_name, Dir};
use crate::node::exec;
use crate::node::root::Root;
use crate::node::status;
use crate::node::undo::Undo;
use crate::node::verified::{unchecked, Expect, VerifiedWrite};
use crate::sysext::lists::Lists;
use crate::sysext::source::Source;
use crate::sysext::sums::{Image, Version};

/// The name of nodestrap's folder in the source and of its floor.
pub(crate) const NAME: &str = "nodestrap";
/// Where Ignition puts it (the units run it from there).
pub(crate) const INSTALLED: &str = "/opt/bin/nodestrap";
/// A release binary is under 4 MiB (docs/build.md): a larger file is not one.
const CAP: u64 = 16 << 20;

/// A newer release to install over the installed copy.
pub(crate) struct Update {
    pub(crate) img: Image,
    pub(crate) dir_url: String,
    installed: Version,
}

/// The installed copy's version, asked of it; exit 2 when there is none (the node image
/// carries nodestrap, and its vendor updates it).
fn installed_version(root: &Root) -> Result<Version> {
    if !root.exists(INSTALLED) {
        return Err(Error::config(format!(
            "--self-update: {} does not exist: nodestrap updates only the copy Ignition installs there (docs/bootstrap.md, \"Installed by Ignition\"); a node image that carries nodestrap is updated by its vendor",
            root.show(INSTALLED)
        )));
    }
    let (dir, name) = root.parent_of(INSTALLED)?;
    let path = dir.host_path(&name)?;
    let line = exec::version_line(&[path.display().to_string(), "--version".into()])
        .map_err(|e| Error::failed(format!("{}: --version: {e}", root.show(INSTALLED))))?;
    version_of(&line).ok_or_else(|| {
        Error::failed(format!(
            "{}: --version said {}, not `nodestrap VERSION`",
            root.show(INSTALLED),
            crate::logger::one_line(&line)
        ))
    })
}

/// `nodestrap 0.2.0` → 0.2.0.
fn version_of(line: &str) -> Option<Version> {
    let v = line.strip_prefix("nodestrap ")?;
    Version::parse(v.trim())
}

/// Step 3: the release to move to, if the source lists one newer than the installed copy.
pub(crate) fn choose(root: &Root, lists: &Lists) -> Result<Option<Update>> {
    let installed = installed_version(root)?;
    let (list, dir_url) = lists.get(NAME)?;
    let newest = lists
        .offered_executables(&list, NAME)?
        .into_iter()
        .max_by(|a, b| a.version.cmp(&b.version));
    let listed = Source::shown(&dir_url, "SHA256SUMS");
    match newest {
        Some(img) if img.version > installed => {
            crate::info!(
                "{NAME} {} chosen over the installed v{installed} ({listed})",
                img.label()
            );
            status::decide(
                NAME,
                img.label(),
                format_args!("{listed} (newer than the installed v{installed})"),
            );
            Ok(Some(Update {
                img,
                dir_url,
                installed,
            }))
        }
        Some(img) => {
            crate::info!(
                "{NAME} v{installed} installed: the newest release {listed} offers is {}",
                img.label()
            );
            status::decide(
                NAME,
                format_args!("v{installed}"),
                "installed, the newest offered",
            );
            Ok(None)
        }
        None => {
            crate::warn!(
                "{listed} offers no {NAME} release for {}: v{installed} stays",
                lists.arch
            );
            status::decide(
                NAME,
                format_args!("v{installed}"),
                "installed, none offered",
            );
            Ok(None)
        }
    }
}

/// Step 6: the release beside the installed copy, verified, proven to run, then renamed over
/// it (the old copy comes back if the run fails later). It runs from the next run on.
pub(crate) fn apply(root: &Root, source: &Source, u: &Update, undo: &mut Undo) -> Result<()> {
    let (dir, name) = root.parent_of(INSTALLED)?;
    // Under a temp name first: a release is run before it takes the name, and nothing may
    // still write to a file that runs. Whatever fails on the way takes that name away again
    // (a fetch whose rename came before a failed fsync included).
    let staged = temp_name(&name);
    let sums = status::signed(status::List::Sums);
    let installed = (|| -> Result<_> {
        let expect = Expect::Digest(&u.img.digest, sums);
        let mut sink = VerifiedWrite::new(&dir, &staged, 0o755, expect, &unchecked, None);
        let fetched = source.image(&u.dir_url, &u.img, CAP, (&dir, &staged), &mut sink)?;
        prove(&dir, &staged, &u.img)?;
        undo.creating(&dir, &name)?;
        dir.rename(&staged, &name)?;
        Ok(fetched)
    })();
    let (w, from) = installed.inspect_err(|_| {
        dir.remove(&staged).ok();
    })?;
    crate::info!(
        "{}: {NAME} {} installed over v{} ({} bytes from {from}, SHA-256 matches {sums}, runs as {}); the next run is the new release's",
        root.show(INSTALLED),
        u.img.label(),
        u.installed,
        w.bytes,
        u.img.label()
    );
    status::decide(
        NAME,
        u.img.label(),
        format_args!("installed at {INSTALLED} over v{}", u.installed),
    );
    Ok(())
}

/// The staged release runs here and says it is the version its name gives.
fn prove(dir: &Dir, staged: &str, img: &Image) -> Result<()> {
    let path = dir.host_path(staged)?;
    // The release by its name in the list, and where it waits (under a temp name).
    let shown = format!("{} (fetched as {})", img.file, dir.show(staged));
    let line = exec::version_line(&[path.display().to_string(), "--version".into()])
        .map_err(|e| Error::failed(format!("{shown}: it does not run on this node: {e}")))?;
    match version_of(&line) {
        Some(v) if v == img.version => Ok(()),
        _ => Err(Error::failed(format!(
            "{shown}: --version says {}, not nodestrap {}: the list names another release",
            crate::logger::one_line(&line),
            img.version
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_lines() {
        assert_eq!(version_of("nodestrap 0.2.0"), Version::parse("0.2.0"));
        assert_eq!(version_of("nodestrap 0.2.0\n"), Version::parse("0.2.0"));
        assert_eq!(version_of("kubelet 0.2.0"), None);
        assert_eq!(version_of("nodestrap"), None);
    }
}
