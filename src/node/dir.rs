//! A directory inside the root (`Root::dir`, `Root::make_dir`), resolved once: every name in it
//! is reached relative to its handle. A file is written under a temp name of nodestrap's
//! (`temp_name`), created with `O_EXCL` and locked while it is written, then `renameat` over the
//! final name; temp files and links a killed run left are swept.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use rustix::fs::{AtFlags, FileType, FlockOperation, Mode, OFlags, ResolveFlags};

use crate::crypto::digest::hex;
use crate::error::{Context, Error, Result};

/// Bytes a download leaves free on its target file system, beyond its own size.
pub(crate) const SPACE_MARGIN: u64 = 32 << 20;

/// A directory inside the root, resolved once; files are created relative to it.
pub(crate) struct Dir {
    fd: OwnedFd,
    /// Node path of the directory, for messages (`/var/lib/torcx/store/1.2.3`).
    node_path: String,
    shown: String,
}

/// An exclusive lock on a directory, held until dropped (`Dir::lock`).
pub(crate) struct DirLock {
    _fd: OwnedFd,
}

/// `.<name>.nodestrap-<hex>`: the names of nodestrap's temp files and links.
pub(crate) fn temp_name(name: &str) -> String {
    let mut rnd = [0u8; 6];
    rustix::rand::getrandom(&mut rnd, rustix::rand::GetRandomFlags::empty()).ok();
    format!(".{name}.nodestrap-{}", hex(&rnd))
}

fn is_temp_name(n: &str) -> bool {
    n.starts_with('.')
        && n.rsplit_once(".nodestrap-")
            .is_some_and(|(_, h)| h.len() == 12 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

impl Dir {
    /// A directory `Root` resolved: `node_path` names it in the node, `shown` in messages.
    pub(crate) fn new(fd: OwnedFd, node_path: String, shown: String) -> Dir {
        Dir {
            fd,
            node_path,
            shown,
        }
    }

    pub(crate) fn show(&self, name: &str) -> String {
        format!("{}/{}", self.shown.trim_end_matches('/'), name)
    }

    pub(crate) fn node_path(&self, name: &str) -> String {
        format!("{}/{}", self.node_path.trim_end_matches('/'), name)
    }

    /// Names in this directory (not `.`/`..`).
    pub(crate) fn entries(&self) -> Result<Vec<String>> {
        let fd = rustix::fs::openat(
            &self.fd,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .with_ctx(|| self.shown.clone())?;
        let mut out = Vec::new();
        for ent in rustix::fs::Dir::read_from(&fd).with_ctx(|| self.shown.clone())? {
            let ent = ent.with_ctx(|| self.shown.clone())?;
            let name = ent.file_name().to_bytes();
            if name != b"." && name != b".." {
                out.push(String::from_utf8_lossy(name).into_owned());
            }
        }
        out.sort();
        Ok(out)
    }

    /// A new temp file in this directory that becomes `name` on `persist`, and vanishes if
    /// dropped first: the final name only ever holds complete, verified content.
    pub(crate) fn create_temp(&self, name: &str, mode: u32) -> Result<TempFile<'_>> {
        self.sweep_temps(name);
        // Another run's sweep may take a new temp file in the instant before its lock is held
        // (it sees an unlocked temp, as a killed run leaves): such a file is unlinked or locked
        // by the sweeper when we come to lock it, and we start again under a new name.
        let mut tries = 0;
        loop {
            tries += 1;
            let t = self.try_create_temp(name, mode)?;
            let f = t.file.as_ref().expect("just opened");
            let locked = match rustix::fs::flock(f, FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => {
                    rustix::fs::fstat(f)
                        .with_ctx(|| self.show(&t.tmp))?
                        .st_nlink
                        > 0
                }
                Err(rustix::io::Errno::WOULDBLOCK) => false,
                Err(e) => return Err(e).with_ctx(|| self.show(&t.tmp)),
            };
            if locked {
                return Ok(t);
            }
            if tries == 8 {
                return Err(Error::failed(format!(
                    "creating a temp file in {}: taken by another run's sweep {tries} times",
                    self.shown
                )));
            }
        }
    }

    fn try_create_temp(&self, name: &str, mode: u32) -> Result<TempFile<'_>> {
        let tmp = temp_name(name);
        let fd = rustix::fs::openat(
            &self.fd,
            tmp.as_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(mode),
        )
        .with_ctx(|| format!("creating a temp file in {}", self.shown))?;
        // From here on the temp file goes with the handle if anything fails.
        let t = TempFile {
            dir: self,
            tmp,
            name: name.to_string(),
            file: Some(File::from(fd)),
        };
        let f = t.file.as_ref().expect("just opened");
        // The umask must not weaken or strengthen what the node expects.
        rustix::fs::fchmod(f, Mode::from_raw_mode(mode)).with_ctx(|| self.show(&t.tmp))?;
        Ok(t)
    }

    pub(crate) fn write_atomic(&self, name: &str, data: &[u8], mode: u32) -> Result<()> {
        self.replace(name, data, mode, Durability::Synced)
    }

    /// `name` replaced by `data` in one rename, after a temp file of nodestrap's naming.
    pub(crate) fn replace(&self, name: &str, data: &[u8], mode: u32, d: Durability) -> Result<()> {
        let mut t = self.create_temp(name, mode)?;
        t.write_all(data).with_ctx(|| self.show(name))?;
        t.persist_as(d)
    }

    /// Remove the temp links for `name` a run killed inside `replace_symlink` left (a link
    /// cannot be locked: only the one writer of `name`, or a caller holding this directory's
    /// `lock`, may).
    pub(crate) fn sweep_temp_links(&self, name: &str) {
        self.sweep(Some(name), true);
    }

    /// Remove temp files for `name` left by a run killed between create_temp and persist
    /// (a 4 GiB image must not linger because a unit was restarted mid-download).
    fn sweep_temps(&self, name: &str) {
        self.sweep(Some(name), false);
    }

    pub(crate) fn fsync(&self) -> Result<()> {
        rustix::fs::fsync(&self.fd).with_ctx(|| format!("fsync {}", self.shown))
    }

    /// Remove the directory `name` directly below this one and everything in it, relative to
    /// directory handles, never following a symlink nor crossing into another mount.
    /// `Ok(false)` when `name` is not a directory (left alone) or is gone already.
    pub(crate) fn remove_dir_tree(&self, name: &str) -> Result<bool> {
        if name.is_empty() || name == "." || name == ".." || name.contains('/') {
            return Err(Error::failed(format!(
                "{}: not a plain name to remove",
                self.show(name)
            )));
        }
        let st = match rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(rustix::io::Errno::NOENT) => return Ok(false),
            Err(e) => return Err(Error::from(e).context(self.show(name))),
        };
        if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
            return Ok(false);
        }
        // The parent's device: a store that is itself a mount point is refused too.
        let dev = rustix::fs::fstat(&self.fd)
            .map_err(|e| Error::from(e).context(self.show(".")))?
            .st_dev;
        remove_tree_at(&self.fd, name.as_ref(), dev).with_ctx(|| self.show(name))?;
        self.fsync()?;
        Ok(true)
    }

    /// Remove the directory `name` below this one if it is empty (anything in it stays, and so
    /// does it), then fsync this one.
    pub(crate) fn remove_empty_dir(&self, name: &str) -> Result<()> {
        match rustix::fs::unlinkat(&self.fd, name, AtFlags::REMOVEDIR) {
            Ok(()) => self.fsync(),
            Err(rustix::io::Errno::NOENT | rustix::io::Errno::NOTEMPTY) => Ok(()),
            Err(e) => Err(Error::from(e).context(format!("removing {}", self.show(name)))),
        }
    }

    /// Set this directory's permission bits.
    pub(crate) fn chmod(&self, mode: u32) -> Result<()> {
        rustix::fs::fchmod(&self.fd, Mode::from_raw_mode(mode)).with_ctx(|| self.shown.clone())
    }

    /// The path under which the system we run on reaches `name` here, for programs we start
    /// there; checked to be the very entry this handle sees, so a symlink on the way that leads
    /// elsewhere is refused rather than followed.
    pub(crate) fn host_path(&self, name: &str) -> Result<PathBuf> {
        use std::os::unix::fs::MetadataExt;
        let p = PathBuf::from(self.show(name));
        let by_path = std::fs::metadata(&p).with_ctx(|| p.display())?;
        let by_fd = rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW)
            .with_ctx(|| self.show(name))?;
        if (by_path.dev(), by_path.ino()) != (by_fd.st_dev as u64, by_fd.st_ino as u64) {
            return Err(Error::failed(format!(
                "{}: the path leads elsewhere than the root's own handle (a symlink on the way?)",
                p.display()
            )));
        }
        Ok(p)
    }

    /// Open the regular file `name` in this directory for reading, never through a symlink.
    pub(crate) fn open(&self, name: &str) -> Result<File> {
        let fd = rustix::fs::openat(
            &self.fd,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .with_ctx(|| self.show(name))?;
        Ok(File::from(fd))
    }

    /// Remove the file `name`; gone already is fine.
    pub(crate) fn remove(&self, name: &str) -> Result<()> {
        match rustix::fs::unlinkat(&self.fd, name, AtFlags::empty()) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => self.fsync(),
            Err(e) => Err(Error::from(e).context(format!("removing {}", self.show(name)))),
        }
    }

    /// Create the directory `name` (mode 0700, it must not exist) directly below this one and
    /// open it, for scratch work only we may see (a payload unpacked there). Remove it with
    /// `remove_dir_tree`.
    pub(crate) fn create_private_dir(&self, name: &str) -> Result<File> {
        if name.is_empty() || name == "." || name == ".." || name.contains('/') {
            return Err(Error::failed(format!(
                "{}: not a plain name",
                self.show(name)
            )));
        }
        rustix::fs::mkdirat(&self.fd, name, Mode::from_raw_mode(0o700))
            .with_ctx(|| format!("creating {}", self.show(name)))?;
        let fd = rustix::fs::openat(
            &self.fd,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .with_ctx(|| self.show(name))?;
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(0o700)).with_ctx(|| self.show(name))?;
        Ok(File::from(fd))
    }

    /// Point the symlink `name` at `target` in one step: a new link under a temp name renamed
    /// over it, then the directory fsynced. A crash leaves the old link or the new one.
    pub(crate) fn replace_symlink(&self, target: &str, name: &str) -> Result<()> {
        let tmp = temp_name(name);
        rustix::fs::symlinkat(target, &self.fd, tmp.as_str())
            .with_ctx(|| format!("creating a link in {}", self.shown))?;
        if let Err(e) = rustix::fs::renameat(&self.fd, tmp.as_str(), &self.fd, name) {
            let _ = rustix::fs::unlinkat(&self.fd, tmp.as_str(), AtFlags::empty());
            return Err(Error::from(e).context(format!("switching {}", self.show(name))));
        }
        self.fsync()
    }

    /// Rename `from` to `to` in this directory (replacing `to`), then fsync the directory.
    pub(crate) fn rename(&self, from: &str, to: &str) -> Result<()> {
        rustix::fs::renameat(&self.fd, from, &self.fd, to)
            .with_ctx(|| format!("renaming {} to {}", self.show(from), self.show(to)))?;
        self.fsync()
    }

    /// A second name `to` for the file `name` (a hard link), then fsync the directory.
    pub(crate) fn hard_link(&self, name: &str, to: &str) -> Result<()> {
        rustix::fs::linkat(&self.fd, name, &self.fd, to, AtFlags::empty())
            .with_ctx(|| format!("linking {} to {}", self.show(to), self.show(name)))?;
        self.fsync()
    }

    /// The permission bits of `name` (not following a symlink).
    pub(crate) fn mode_of(&self, name: &str) -> Result<u32> {
        let st = rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW)
            .with_ctx(|| self.show(name))?;
        Ok(st.st_mode & 0o7777)
    }

    /// Hold this directory's exclusive lock (flock on its handle) until the guard goes, waiting
    /// up to `wait` for another run that holds it: one run at a time changes what is in it.
    pub(crate) fn lock(&self, wait: std::time::Duration) -> Result<DirLock> {
        let fd = rustix::fs::openat(
            &self.fd,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .with_ctx(|| self.shown.clone())?;
        let end = std::time::Instant::now() + wait;
        let mut told = false;
        loop {
            match rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => return Ok(DirLock { _fd: fd }),
                Err(rustix::io::Errno::WOULDBLOCK) if std::time::Instant::now() < end => {
                    if !told {
                        crate::info!(
                            "{} is locked by another nodestrap run: waiting up to {} s",
                            self.shown,
                            wait.as_secs()
                        );
                        told = true;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(100));
                }
                Err(rustix::io::Errno::WOULDBLOCK) => {
                    return Err(Error::failed(format!(
                        "{} is still locked by another nodestrap run after {} s",
                        self.shown,
                        wait.as_secs()
                    )))
                }
                Err(e) => return Err(Error::from(e).context(format!("locking {}", self.shown))),
            }
        }
    }

    /// Remove what killed runs left here: temp files nobody holds (`.<name>.nodestrap-*`, of
    /// any name) and, with `links`, temp symlinks of that pattern, which cannot be locked and
    /// so are removed only by a caller holding this directory's `lock`. Best effort: what
    /// cannot be removed is logged and left for the next run.
    pub(crate) fn sweep_leftovers(&self, links: bool) {
        self.sweep(None, links);
    }

    fn sweep(&self, only: Option<&str>, links: bool) {
        let names = match self.entries() {
            Ok(n) => n,
            Err(e) => return crate::warn!("not sweeping temp files: {e}"),
        };
        let prefix = only.map(|n| format!(".{n}.nodestrap-"));
        let ours = |n: &String| match &prefix {
            Some(p) => n.starts_with(p.as_str()),
            None => is_temp_name(n),
        };
        for n in names.iter().filter(|n| ours(n)) {
            // Held until the name is gone: a writer that creates a temp file locks it an
            // instant later, and must find it locked or unlinked, never taken from under it.
            let _held = match self.kind_of(n) {
                Some(FileType::Symlink) if links => None,
                Some(FileType::RegularFile) => {
                    // A live writer holds the lock on its temp file: only the dead ones go.
                    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
                    let Ok(fd) = rustix::fs::openat(&self.fd, n.as_str(), flags, Mode::empty())
                    else {
                        continue;
                    };
                    if rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive).is_err() {
                        continue;
                    }
                    Some(fd)
                }
                _ => continue,
            };
            match rustix::fs::unlinkat(&self.fd, n.as_str(), AtFlags::empty()) {
                Ok(()) => crate::info!(
                    "removed stale temp file {} (left by a killed run)",
                    self.show(n)
                ),
                Err(e) => crate::warn!(
                    "could not remove {}, left by a killed run: {}",
                    self.show(n),
                    io::Error::from(e)
                ),
            }
        }
    }

    /// Open `name` and hold its lock until the handle goes: tells `sweep_leftovers` of another
    /// run that this temp file is in use.
    pub(crate) fn hold(&self, name: &str) -> Result<OwnedFd> {
        let fd = rustix::fs::openat(
            &self.fd,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .with_ctx(|| self.show(name))?;
        rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive)
            .with_ctx(|| self.show(name))?;
        Ok(fd)
    }

    /// What `name` is, without following it.
    pub(crate) fn kind_of(&self, name: &str) -> Option<FileType> {
        rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW)
            .ok()
            .map(|st| FileType::from_raw_mode(st.st_mode))
    }

    /// The target of the symlink `name`, or `None`.
    pub(crate) fn link_target(&self, name: &str) -> Option<String> {
        let t = rustix::fs::readlinkat(&self.fd, name, Vec::new()).ok()?;
        Some(t.to_string_lossy().into_owned())
    }

    /// Bytes an unprivileged writer may still use on this directory's file system.
    pub(crate) fn free_bytes(&self) -> Result<u64> {
        let st = rustix::fs::fstatvfs(&self.fd).with_ctx(|| self.shown.clone())?;
        Ok(st.f_bavail.saturating_mul(st.f_frsize))
    }

    /// Refuse, with the numbers, a file of `bytes` that would leave less than `SPACE_MARGIN`
    /// free here (a full /var or /opt breaks more than this run).
    pub(crate) fn check_room(&self, name: &str, bytes: u64) -> Result<()> {
        let free = self.free_bytes()?;
        if bytes.saturating_add(SPACE_MARGIN) > free {
            return Err(Error::failed(format!(
                "not enough space for {}: it is {bytes} bytes, {SPACE_MARGIN} more are kept free, and {} has {free} bytes free",
                self.show(name),
                self.show("")
            )));
        }
        Ok(())
    }

    /// Whether this directory's file system is mounted read-only (an extension that ships /opt
    /// turns /opt/extensions read-only).
    pub(crate) fn read_only(&self) -> bool {
        rustix::fs::fstatvfs(&self.fd)
            .is_ok_and(|st| st.f_flag.contains(rustix::fs::StatVfsMountFlags::RDONLY))
    }
}

/// `rm -rf` of `name` under `parent` without following symlinks (`O_NOFOLLOW`, each level
/// opened relative to its parent); a directory on another device than `dev` is refused.
fn remove_tree_at(parent: &impl AsFd, name: &OsStr, dev: u64) -> io::Result<()> {
    let st = rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW)?;
    if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
        return Ok(rustix::fs::unlinkat(parent, name, AtFlags::empty())?);
    }
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    // RESOLVE_NO_XDEV also refuses bind mounts of the same filesystem, which st_dev cannot see.
    let fd = rustix::fs::openat2(
        parent,
        name,
        flags,
        Mode::empty(),
        ResolveFlags::NO_XDEV | ResolveFlags::NO_SYMLINKS,
    )?;
    if rustix::fs::fstat(&fd)?.st_dev != dev {
        return Err(io::Error::other(format!(
            "{}: a mount point, not removed",
            name.to_string_lossy()
        )));
    }
    let mut names = Vec::new();
    for ent in rustix::fs::Dir::read_from(&fd)? {
        let ent = ent?;
        let n = ent.file_name().to_bytes();
        if n != b"." && n != b".." {
            names.push(OsStr::from_bytes(n).to_owned());
        }
    }
    for n in names {
        remove_tree_at(&fd, &n, dev)?;
    }
    Ok(rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR)?)
}

pub(crate) struct TempFile<'a> {
    dir: &'a Dir,
    tmp: String,
    name: String,
    file: Option<File>,
}

impl TempFile<'_> {
    pub(crate) fn file(&mut self) -> &mut File {
        self.file.as_mut().expect("open until persisted")
    }

    /// Bytes written so far.
    pub(crate) fn written(&self) -> Result<u64> {
        let f = self.file.as_ref().expect("open until persisted");
        Ok(f.metadata().with_ctx(|| self.dir.show(&self.tmp))?.len())
    }

    /// The temp file opened again for reading (to check what was written before it is named).
    pub(crate) fn reopen(&self) -> Result<File> {
        let fd = rustix::fs::openat(
            &self.dir.fd,
            self.tmp.as_str(),
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .with_ctx(|| self.dir.show(&self.tmp))?;
        Ok(File::from(fd))
    }

    /// fsync the data, rename over the final name, fsync the directory.
    pub(crate) fn persist(self) -> Result<()> {
        self.persist_as(Durability::Synced)
    }

    pub(crate) fn persist_as(mut self, d: Durability) -> Result<()> {
        let f = self.file.take().expect("open until persisted");
        if d == Durability::Synced {
            f.sync_all().with_ctx(|| {
                format!(
                    "fsync of {} (temp file for {})",
                    self.dir.show(&self.tmp),
                    self.dir.show(&self.name)
                )
            })?;
        }
        // The lock stays held through the rename: released earlier, another run's sweep
        // could take the finished temp file for a killed run's.
        rustix::fs::renameat(
            &self.dir.fd,
            self.tmp.as_str(),
            &self.dir.fd,
            self.name.as_str(),
        )
        .with_ctx(|| format!("renaming into {}", self.dir.show(&self.name)))?;
        drop(f);
        self.tmp.clear();
        if d == Durability::Volatile {
            return Ok(());
        }
        self.dir
            .fsync()
            .map_err(|e| e.context(self.dir.show(&self.name)))
    }
}

/// Whether a replaced file must survive a crash. `Volatile` only for files on a tmpfs (the
/// running system's copy of the status record in /run), which a crash takes anyway: no fsync
/// to wait on, and none to fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Durability {
    Synced,
    Volatile,
}

impl Write for TempFile<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.file().write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.file().flush()
    }
}

impl Drop for TempFile<'_> {
    fn drop(&mut self) {
        if !self.tmp.is_empty() {
            let _ = rustix::fs::unlinkat(&self.dir.fd, self.tmp.as_str(), AtFlags::empty());
        }
    }
}
