//! Unpacking a bootstrap payload (`.tar.gz`) into a private folder the caller has just made.
//!
//! The archive is untrusted input as far as the file system goes: every name is checked before
//! anything is written, each parent directory is resolved relative to the folder's handle with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`, files are created with
//! `O_CREAT | O_EXCL | O_NOFOLLOW`, so no entry can overwrite another one or write through a
//! symlink the archive planted. Symlinks are kept only when they stay inside the folder. The
//! first refusal stops the extraction; the caller removes the folder (`Dir::remove_dir_tree`).

use std::cell::Cell;
use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::rc::Rc;

use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use crate::error::{Error, Result};

/// Caps against archives that unpack to far more than they weigh.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Total bytes of file contents written.
    pub max_bytes: u64,
    /// Entries in the archive, directories and links included.
    pub max_entries: u64,
    /// Bytes in one entry's path (and in a symlink's target).
    pub max_path: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bytes: 1 << 30,
            max_entries: 100_000,
            max_path: 4096,
        }
    }
}

/// What was unpacked.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    pub files: u64,
    /// Directories created, the ones implied by a deeper path included.
    pub dirs: u64,
    pub symlinks: u64,
    pub hardlinks: u64,
    /// Bytes of file contents written (a hard link adds none).
    pub bytes: u64,
}

/// Bytes the tar reader may consume between two entries: headers, pax records and GNU long
/// names (the tar crate reads those whole into memory), padding, and data of entries that
/// carry none we use. Real archives need a few KiB.
const HEADER_CAP: u64 = 1 << 20;
/// Zero padding allowed after the end-of-archive marker (tar pads to 10 KiB records).
const TRAILER_CAP: u64 = 1 << 20;
const NAME_MAX: usize = 255;
const BLOCK: u64 = 512;

/// Unpack the gzip-compressed tar stream `src` into `dest`, an empty directory (the caller made
/// it, mode 0700). `label` names the archive in messages. Files keep their permission bits
/// `& 0o755`, directories are 0755, owners and times are not restored.
pub fn unpack_tar_gz(
    src: impl Read,
    dest: impl AsFd,
    label: &str,
    limits: &Limits,
) -> Result<Summary> {
    let dest = dest.as_fd();
    check_empty_dir(dest).map_err(|r| Error::failed(format!("{label}: destination: {r}")))?;
    let meter = Rc::new(MeterState::default());
    let gz = flate2::read::MultiGzDecoder::new(src);
    let mut archive = tar::Archive::new(Meter {
        inner: gz,
        st: meter.clone(),
    });
    let mut u = Unpacker {
        dest,
        label,
        limits,
        seen: HashMap::new(),
        symlinks: Vec::new(),
        sum: Summary::default(),
        buf: vec![0; 64 << 10],
    };
    let mut entries = archive.entries().map_err(|e| u.stream_err(None, e))?;
    let mut last: Option<String> = None;
    // Where the last entry's data (padded to a block) ends in the tar stream.
    let mut end = 0u64;
    let mut count = 0u64;
    loop {
        meter.mark.set(Some(meter.total.get()));
        let next = entries.next();
        meter.mark.set(None);
        let mut entry = match next {
            None => break,
            Some(Ok(e)) => e,
            Some(Err(e)) => return Err(u.stream_err(last.as_deref(), e)),
        };
        count += 1;
        let shown = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        if count > limits.max_entries {
            return Err(u.refuse(&shown, format!("more than {} entries", limits.max_entries)));
        }
        end = entry.raw_file_position() + entry.size().div_ceil(BLOCK) * BLOCK;
        u.entry(&mut entry, &shown)?;
        last = Some(shown);
    }
    // The tar reader also stops, without an error, where the stream simply ends: only the
    // zero block after the last entry shows that the archive is complete.
    if meter.total.get() < end + BLOCK {
        return Err(Error::failed(format!(
            "{label}: truncated: the tar stream ends without its end-of-archive marker"
        )));
    }
    // Reading the rest to EOF checks the gzip trailer (CRC-32 and length) and refuses a second
    // archive appended to the first.
    let mut rest = archive.into_inner().take(TRAILER_CAP + 1);
    let mut seen = 0u64;
    loop {
        let n = match rest.read(&mut u.buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                return Err(Error::failed(format!(
                    "{label}: at the end of the gzip stream: {e}"
                )))
            }
        };
        seen += n as u64;
        if seen > TRAILER_CAP || u.buf[..n].iter().any(|b| *b != 0) {
            return Err(Error::failed(format!(
                "{label}: data after the end of the tar archive"
            )));
        }
    }
    u.check_symlinks()?;
    Ok(u.sum)
}

#[derive(Default)]
struct MeterState {
    /// Bytes of tar stream read so far.
    total: Cell<u64>,
    /// Set while the tar reader looks for the next entry: `total` at that point.
    mark: Cell<Option<u64>>,
}

/// Counts the decompressed bytes and caps what the tar reader may read between entries.
struct Meter<R> {
    inner: R,
    st: Rc<MeterState>,
}

impl<R: Read> Read for Meter<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        let total = self.st.total.get() + n as u64;
        self.st.total.set(total);
        if let Some(mark) = self.st.mark.get() {
            if total - mark > HEADER_CAP {
                return Err(io::Error::other(format!(
                    "more than {HEADER_CAP} bytes of headers before one entry"
                )));
            }
        }
        Ok(n)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `explicit`: the archive has an entry for it (else it was implied by a deeper path).
    Dir {
        explicit: bool,
    },
    File,
    Symlink,
}

struct Unpacker<'a> {
    dest: BorrowedFd<'a>,
    label: &'a str,
    limits: &'a Limits,
    /// Every name created, normalised (`a/b`).
    seen: HashMap<String, Kind>,
    symlinks: Vec<String>,
    sum: Summary,
    buf: Vec<u8>,
}

impl Unpacker<'_> {
    fn refuse(&self, entry: &str, reason: impl std::fmt::Display) -> Error {
        Error::failed(format!("{}: {entry}: {reason}", self.label))
    }

    fn stream_err(&self, last: Option<&str>, e: io::Error) -> Error {
        match last {
            Some(l) => Error::failed(format!("{}: reading the entry after {l}: {e}", self.label)),
            None => Error::failed(format!("{}: reading the first entry: {e}", self.label)),
        }
    }

    fn entry<R: Read>(&mut self, e: &mut tar::Entry<'_, R>, shown: &str) -> Result<()> {
        use tar::EntryType as T;
        let ty = e.header().entry_type();
        if ty == T::XGlobalHeader {
            // Archive-wide pax records (git archive's commit id, defaults we don't apply).
            return Ok(());
        }
        let path = self
            .normalize(&e.path_bytes(), "path")
            .map_err(|r| self.refuse(shown, r))?;
        if path.is_empty() && ty != T::Directory {
            return Err(self.refuse(shown, "empty name"));
        }
        match ty {
            T::Directory if path.is_empty() => Ok(()), // `./`: the folder itself, left 0700
            T::Directory => self.mkdir(&path).map_err(|r| self.refuse(shown, r)),
            T::Regular => self.file(e, &path, shown),
            T::Symlink => self.symlink(e, &path).map_err(|r| self.refuse(shown, r)),
            T::Link => self.hardlink(e, &path).map_err(|r| self.refuse(shown, r)),
            T::Char => Err(self.refuse(shown, "character devices are not allowed")),
            T::Block => Err(self.refuse(shown, "block devices are not allowed")),
            T::Fifo => Err(self.refuse(shown, "FIFOs are not allowed")),
            T::GNUSparse => Err(self.refuse(shown, "sparse files are not supported")),
            other => Err(self.refuse(
                shown,
                format!(
                    "unsupported entry type '{}'",
                    char::from(other.as_byte()).escape_default()
                ),
            )),
        }
    }

    /// A relative path without `..`, `.` or empty components: `./a//b/` → `a/b`.
    fn normalize(&self, raw: &[u8], what: &str) -> Result<String, String> {
        if raw.len() > self.limits.max_path {
            return Err(format!("{what} longer than {} bytes", self.limits.max_path));
        }
        let s = std::str::from_utf8(raw).map_err(|_| format!("{what} is not UTF-8"))?;
        if s.is_empty() {
            return Err(format!("empty {what}"));
        }
        if s.starts_with('/') {
            return Err(format!("absolute {what}"));
        }
        let mut comps = Vec::new();
        for c in s.split('/').filter(|c| !c.is_empty() && *c != ".") {
            if c == ".." {
                return Err(format!("`..` in the {what}"));
            }
            if c.len() > NAME_MAX {
                return Err(format!(
                    "a name in the {what} is longer than {NAME_MAX} bytes"
                ));
            }
            comps.push(c);
        }
        Ok(comps.join("/"))
    }

    /// Check that a new entry's name is free; the kernel checks it again with `O_EXCL`.
    fn claim(&self, path: &str) -> Result<(), String> {
        match self.seen.get(path) {
            None => Ok(()),
            Some(_) => Err(dup()),
        }
    }

    /// The directory that holds `path`, created (0755) where missing, never through a symlink.
    fn parent(&mut self, path: &str) -> Result<(OwnedFd, String), String> {
        let (dir, name) = match path.rsplit_once('/') {
            Some((d, n)) => (d, n),
            None => ("", path),
        };
        let name = name.to_string();
        if dir.is_empty() {
            return open_beneath(self.dest, ".")
                .map(|fd| (fd, name))
                .map_err(|e| e.to_string());
        }
        if let Ok(fd) = open_beneath(self.dest, dir) {
            return Ok((fd, name));
        }
        // Missing (or refused): one component at a time, to create or to name the culprit.
        let mut fd = open_beneath(self.dest, ".").map_err(|e| e.to_string())?;
        let mut prefix = String::new();
        for c in dir.split('/') {
            if !prefix.is_empty() {
                prefix.push('/');
            }
            prefix.push_str(c);
            fd = match open_beneath(&fd, c) {
                Ok(next) => next,
                Err(Errno::NOENT) => {
                    rustix::fs::mkdirat(&fd, c, Mode::from_raw_mode(0o755))
                        .map_err(|e| format!("creating {prefix}: {}", io::Error::from(e)))?;
                    let next = open_beneath(&fd, c).map_err(|e| format!("{prefix}: {e}"))?;
                    // Exact mode whatever the umask.
                    rustix::fs::fchmod(&next, Mode::from_raw_mode(0o755))
                        .map_err(|e| format!("{prefix}: {e}"))?;
                    self.seen
                        .insert(prefix.clone(), Kind::Dir { explicit: false });
                    self.sum.dirs += 1;
                    next
                }
                Err(Errno::LOOP) => {
                    return Err(format!(
                        "{prefix} is a symlink: nothing is written through a link"
                    ))
                }
                Err(Errno::NOTDIR) => return Err(format!("{prefix} is not a directory")),
                Err(e) => return Err(format!("{prefix}: {}", io::Error::from(e))),
            };
        }
        Ok((fd, name))
    }

    fn mkdir(&mut self, path: &str) -> Result<(), String> {
        if self.seen.get(path) == Some(&Kind::Dir { explicit: false }) {
            // Implied by an earlier deeper entry: this one only confirms it.
            self.seen
                .insert(path.to_string(), Kind::Dir { explicit: true });
            return Ok(());
        }
        self.claim(path)?;
        let (parent, name) = self.parent(path)?;
        rustix::fs::mkdirat(&parent, name.as_str(), Mode::from_raw_mode(0o755)).map_err(errno)?;
        let fd = open_beneath(&parent, &name).map_err(errno)?;
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(0o755)).map_err(errno)?;
        self.seen
            .insert(path.to_string(), Kind::Dir { explicit: true });
        self.sum.dirs += 1;
        Ok(())
    }

    fn file<R: Read>(&mut self, e: &mut tar::Entry<'_, R>, path: &str, shown: &str) -> Result<()> {
        let size = e.size();
        let left = self.limits.max_bytes - self.sum.bytes;
        if size > left {
            return Err(self.refuse(
                shown,
                format!(
                    "{size} bytes would exceed the limit of {} unpacked bytes",
                    self.limits.max_bytes
                ),
            ));
        }
        let mode = e
            .header()
            .mode()
            .map_err(|err| self.refuse(shown, format!("mode: {err}")))?
            & 0o755;
        self.claim(path).map_err(|r| self.refuse(shown, r))?;
        let (parent, name) = self.parent(path).map_err(|r| self.refuse(shown, r))?;
        let fd = rustix::fs::openat(
            &parent,
            name.as_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(mode),
        )
        .map_err(|err| self.refuse(shown, errno(err)))?;
        self.seen.insert(path.to_string(), Kind::File);
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode))
            .map_err(|err| self.refuse(shown, errno(err)))?;
        let mut f = File::from(fd);
        let mut n = 0u64;
        loop {
            let got = match e.read(&mut self.buf) {
                Ok(0) => break,
                Ok(got) => got,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                Err(err) => return Err(self.refuse(shown, format!("reading: {err}"))),
            };
            n += got as u64;
            if n > size {
                return Err(self.refuse(shown, "more data than its header says"));
            }
            f.write_all(&self.buf[..got])
                .map_err(|err| self.refuse(shown, format!("writing: {err}")))?;
        }
        if n != size {
            return Err(self.refuse(
                shown,
                format!("truncated: {n} of {size} bytes in the archive"),
            ));
        }
        self.sum.bytes += n;
        self.sum.files += 1;
        Ok(())
    }

    fn symlink<R: Read>(&mut self, e: &tar::Entry<'_, R>, path: &str) -> Result<(), String> {
        let raw = e.link_name_bytes().ok_or("symlink without a target")?;
        if raw.len() > self.limits.max_path {
            return Err(format!(
                "symlink target longer than {} bytes",
                self.limits.max_path
            ));
        }
        let target =
            std::str::from_utf8(&raw).map_err(|_| "symlink target is not UTF-8".to_string())?;
        if target.is_empty() {
            return Err("empty symlink target".into());
        }
        if target.starts_with('/') {
            return Err(format!("symlink to the absolute path {target}"));
        }
        // Lexically, from the link's own directory; chains through other links are checked
        // by the kernel once everything is unpacked (`check_symlinks`).
        let mut at: Vec<&str> = path.split('/').collect();
        at.pop();
        for c in target.split('/') {
            match c {
                "" | "." => {}
                ".." => {
                    if at.pop().is_none() {
                        return Err(format!("symlink target {target} leaves the folder"));
                    }
                }
                c => at.push(c),
            }
        }
        self.claim(path)?;
        let (parent, name) = self.parent(path)?;
        rustix::fs::symlinkat(target, &parent, name.as_str()).map_err(errno)?;
        self.seen.insert(path.to_string(), Kind::Symlink);
        self.symlinks.push(path.to_string());
        self.sum.symlinks += 1;
        Ok(())
    }

    fn hardlink<R: Read>(&mut self, e: &tar::Entry<'_, R>, path: &str) -> Result<(), String> {
        let raw = e.link_name_bytes().ok_or("hard link without a target")?;
        let target = self.normalize(&raw, "hard link target")?;
        if self.seen.get(&target) != Some(&Kind::File) {
            return Err(format!(
                "hard link target {target} is not an earlier regular file of the archive"
            ));
        }
        self.claim(path)?;
        let (tparent, tname) = self.parent(&target)?;
        let (parent, name) = self.parent(path)?;
        rustix::fs::linkat(
            &tparent,
            tname.as_str(),
            &parent,
            name.as_str(),
            AtFlags::empty(),
        )
        .map_err(errno)?;
        self.seen.insert(path.to_string(), Kind::File);
        self.sum.hardlinks += 1;
        Ok(())
    }

    /// Each symlink, resolved by the kernel through the other links, must stay beneath the
    /// folder: `a -> b/..` is fine on its own but not once `b -> ..` exists.
    fn check_symlinks(&self) -> Result<()> {
        for p in &self.symlinks {
            let r = rustix::fs::openat2(
                self.dest,
                p.as_str(),
                OFlags::PATH | OFlags::CLOEXEC,
                Mode::empty(),
                ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS,
            );
            match r {
                // Dangling (or a loop) is harmless: nothing outside is reached.
                Ok(_) | Err(Errno::NOENT) | Err(Errno::LOOP) | Err(Errno::NOTDIR) => {}
                Err(Errno::XDEV) => {
                    return Err(
                        self.refuse(p, "symlink resolves outside the folder through other links")
                    )
                }
                Err(e) => return Err(self.refuse(p, errno(e))),
            }
        }
        Ok(())
    }
}

fn dup() -> String {
    "duplicate entry: the name exists already".into()
}

fn errno(e: Errno) -> String {
    if e == Errno::EXIST {
        dup()
    } else {
        io::Error::from(e).to_string()
    }
}

/// A directory below `dirfd`, never through a symlink nor out of it.
fn open_beneath(dirfd: impl AsFd, path: &str) -> Result<OwnedFd, Errno> {
    rustix::fs::openat2(
        dirfd,
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
}

fn check_empty_dir(dest: BorrowedFd<'_>) -> Result<(), String> {
    let fd = open_beneath(dest, ".").map_err(|e| io::Error::from(e).to_string())?;
    let dir = rustix::fs::Dir::read_from(&fd).map_err(|e| io::Error::from(e).to_string())?;
    for ent in dir {
        let ent = ent.map_err(|e| io::Error::from(e).to_string())?;
        let n = ent.file_name().to_bytes();
        if n != b"." && n != b".." {
            return Err("not an empty directory".into());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::digest::hex;
    use crate::node::root::Root;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::path::{Path, PathBuf};
    use tar::{Builder, EntryType, Header};

    const LABEL: &str = "payload.tar.gz";

    /// A private `dest` folder made as reprovision makes it, beside a `canary` folder that no
    /// refused archive may touch.
    struct Scratch {
        base: PathBuf,
        dest: File,
    }

    impl Scratch {
        fn new() -> Scratch {
            let mut rnd = [0u8; 8];
            rustix::rand::getrandom(&mut rnd, rustix::rand::GetRandomFlags::empty()).unwrap();
            let base = std::env::temp_dir().join(format!("nodestrap-payload-{}", hex(&rnd)));
            std::fs::create_dir_all(base.join("canary")).unwrap();
            std::fs::write(base.join("canary/keep"), "keep").unwrap();
            let root = Root::open(&base).unwrap();
            let dest = root
                .dir("/")
                .unwrap()
                .unwrap()
                .create_private_dir("dest")
                .unwrap();
            Scratch { base, dest }
        }

        fn dest(&self) -> PathBuf {
            self.base.join("dest")
        }

        fn unpack(&self, tgz: &[u8], limits: &Limits) -> Result<Summary> {
            unpack_tar_gz(tgz, &self.dest, LABEL, limits)
        }

        /// Nothing appeared beside `dest`, the canary is as it was, and nothing escaped to
        /// the real `/etc` either.
        fn outside_untouched(&self) {
            assert_eq!(names(&self.base), ["canary", "dest"]);
            assert_eq!(names(&self.base.join("canary")), ["keep"]);
            assert_eq!(
                std::fs::read_to_string(self.base.join("canary/keep")).unwrap(),
                "keep"
            );
            assert!(!Path::new("/etc/evil-nodestrap").exists());
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.base);
        }
    }

    fn names(p: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(p)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
    }

    /// An entry written header-first, so names the Builder refuses (`..`, absolute) get in.
    fn raw(
        b: &mut Builder<Vec<u8>>,
        ty: EntryType,
        name: &str,
        link: &str,
        mode: u32,
        data: &[u8],
    ) {
        let mut h = Header::new_gnu();
        h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        h.as_old_mut().linkname[..link.len()].copy_from_slice(link.as_bytes());
        h.set_entry_type(ty);
        h.set_mode(mode);
        h.set_size(data.len() as u64);
        h.set_mtime(0);
        h.set_cksum();
        b.append(&h, data).unwrap();
    }

    fn file(b: &mut Builder<Vec<u8>>, name: &str, mode: u32, data: &[u8]) {
        raw(b, EntryType::Regular, name, "", mode, data)
    }
    fn dir(b: &mut Builder<Vec<u8>>, name: &str) {
        raw(b, EntryType::Directory, name, "", 0o755, b"")
    }
    fn symlink(b: &mut Builder<Vec<u8>>, name: &str, target: &str) {
        raw(b, EntryType::Symlink, name, target, 0o777, b"")
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn tar(f: impl FnOnce(&mut Builder<Vec<u8>>)) -> Vec<u8> {
        let mut b = Builder::new(Vec::new());
        f(&mut b);
        b.into_inner().unwrap()
    }

    fn tgz(f: impl FnOnce(&mut Builder<Vec<u8>>)) -> Vec<u8> {
        gzip(&tar(f))
    }

    /// The archive is refused with a message naming it, the entry and `reason`, and nothing
    /// outside `dest` changed.
    fn refused(tgz: &[u8], limits: &Limits, entry: &str, reason: &str) -> Scratch {
        let s = Scratch::new();
        let e = s.unpack(tgz, limits).unwrap_err().to_string();
        eprintln!("{e}");
        assert!(e.starts_with(&format!("{LABEL}: ")), "{e}");
        assert!(e.contains(entry), "{e} (wanted entry {entry})");
        assert!(e.contains(reason), "{e} (wanted {reason})");
        s.outside_untouched();
        s
    }

    #[test]
    fn normal_tree_unpacks_with_contents_and_modes() {
        let long = format!("deep/{}/file", "n".repeat(150));
        let big: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
        let tgz = tgz(|b| {
            // Archive-wide pax records come first in `git archive` output.
            let rec = "52 comment=0123456789abcdef0123456789abcdef01234567\n";
            assert_eq!(rec.len(), 52);
            raw(
                b,
                EntryType::XGlobalHeader,
                "pax_global_header",
                "",
                0o666,
                rec.as_bytes(),
            );
            dir(b, "./");
            dir(b, "./bin/");
            file(b, "./bin/run.sh", 0o4775, b"#!/bin/sh\necho hi\n");
            file(b, "etc/conf", 0o666, b"a=1\n");
            file(b, "data/big", 0o600, &big);
            symlink(b, "bin/conf", "../etc/conf");
            raw(b, EntryType::Link, "etc/conf2", "./etc/conf", 0o644, b"");
            // A name longer than 100 bytes: GNU long-name header, read by the tar crate.
            let mut h = Header::new_gnu();
            h.set_mode(0o644);
            h.set_size(4);
            b.append_data(&mut h, &long, &b"long"[..]).unwrap();
            dir(b, "etc/");
        });
        let s = Scratch::new();
        let sum = s.unpack(&tgz, &Limits::default()).unwrap();
        assert_eq!(
            sum,
            Summary {
                files: 4,
                dirs: 5, // bin, etc, data, deep, deep/nnn…
                symlinks: 1,
                hardlinks: 1,
                bytes: 18 + 4 + 200_000 + 4,
            }
        );
        let d = s.dest();
        assert_eq!(
            std::fs::read(d.join("bin/run.sh")).unwrap(),
            b"#!/bin/sh\necho hi\n"
        );
        assert_eq!(std::fs::read(d.join("data/big")).unwrap(), big);
        assert_eq!(std::fs::read(d.join(&long)).unwrap(), b"long");
        assert_eq!(mode(&d.join("bin/run.sh")), 0o755);
        assert_eq!(mode(&d.join("etc/conf")), 0o644);
        assert_eq!(mode(&d.join("data/big")), 0o600);
        assert_eq!(mode(&d.join("bin")), 0o755);
        assert_eq!(mode(&d.join("data")), 0o755);
        assert_eq!(mode(&d), 0o700);
        assert_eq!(
            std::fs::read_link(d.join("bin/conf")).unwrap(),
            Path::new("../etc/conf")
        );
        assert_eq!(std::fs::read(d.join("bin/conf")).unwrap(), b"a=1\n");
        assert_eq!(
            std::fs::metadata(d.join("etc/conf2")).unwrap().ino(),
            std::fs::metadata(d.join("etc/conf")).unwrap().ino()
        );
        assert_eq!(names(&d), ["bin", "data", "deep", "etc"]);
        s.outside_untouched();
    }

    #[test]
    fn names_leaving_the_folder_are_refused() {
        let l = Limits::default();
        for (name, reason) in [
            ("../evil", "`..` in the path"),
            ("/etc/evil-nodestrap", "absolute path"),
            ("a/../../evil", "`..` in the path"),
            ("a/../b", "`..` in the path"),
        ] {
            let s = refused(&tgz(|b| file(b, name, 0o644, b"x")), &l, name, reason);
            assert!(names(&s.dest()).is_empty());
        }
        // Through a symlink that is itself fine.
        let s = refused(
            &tgz(|b| {
                dir(b, "sub/");
                symlink(b, "link", "sub");
                file(b, "link/../../evil", 0o644, b"x");
            }),
            &l,
            "link/../../evil",
            "`..` in the path",
        );
        assert!(names(&s.dest().join("sub")).is_empty());
        refused(&tgz(|b| file(b, "./", 0o644, b"x")), &l, "./", "empty name");
    }

    #[test]
    fn symlinks_leaving_the_folder_are_refused() {
        let l = Limits::default();
        refused(
            &tgz(|b| symlink(b, "x", "../../etc")),
            &l,
            "x",
            "symlink target ../../etc leaves the folder",
        );
        refused(
            &tgz(|b| symlink(b, "x", "/etc")),
            &l,
            "x",
            "symlink to the absolute path /etc",
        );
        refused(
            &tgz(|b| symlink(b, "sub/x", "../..")),
            &l,
            "sub/x",
            "leaves the folder",
        );
        // Each link stays inside on its own, but sub/esc goes through sub/up to dest/..
        refused(
            &tgz(|b| {
                symlink(b, "sub/esc", "up/..");
                symlink(b, "sub/up", "..");
            }),
            &l,
            "sub/esc",
            "resolves outside the folder through other links",
        );
        // Lexically inside after going up and back down: kept.
        let s = Scratch::new();
        let sum = s
            .unpack(
                &tgz(|b| {
                    dir(b, "sub/");
                    symlink(b, "sub/self", "../sub/.");
                    symlink(b, "d", ".");
                    symlink(b, "dangling", "sub/missing");
                }),
                &l,
            )
            .unwrap();
        assert_eq!(sum.symlinks, 3);
        assert_eq!(
            std::fs::read_link(s.dest().join("d")).unwrap(),
            Path::new(".")
        );
    }

    #[test]
    fn nothing_is_written_through_an_archive_symlink() {
        let l = Limits::default();
        // `d -> .` is a fine link, but a file under it would be written through it.
        refused(
            &tgz(|b| {
                symlink(b, "d", ".");
                file(b, "d/f", 0o644, b"x");
            }),
            &l,
            "d/f",
            "d is a symlink: nothing is written through a link",
        );
        let s = refused(
            &tgz(|b| {
                dir(b, "sub/");
                symlink(b, "s", "sub");
                file(b, "s/f", 0o644, b"x");
            }),
            &l,
            "s/f",
            "s is a symlink",
        );
        assert!(names(&s.dest().join("sub")).is_empty());
        // Same for a directory, a symlink and a hard link placed under it, and deeper down.
        for (ty, name, link) in [
            (EntryType::Directory, "s/d/", ""),
            (EntryType::Symlink, "s/l", "f"),
            (EntryType::Link, "s/h", "f"),
            (EntryType::Regular, "s/a/b/c", ""),
        ] {
            let s = refused(
                &tgz(|b| {
                    dir(b, "sub/");
                    file(b, "f", 0o644, b"x");
                    symlink(b, "s", "sub");
                    raw(b, ty, name, link, 0o755, b"");
                }),
                &l,
                name,
                "s is a symlink",
            );
            assert!(names(&s.dest().join("sub")).is_empty());
        }
        // A file can't be a directory either.
        refused(
            &tgz(|b| {
                file(b, "f", 0o644, b"x");
                file(b, "f/g", 0o644, b"x");
            }),
            &l,
            "f/g",
            "f is not a directory",
        );
    }

    #[test]
    fn hard_links_only_to_earlier_files() {
        let l = Limits::default();
        refused(
            &tgz(|b| raw(b, EntryType::Link, "h", "later", 0o644, b"")),
            &l,
            "h",
            "hard link target later is not an earlier regular file",
        );
        refused(
            &tgz(|b| raw(b, EntryType::Link, "h", "../canary/keep", 0o644, b"")),
            &l,
            "h",
            "`..` in the hard link target",
        );
        refused(
            &tgz(|b| raw(b, EntryType::Link, "h", "/etc/passwd", 0o644, b"")),
            &l,
            "h",
            "absolute hard link target",
        );
        refused(
            &tgz(|b| {
                dir(b, "d/");
                raw(b, EntryType::Link, "h", "d", 0o644, b"");
            }),
            &l,
            "h",
            "not an earlier regular file",
        );
    }

    #[test]
    fn devices_and_fifos_are_refused() {
        let l = Limits::default();
        let s = refused(
            &tgz(|b| {
                let mut h = Header::new_gnu();
                h.set_entry_type(EntryType::Char);
                h.set_device_major(1).unwrap();
                h.set_device_minor(3).unwrap();
                h.set_mode(0o666);
                h.set_size(0);
                b.append_data(&mut h, "dev/null", &b""[..]).unwrap();
            }),
            &l,
            "dev/null",
            "character devices are not allowed",
        );
        assert!(names(&s.dest()).is_empty());
        refused(
            &tgz(|b| raw(b, EntryType::Block, "sda", "", 0o660, b"")),
            &l,
            "sda",
            "block devices are not allowed",
        );
        refused(
            &tgz(|b| raw(b, EntryType::Fifo, "p", "", 0o644, b"")),
            &l,
            "p",
            "FIFOs are not allowed",
        );
        refused(
            &tgz(|b| raw(b, EntryType::new(b'X'), "x", "", 0o644, b"")),
            &l,
            "x",
            "unsupported entry type 'X'",
        );
    }

    #[test]
    fn duplicate_names_are_refused() {
        let l = Limits::default();
        let s = refused(
            &tgz(|b| {
                file(b, "a", 0o644, b"first");
                file(b, "./a", 0o755, b"second");
            }),
            &l,
            "./a",
            "duplicate entry",
        );
        assert_eq!(std::fs::read(s.dest().join("a")).unwrap(), b"first");
        assert_eq!(mode(&s.dest().join("a")), 0o644);
        for second in [EntryType::Directory, EntryType::Symlink, EntryType::Link] {
            refused(
                &tgz(|b| {
                    file(b, "a", 0o644, b"first");
                    raw(b, second, "a", "a", 0o755, b"");
                }),
                &l,
                "a",
                "duplicate entry",
            );
        }
        refused(
            &tgz(|b| {
                dir(b, "d/");
                dir(b, "d/");
            }),
            &l,
            "d/",
            "duplicate entry",
        );
        let s = refused(
            &tgz(|b| {
                symlink(b, "l", "x");
                file(b, "l", 0o644, b"over");
            }),
            &l,
            "l",
            "duplicate entry",
        );
        assert_eq!(
            std::fs::read_link(s.dest().join("l")).unwrap(),
            Path::new("x")
        );
        // A directory named after it was implied by a deeper entry is fine.
        let s = Scratch::new();
        s.unpack(
            &tgz(|b| {
                file(b, "d/f", 0o644, b"x");
                dir(b, "d/");
            }),
            &l,
        )
        .unwrap();
    }

    #[test]
    fn corrupt_or_truncated_streams_are_refused() {
        let l = Limits::default();
        let good = tar(|b| {
            file(b, "a", 0o644, &[7u8; 5000]);
            file(b, "b", 0o644, b"bee");
        });
        let gz = gzip(&good);
        Scratch::new().unpack(&gz, &l).unwrap();
        // Cut inside the gzip trailer, inside the deflate data, right after the header.
        for cut in [gz.len() - 4, gz.len() - 8, gz.len() / 2, 10] {
            let s = Scratch::new();
            let e = s.unpack(&gz[..cut], &l).unwrap_err().to_string();
            eprintln!("{e}");
            assert!(e.starts_with("payload.tar.gz: "), "{e}");
            s.outside_untouched();
        }
        // A wrong CRC-32 in the trailer.
        let mut bad = gz.clone();
        let n = bad.len();
        bad[n - 8] ^= 0xff;
        let e = Scratch::new().unpack(&bad, &l).unwrap_err().to_string();
        eprintln!("{e}");
        assert!(e.contains("payload.tar.gz"), "{e}");
        // A well-formed gzip of a tar stream cut after an entry, or inside one.
        let e = Scratch::new()
            .unpack(&gzip(&good[..512 + 5120]), &l)
            .unwrap_err()
            .to_string();
        assert!(e.contains("without its end-of-archive marker"), "{e}");
        let e = Scratch::new()
            .unpack(&gzip(&good[..1000]), &l)
            .unwrap_err()
            .to_string();
        assert!(e.contains("a: truncated: 488 of 5000 bytes"), "{e}");
        let e = Scratch::new()
            .unpack(&gzip(b""), &l)
            .unwrap_err()
            .to_string();
        assert!(e.contains("without its end-of-archive marker"), "{e}");
        // Another archive after the end marker (`tar -A` style) would be ignored by tar.
        let mut two = good.clone();
        two.extend_from_slice(&tar(|b| file(b, "c", 0o644, b"c")));
        let e = Scratch::new()
            .unpack(&gzip(&two), &l)
            .unwrap_err()
            .to_string();
        assert!(e.contains("data after the end of the tar archive"), "{e}");
        // Garbage after the gzip member.
        let mut trailing = gz.clone();
        trailing.extend_from_slice(b"garbage");
        let e = Scratch::new()
            .unpack(&trailing, &l)
            .unwrap_err()
            .to_string();
        eprintln!("{e}");
        // Not gzip at all.
        let e = Scratch::new().unpack(&good, &l).unwrap_err().to_string();
        assert!(
            e.starts_with("payload.tar.gz: reading the first entry: "),
            "{e}"
        );
    }

    #[test]
    fn limits_are_enforced() {
        let small = Limits {
            max_bytes: 150,
            ..Limits::default()
        };
        let s = refused(
            &tgz(|b| {
                file(b, "a", 0o644, &[1; 100]);
                file(b, "b", 0o644, &[2; 100]);
            }),
            &small,
            "b",
            "100 bytes would exceed the limit of 150 unpacked bytes",
        );
        assert_eq!(names(&s.dest()), ["a"]);
        let few = Limits {
            max_entries: 2,
            ..Limits::default()
        };
        refused(
            &tgz(|b| {
                dir(b, "a/");
                dir(b, "b/");
                dir(b, "c/");
            }),
            &few,
            "c/",
            "more than 2 entries",
        );
        let short = Limits {
            max_path: 10,
            ..Limits::default()
        };
        refused(
            &tgz(|b| file(b, "abcdef/ghijk", 0o644, b"")),
            &short,
            "abcdef/ghijk",
            "path longer than 10 bytes",
        );
        refused(
            &tgz(|b| symlink(b, "l", "abcdef/ghijk")),
            &short,
            "l",
            "symlink target longer than 10 bytes",
        );
        let long = tgz(|b| {
            let mut h = Header::new_gnu();
            h.set_mode(0o644);
            h.set_size(0);
            b.append_data(&mut h, format!("d/{}", "n".repeat(256)), &b""[..])
                .unwrap();
        });
        refused(
            &long,
            &Limits::default(),
            "d/nnnn",
            "a name in the path is longer than 255 bytes",
        );
        // A GNU long name the tar crate would read whole into memory.
        let huge = vec![b'a'; 2 << 20];
        let tgz = tgz(|b| {
            raw(b, EntryType::GNULongName, "././@LongLink", "", 0o644, &huge);
            file(b, "x", 0o644, b"x");
        });
        let e = Scratch::new()
            .unpack(&tgz, &Limits::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("reading the first entry: more than 1048576 bytes of headers"),
            "{e}"
        );
    }

    #[test]
    fn destination_must_be_empty() {
        let s = Scratch::new();
        std::fs::write(s.dest().join("old"), "x").unwrap();
        let e = s
            .unpack(&tgz(|b| file(b, "a", 0o644, b"")), &Limits::default())
            .unwrap_err()
            .to_string();
        assert_eq!(e, "payload.tar.gz: destination: not an empty directory");
    }
}
