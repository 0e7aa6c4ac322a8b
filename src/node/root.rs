//! The node's root file system, opened once as a directory handle.
//!
//! Every node path is resolved by the kernel with `openat2(RESOLVE_IN_ROOT)`: `..` and symlinks
//! (absolute ones included) are evaluated as if the root were `/`, the way the node sees its own
//! files after switch-root, so nothing we read or write can land outside it. Writes never
//! follow a name: they create a fresh temp file with `O_EXCL` in the already-resolved target
//! directory and `renameat` it over the final name (`Dir`, in dir.rs).

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags, ResolveFlags};

use crate::error::{Context, Error, Result};
use crate::node::dir::Dir;

/// A size cap for configuration files read whole into memory.
pub(crate) const CONFIG_CAP: u64 = 4 << 20;

/// A directory handle: readable, not O_PATH, since it is listed and fsynced.
const DIR_FLAGS: OFlags = OFlags::RDONLY.union(OFlags::DIRECTORY);

pub struct Root {
    fd: OwnedFd,
    path: PathBuf,
    host: bool,
}

impl Root {
    pub(crate) fn open(path: &Path) -> Result<Root> {
        let fd = rustix::fs::open(
            path,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| Error::config(format!("--root {}: {}", path.display(), io::Error::from(e))))?;
        let canon = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        Ok(Root {
            fd,
            host: canon == Path::new("/"),
            path: canon,
        })
    }

    /// True when the root is the system we run on, the only case where we may talk to its
    /// systemd or reboot it.
    pub(crate) fn is_host(&self) -> bool {
        self.host
    }

    /// How a node path is named in messages: `/sysroot/etc/kubernetes/kubelet.env`.
    pub(crate) fn show(&self, node_path: &str) -> String {
        if self.host {
            node_path.to_string()
        } else {
            format!("{}{}", self.path.display(), node_path)
        }
    }

    fn resolve(&self, node_path: &str, flags: OFlags, mode: Mode) -> io::Result<OwnedFd> {
        let rel = node_path.trim_start_matches('/');
        let rel = if rel.is_empty() { "." } else { rel };
        rustix::fs::openat2(
            &self.fd,
            rel,
            flags | OFlags::CLOEXEC,
            mode,
            ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
        )
        .map_err(|e| {
            if e == rustix::io::Errno::NOSYS {
                io::Error::other("openat2 is not available (Linux 5.6 or later is needed)")
            } else {
                e.into()
            }
        })
    }

    /// The modification time of a regular file; `None` when it cannot be read.
    pub(crate) fn modified(&self, node_path: &str) -> Option<std::time::SystemTime> {
        self.open_file(node_path)
            .ok()??
            .metadata()
            .ok()?
            .modified()
            .ok()
    }

    /// Open a regular file for reading; `None` when it does not exist.
    pub(crate) fn open_file(&self, node_path: &str) -> Result<Option<File>> {
        match self.resolve(node_path, OFlags::RDONLY, Mode::empty()) {
            Ok(fd) => {
                let f = File::from(fd);
                let meta = f.metadata().with_ctx(|| self.show(node_path))?;
                if !meta.is_file() {
                    return Err(Error::failed("not a regular file").context(self.show(node_path)));
                }
                Ok(Some(f))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::from(e).context(self.show(node_path))),
        }
    }

    /// Read a whole file of at most `cap` bytes; `None` when it does not exist.
    pub(crate) fn read(&self, node_path: &str, cap: u64) -> Result<Option<Vec<u8>>> {
        let Some(f) = self.open_file(node_path)? else {
            return Ok(None);
        };
        read_capped(f, cap)
            .map(Some)
            .with_ctx(|| self.show(node_path))
    }

    /// Like `read` but the file must be UTF-8 text.
    pub(crate) fn read_text(&self, node_path: &str) -> Result<Option<String>> {
        match self.read(node_path, CONFIG_CAP)? {
            None => Ok(None),
            Some(b) => String::from_utf8(b)
                .map(Some)
                .map_err(|_| Error::failed("not UTF-8 text").context(self.show(node_path))),
        }
    }

    /// Remove a file (not a directory); a missing file is fine.
    pub(crate) fn remove(&self, node_path: &str) -> Result<()> {
        let (dir, name) = split_node_path(node_path)
            .ok_or_else(|| Error::config(format!("{node_path}: not a file path")))?;
        match self.dir(dir)? {
            Some(d) => d.remove(name),
            None => Ok(()),
        }
    }

    /// The target of a symlink, or `None` when `node_path` is missing or not a symlink.
    pub(crate) fn read_link(&self, node_path: &str) -> Option<String> {
        let (dir, name) = split_node_path(node_path)?;
        let d = self
            .resolve(dir, OFlags::PATH | OFlags::DIRECTORY, Mode::empty())
            .ok()?;
        let t = rustix::fs::readlinkat(&d, name, Vec::new()).ok()?;
        Some(t.to_string_lossy().into_owned())
    }

    pub(crate) fn exists(&self, node_path: &str) -> bool {
        self.resolve(node_path, OFlags::PATH, Mode::empty()).is_ok()
    }

    /// Open a directory; `None` when it does not exist.
    pub(crate) fn dir(&self, node_path: &str) -> Result<Option<Dir>> {
        match self.resolve(node_path, DIR_FLAGS, Mode::empty()) {
            Ok(fd) => Ok(Some(self.wrap_dir(fd, node_path))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::from(e).context(self.show(node_path))),
        }
    }

    /// Open a directory, creating it and its parents (mode 0755) first when it does not exist.
    pub(crate) fn make_dir(&self, node_path: &str) -> Result<Dir> {
        if let Some(d) = self.dir(node_path)? {
            return Ok(d);
        }
        // mkdir -p, one component at a time, each parent resolved inside the root. A new entry
        // is fsynced into its parent: it must survive a crash as much as the files put in it.
        let ro = DIR_FLAGS;
        let mut prefix = String::new();
        let mut parent = self
            .resolve("/", ro, Mode::empty())
            .with_ctx(|| self.show("/"))?;
        for comp in node_path.split('/').filter(|c| !c.is_empty() && *c != ".") {
            prefix.push('/');
            prefix.push_str(comp);
            match self.resolve(&prefix, ro, Mode::empty()) {
                Ok(fd) => parent = fd,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    match rustix::fs::mkdirat(&parent, comp, Mode::from_raw_mode(0o755)) {
                        Ok(()) => rustix::fs::fsync(&parent)
                            .with_ctx(|| format!("fsync parent of {}", self.show(&prefix)))?,
                        Err(rustix::io::Errno::EXIST) => {}
                        Err(e) => {
                            return Err(
                                Error::from(e).context(format!("creating {}", self.show(&prefix)))
                            )
                        }
                    }
                    parent = self
                        .resolve(&prefix, ro, Mode::empty())
                        .with_ctx(|| self.show(&prefix))?;
                }
                Err(e) => return Err(Error::from(e).context(self.show(&prefix))),
            }
        }
        Ok(self.wrap_dir(parent, node_path))
    }

    fn wrap_dir(&self, fd: OwnedFd, node_path: &str) -> Dir {
        let node_path = format!("/{}", node_path.trim_matches('/'));
        let shown = self.show(&node_path);
        Dir::new(fd, node_path, shown)
    }

    /// Split a node path into its directory (created if needed) and file name, for writing.
    pub(crate) fn parent_of(&self, node_path: &str) -> Result<(Dir, String)> {
        let (dir, name) = split_node_path(node_path)
            .ok_or_else(|| Error::config(format!("{node_path}: not a file path")))?;
        let d = self.make_dir(dir)?;
        Ok((d, name.to_string()))
    }

    /// Atomically replace `node_path` with `data`.
    pub(crate) fn write_atomic(&self, node_path: &str, data: &[u8], mode: u32) -> Result<()> {
        let (dir, name) = self.parent_of(node_path)?;
        dir.write_atomic(&name, data, mode)
    }
}

pub(crate) fn split_node_path(p: &str) -> Option<(&str, &str)> {
    let p = p.trim_end_matches('/');
    let (dir, name) = p.rsplit_once('/')?;
    if name.is_empty() || name == "." || name == ".." {
        return None;
    }
    Some((if dir.is_empty() { "/" } else { dir }, name))
}

pub(crate) fn read_capped(f: impl Read, cap: u64) -> io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    f.take(cap + 1).read_to_end(&mut buf)?;
    if buf.len() as u64 > cap {
        return Err(io::Error::other(format!(
            "larger than the {cap}-byte limit"
        )));
    }
    Ok(buf)
}

/// Open a file given on the command line (not a node path): keyring, CA file.
pub(crate) fn read_host_file(path: &Path, cap: u64, what: &str) -> Result<Vec<u8>> {
    let f = rustix::fs::open(path, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| Error::config(format!("{what} {}: {}", path.display(), io::Error::from(e))))?;
    read_capped(File::from(f), cap)
        .map_err(|e| Error::config(format!("{what} {}: {e}", path.display())))
}

/// Names that become file names (`<name>:<version>.torcx.tgz`, profile names) must be plain.
pub fn plain_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s != "."
        && s != ".."
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._+-".contains(&b))
        && !s.starts_with(['.', '-'])
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;
    use crate::crypto::digest::hex;

    fn tmp_root() -> (PathBuf, Root) {
        let mut rnd = [0u8; 8];
        rustix::rand::getrandom(&mut rnd, rustix::rand::GetRandomFlags::empty()).unwrap();
        let p = std::env::temp_dir().join(format!("nodestrap-root-{}", hex(&rnd)));
        std::fs::create_dir_all(&p).unwrap();
        let r = Root::open(&p).unwrap();
        (p, r)
    }

    /// CI's red at stop 40: runs sharing a folder (tests sharing one run folder; a node's
    /// units) sweep each other's temp files. A live writer's temp file is never taken, from
    /// its creation to its rename.
    #[test]
    fn concurrent_writers_and_sweepers_never_take_a_live_temp_file() {
        let (p, _r) = tmp_root();
        let threads: Vec<_> = (0..4)
            .map(|i| {
                let p = p.clone();
                std::thread::spawn(move || {
                    let d = Root::open(&p).unwrap().dir("/").unwrap().unwrap();
                    for n in 0..300 {
                        d.write_atomic("status.json", format!("{i} {n}").as_bytes(), 0o644)
                            .unwrap();
                        d.sweep_leftovers(false);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let d = Root::open(&p).unwrap().dir("/").unwrap().unwrap();
        assert_eq!(d.entries().unwrap(), ["status.json"]);
        std::fs::remove_dir_all(&p).unwrap();
    }

    #[test]
    fn symlinks_and_dotdot_stay_inside() {
        let (p, r) = tmp_root();
        let outside = p.with_extension("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("secret"), "outside").unwrap();
        std::fs::create_dir_all(p.join("etc")).unwrap();
        std::os::unix::fs::symlink(&outside, p.join("etc/abs")).unwrap();
        std::os::unix::fs::symlink("../../../../../..", p.join("etc/rel")).unwrap();
        assert!(r.read("/etc/abs/secret", 100).unwrap().is_none());
        assert!(r.read("/../../etc/rel/secret", 100).unwrap().is_none());
        // Writing through it resolves inside the root, where the target does not exist.
        let e = r.write_atomic("/etc/abs/new", b"x", 0o644).unwrap_err();
        assert!(e.to_string().contains("/etc/abs"), "{e}");
        assert!(!outside.join("new").exists());
        // Once the target exists inside the root, the same write lands there.
        std::fs::create_dir_all(p.join(outside.strip_prefix("/").unwrap())).unwrap();
        r.write_atomic("/etc/abs/new", b"x", 0o644).unwrap();
        assert!(!outside.join("new").exists());
        assert_eq!(
            std::fs::read(p.join(outside.strip_prefix("/").unwrap()).join("new")).unwrap(),
            b"x"
        );
        std::fs::remove_dir_all(&p).unwrap();
        std::fs::remove_dir_all(&outside).unwrap();
    }

    #[test]
    fn temp_file_vanishes_unless_persisted() {
        let (p, r) = tmp_root();
        let d = r.make_dir("/a/b").unwrap();
        {
            let mut t = d.create_temp("f", 0o600).unwrap();
            t.write_all(b"partial").unwrap();
        }
        assert!(d.entries().unwrap().is_empty());
        // A temp of a live writer (it holds the lock) is left alone...
        let live = d.create_temp("f", 0o600).unwrap();
        let other = d.create_temp("f", 0o600).unwrap();
        assert_eq!(d.entries().unwrap().len(), 2);
        drop((live, other));
        // ...while one left by a killed run is removed when the same file is written again.
        std::fs::write(p.join("a/b/.f.nodestrap-0123456789ab"), "stale").unwrap();
        std::fs::write(p.join("a/b/.g.nodestrap-0123456789ab"), "other file's").unwrap();
        let mut t = d.create_temp("f", 0o640).unwrap();
        t.write_all(b"done").unwrap();
        t.persist().unwrap();
        assert_eq!(
            d.entries().unwrap(),
            vec![".g.nodestrap-0123456789ab".to_string(), "f".to_string()]
        );
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(p.join("a/b/f"))
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o640
        );
        std::fs::remove_dir_all(&p).unwrap();
    }
}
