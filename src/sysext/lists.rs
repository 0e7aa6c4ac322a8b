//! The signed lists of a sysext source (`SHA256SUMS` per directory): fetched once each, their
//! signature checked before they are parsed, fresh and never older than one this node
//! accepted; what they offer filtered by the boot check's refusals and the version floors;
//! and, once a run succeeded, the floors raised and the lists' freshness remembered.

use crate::cli::check::SysextUrl;
use crate::crypto::openpgp::Keyring;
use crate::error::{Error, Result};
use crate::net::fetch::{Failure, FetchError};
use crate::node::root::Root;
use crate::node::state_file::StateFile;
use crate::node::status;
use crate::node::undo::Undo;
use crate::sysext::known_good::KnownGood;
use crate::sysext::source::Source;
use crate::sysext::sums::{Date, Image, Sums, Version};

const SIGNATURE_CAP: u64 = 64 << 10;

/// The signed lists of the source, read once each.
pub(crate) struct Lists<'a> {
    pub(crate) source: &'a Source<'a>,
    pub(crate) url: &'a SysextUrl,
    pub(crate) keyring: Option<&'a Keyring>,
    pub(crate) arch: &'a str,
    pub(crate) known: &'a KnownGood,
    /// `--allow-downgrade`: exact versions let through the floor.
    pub(crate) downgrades: &'a [(String, String)],
    /// Lists already read, by directory: a flat source (one folder and one SHA256SUMS for every
    /// extension, as sysext-bakery publishes) is fetched and verified once.
    pub(crate) read: std::cell::RefCell<Vec<(String, Sums)>>,
    /// The newest BEST-BEFORE of each list read, remembered once the run succeeds.
    pub(crate) seen: std::cell::RefCell<Vec<(String, Date)>>,
}

impl Lists<'_> {
    /// The images of `name` for this node's architecture in `list`, without those a boot check
    /// refused (docs/verify.md).
    pub(crate) fn offered(&self, list: &Sums, name: &str) -> Result<Vec<Image>> {
        self.considered(list.images(name, self.arch), name)
    }

    /// nodestrap's own releases in `list` (`Sums::executables`), filtered as `offered` does.
    pub(crate) fn offered_executables(&self, list: &Sums, name: &str) -> Result<Vec<Image>> {
        self.considered(list.executables(name, self.arch), name)
    }

    fn considered(&self, mut out: Vec<Image>, name: &str) -> Result<Vec<Image>> {
        out.retain(|i| match self.known.refusal(name, &i.digest.to_string()) {
            Some(r) => {
                crate::warn!(
                    "{name} {} not considered: refused by the boot check at {} ({}; {})",
                    i.label(),
                    r.at,
                    r.why,
                    crate::sysext::known_good::PATH
                );
                false
            }
            None => true,
        });
        // Versions only go forward: below the floor only an exact version a setting names.
        if let Some((floor, f)) = self.known.floor.of(name) {
            let allowed = crate::node::floor::allowed(self.downgrades, name);
            let before = out.len();
            out.retain(|i| i.version >= floor || allowed.as_ref() == Some(&i.version));
            let why = format!(
                "{} version(s) below the floor {} (staged at {}; {}) not considered; --allow-downgrade {name}=VERSION lets one exact version through",
                before - out.len(),
                f.version,
                f.at,
                crate::sysext::known_good::PATH
            );
            if out.is_empty() && before > 0 {
                return Err(Error::failed(format!(
                    "{name}: every version the source offers is below the version floor: {why}"
                )));
            }
            if out.len() < before {
                crate::info!("{name}: {why}");
            }
        }
        Ok(out)
    }

    /// Why a version the list offers was not taken: it is below `name`'s version floor (the
    /// list as offered leaves it out, so "not offered" would not be true).
    pub(crate) fn below_floor(&self, list: &Sums, name: &str, wanted: &str) -> Option<Error> {
        let (floor, f) = self.known.floor.of(name)?;
        let v = Version::parse(wanted.split(['-', '+']).next()?)?;
        let listed = list.images(name, self.arch).iter().any(|i| i.version == v);
        (listed && v < floor).then(|| {
            Error::failed(format!(
                "--force-kube-version {wanted}: the source offers it, but it is below {name}'s version floor {} (staged at {}; {}): versions only go forward; --allow-downgrade {name}={wanted} lets it through",
                f.version,
                f.at,
                crate::sysext::known_good::PATH
            ))
        })
    }

    /// What this run accepted, once it succeeded: each staged version raises its floor (or, named
    /// by `--allow-downgrade`, lowers it, recorded), each list's BEST-BEFORE is remembered.
    /// Through `undo`, so a run that fails later leaves the file as it was.
    pub(crate) fn remember(&self, root: &Root, staged: &[&Image], undo: &mut Undo) -> Result<()> {
        let mut k = self.known.clone();
        let at = status::rfc3339(std::time::SystemTime::now());
        for img in staged {
            let named = self
                .downgrades
                .iter()
                .any(|(n, v)| *n == img.name && Version::parse(v).as_ref() == Some(&img.version));
            let lowered = named
                && self
                    .known
                    .floor
                    .of(&img.name)
                    .is_some_and(|(f, _)| img.version < f);
            if lowered {
                let from = self
                    .known
                    .floor
                    .of(&img.name)
                    .map(|(_, f)| f.version.clone());
                crate::warn!(
                    "{} downgraded to {} below its floor {} (--allow-downgrade): the floor is lowered",
                    img.name,
                    img.label(),
                    from.as_deref().unwrap_or("?")
                );
                status::decide(
                    "downgrade",
                    format_args!("{} {}", img.name, img.label()),
                    format_args!(
                        "--allow-downgrade, below the floor {}",
                        from.as_deref().unwrap_or("?")
                    ),
                );
            }
            k.floor
                .staged(&img.name, &img.version, &img.label(), &at, lowered);
        }
        for (url, d) in self.seen.borrow().iter() {
            k.saw_list(url, *d, &at);
        }
        if k != *self.known {
            undo.write(crate::sysext::known_good::PATH, &k.to_json()?, 0o644)?;
            crate::debug!(
                "{} updated (floors, lists)",
                root.show(crate::sysext::known_good::PATH)
            );
        }
        Ok(())
    }

    /// `SHA256SUMS` of `name`'s directory, its signature checked before it is parsed, and its
    /// freshness; with the directory's URL.
    pub(crate) fn get(&self, name: &str) -> Result<(Sums, String)> {
        let dir = self.url.dir(name)?;
        if let Some((_, s)) = self.read.borrow().iter().find(|(d, _)| *d == dir) {
            return Ok((s.clone(), dir));
        }
        let sums = self.fetch(&dir, name)?;
        self.read.borrow_mut().push((dir.clone(), sums.clone()));
        Ok((sums, dir))
    }

    fn fetch(&self, dir: &str, name: &str) -> Result<Sums> {
        let url = Source::shown(dir, "SHA256SUMS");
        let body = match self.source.get(dir, "SHA256SUMS", crate::sysext::sums::MAX_BYTES) {
            Ok(b) => b,
            Err(e) if e.class == Failure::Passed(404) => {
                return Err(e.error.hint(format!(
                    "the source has no list for {name} where --sysext-url points ({dir}): check --sysext-url and that the mirror holds {name}"
                )))
            }
            Err(e) => return Err(e.into()),
        };
        match self.keyring {
            Some(k) => {
                let get = |ext: &str| {
                    self.source
                        .get(dir, &format!("SHA256SUMS.{ext}"), SIGNATURE_CAP)
                };
                // As systemd-pull does: a detached armored signature when there is no .gpg.
                let absent = |e: &FetchError| e.class == Failure::Passed(404);
                let sig = match get("gpg") {
                    Ok(s) => s,
                    Err(e) if absent(&e) => match get("asc") {
                        Ok(s) => s,
                        Err(e) if absent(&e) => return Err(Error::failed(format!(
                            "{url} is not signed: neither SHA256SUMS.gpg nor SHA256SUMS.asc is beside it (HTTP 404 for both): sign it as systemd-sysupdate reads it (gpg --detach-sign --output SHA256SUMS.gpg SHA256SUMS) with a key of --keyring, or, dangerous, --no-verify-signatures"
                        ))),
                        Err(e) => return Err(e.into()),
                    },
                    Err(e) => return Err(e.into()),
                };
                let by = k.verify_detached(&body, &sig, &url)?;
                crate::info!("{url}: good signature by {by}");
            }
            None => crate::warn!("{url}: signature NOT checked (--no-verify-signatures)"),
        }
        let sums = Sums::parse(&body, &url)?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        sums.check_fresh(now, &url)?;
        // A signed list only goes forward: one older than a list this node accepted is stale.
        if let Some(newest) = sums.best_before.iter().max() {
            if let Some((seen, l)) = self.known.list_seen(&url) {
                if *newest < seen {
                    return Err(Error::failed(format!(
                        "{url}: stale: its newest marker is BEST-BEFORE-{newest}, older than BEST-BEFORE-{seen} of the list this node accepted from it at {} ({}): the source must publish a list at least as fresh",
                        l.at,
                        crate::sysext::known_good::PATH
                    )));
                }
            }
            self.seen.borrow_mut().push((url.clone(), *newest));
        }
        Ok(sums)
    }
}
