//! A run's changes to the node, each recorded *before* it is made, so that a failure puts the
//! node back as it was (docs/bootstrap.md, "A failure keeps the node as it was"). A step that
//! fails half-way (renamed into place, then its fsync failed) is undone like a finished one.
//! A file set aside is recorded once its second name exists (whatever failed after that), so a
//! copy recorded but gone is named in the error, never passed over.
//!
//! Undone in reverse order: files and links get their earlier content back or go again,
//! directories this run made go when empty, files set aside come back; then the actions
//! registered with `then_on_undo` (a daemon-reload, a `systemd-sysext refresh`) run, once
//! everything is back. `commit` ends a run that succeeded: the files set aside are deleted, the
//! only change that cannot be taken back, so it comes after the done marker.

use std::os::fd::OwnedFd;

use rustix::fs::FileType;

use crate::error::{Context, Error, Result};
use crate::node::dir::{temp_name, Dir, DirLock};
use crate::node::root::{split_node_path, Root, CONFIG_CAP};

/// What a path held before this run changed it.
#[derive(Debug, Clone, PartialEq)]
enum Prior {
    Absent,
    /// A regular file small enough to keep in memory (configuration, never an image).
    File {
        data: Vec<u8>,
        mode: u32,
    },
    Link(String),
}

enum Step {
    Path {
        path: String,
        prior: Prior,
        /// Said in the error when this path is put back (why it matters).
        note: Option<&'static str>,
    },
    /// A directory this run created.
    Dir(String),
    /// A file renamed out of the way to `aside` in its directory (locked meanwhile, so that no
    /// other run's sweep takes it).
    Aside {
        path: String,
        aside: String,
        _held: OwnedFd,
    },
}

type Action<'r> = Box<dyn FnOnce() -> Result<()> + 'r>;

pub(crate) struct Undo<'r> {
    root: &'r Root,
    steps: Vec<Step>,
    then: Vec<(&'static str, Action<'r>)>,
    /// Held until the run is put back or committed: no other run changes these directories
    /// (or sweeps their temp names) meanwhile.
    locks: Vec<DirLock>,
}

impl<'r> Undo<'r> {
    pub(crate) fn new(root: &'r Root) -> Undo<'r> {
        Undo {
            root,
            steps: Vec::new(),
            then: Vec::new(),
            locks: Vec::new(),
        }
    }

    /// Keep `lock` until the run is put back or committed.
    pub(crate) fn keep_locked(&mut self, lock: DirLock) {
        self.locks.push(lock);
    }

    /// Create `dir` and its missing parents, each recorded; the directory.
    pub(crate) fn make_dir(&mut self, dir: &str) -> Result<Dir> {
        let mut prefix = String::new();
        for comp in dir.split('/').filter(|c| !c.is_empty() && *c != ".") {
            prefix.push('/');
            prefix.push_str(comp);
            if !self.root.exists(&prefix) {
                self.steps.push(Step::Dir(prefix.clone()));
            }
        }
        self.root.make_dir(dir)
    }

    /// Replace `path` with `data`, atomically.
    pub(crate) fn write(&mut self, path: &str, data: &[u8], mode: u32) -> Result<()> {
        self.write_noted(path, data, mode, None)
    }

    /// `write`, with a note the error carries when the write is taken back.
    pub(crate) fn write_noted(
        &mut self,
        path: &str,
        data: &[u8],
        mode: u32,
        note: Option<&'static str>,
    ) -> Result<()> {
        let (dir, _) = split(path)?;
        let _ = self.make_dir(dir)?;
        let prior = self.prior(path)?;
        self.steps.push(Step::Path {
            path: path.to_string(),
            prior,
            note,
        });
        self.root.write_atomic(path, data, mode)
    }

    /// Point the symlink `path` at `target` in one step; `false` when it already does.
    pub(crate) fn link(&mut self, path: &str, target: &str) -> Result<bool> {
        let (dir, name) = split(path)?;
        let d = self.make_dir(dir)?;
        // What a run killed while switching this link left, even when it needs no switch now.
        d.sweep_temp_links(name);
        let prior = self.prior(path)?;
        if prior == Prior::Link(target.to_string()) {
            return Ok(false);
        }
        self.steps.push(Step::Path {
            path: path.to_string(),
            prior,
            note: None,
        });
        d.replace_symlink(target, name)?;
        Ok(true)
    }

    /// Remove the small file or link `path`.
    pub(crate) fn remove(&mut self, path: &str) -> Result<()> {
        let prior = self.prior(path)?;
        if prior == Prior::Absent {
            return Ok(());
        }
        self.steps.push(Step::Path {
            path: path.to_string(),
            prior,
            note: None,
        });
        self.root.remove(path)
    }

    /// `name` in `d` is about to be created by the caller (a verified image renamed into place,
    /// never written in place): taken away again on undo. A regular file there now is kept
    /// under a second, hidden name until the run ends (a hard link: the caller's rename
    /// replaces it in one step, so the name never goes missing, even if the run is killed) and
    /// comes back on undo.
    pub(crate) fn creating(&mut self, d: &Dir, name: &str) -> Result<()> {
        let path = d.node_path(name);
        match d.kind_of(name) {
            None => {}
            Some(FileType::RegularFile) => {
                let aside = temp_name(name);
                // Locked before its second name exists (the lock is the inode's): no other
                // run's sweep can take it in between.
                let held = d.hold(name)?;
                // Recorded once the second name exists, even when the directory's fsync
                // after the link failed.
                let linked = d.hard_link(name, &aside);
                if d.kind_of(&aside).is_some() {
                    self.steps.push(Step::Aside {
                        aside: d.node_path(&aside),
                        path,
                        _held: held,
                    });
                }
                linked?;
                // Undone by renaming the old file back over whatever the caller put there.
                return Ok(());
            }
            Some(_) => {
                return Err(Error::failed(format!(
                    "{}: not a regular file; not replaced",
                    d.show(name)
                )))
            }
        }
        self.steps.push(Step::Path {
            path,
            prior: Prior::Absent,
            note: None,
        });
        Ok(())
    }

    /// Rename the regular file `path` out of the way (a hidden temp name in its directory,
    /// which nothing reads); deleted by `commit`, renamed back by undo.
    pub(crate) fn set_aside(&mut self, path: &str) -> Result<()> {
        let (dir, name) = split(path)?;
        let d = self
            .root
            .dir(dir)?
            .ok_or_else(|| Error::failed(format!("{}: does not exist", self.root.show(dir))))?;
        if d.kind_of(name) != Some(FileType::RegularFile) {
            return Err(Error::failed(format!(
                "{}: not a regular file, not set aside",
                d.show(name)
            )));
        }
        let aside = temp_name(name);
        // Locked before the rename (the lock is the inode's): a concurrent run's sweep leaves
        // it alone under its temp name.
        let held = d.hold(name)?;
        // Recorded once renamed, even when the directory's fsync after it failed.
        let renamed = d.rename(name, &aside);
        if d.kind_of(&aside).is_some() {
            self.steps.push(Step::Aside {
                path: path.to_string(),
                aside: d.node_path(&aside),
                _held: held,
            });
        }
        renamed
    }

    /// Run `action` after everything else is put back (in the order registered).
    pub(crate) fn then_on_undo(
        &mut self,
        what: &'static str,
        action: impl FnOnce() -> Result<()> + 'r,
    ) {
        self.then.push((what, Box::new(action)));
    }

    /// Put the node back; the error says what was put back and what could not be.
    pub(crate) fn undo(self, e: Error) -> Error {
        let mut played = Playback {
            root: self.root,
            back: Vec::new(),
            not: Vec::new(),
        };
        // 1. Every step, the last one first.
        for step in self.steps.into_iter().rev() {
            played.step(step);
        }
        // 2. The actions registered, once everything is back.
        for (what, action) in self.then {
            played.action(what, action);
        }
        // 3. What was put back, in the log and in the error.
        played.end(e)
    }

    /// The run succeeded: delete the files set aside. Nothing reads them, so a deletion that
    /// fails is logged, and the file is swept by a later run.
    pub(crate) fn commit(self) {
        for step in self.steps {
            if let Step::Aside { aside, _held, .. } = step {
                drop(_held);
                if let Err(e) = self.root.remove(&aside) {
                    crate::warn!("{e} (set aside by this run; a later run removes it)");
                }
            }
        }
    }

    fn prior(&self, path: &str) -> Result<Prior> {
        let (dir, name) = split(path)?;
        let Some(d) = self.root.dir(dir)? else {
            return Ok(Prior::Absent);
        };
        Ok(match d.kind_of(name) {
            None => Prior::Absent,
            Some(FileType::Symlink) => {
                Prior::Link(d.link_target(name).ok_or_else(|| {
                    Error::failed(format!("{}: cannot read the link", d.show(name)))
                })?)
            }
            Some(FileType::RegularFile) => {
                let f = d.open(name)?;
                let data = crate::node::root::read_capped(f, CONFIG_CAP).with_ctx(|| {
                    format!(
                        "{} (read to keep a copy, to put it back on failure)",
                        d.show(name)
                    )
                })?;
                Prior::File {
                    data,
                    mode: d.mode_of(name)?,
                }
            }
            Some(_) => {
                return Err(Error::failed(format!(
                    "{}: not a file or a link; not replaced",
                    d.show(name)
                )))
            }
        })
    }
}

/// The undo log played back: what was put back so far, and what could not be.
struct Playback<'r> {
    root: &'r Root,
    back: Vec<String>,
    /// Each said in the error, in the order they failed.
    not: Vec<String>,
}

impl Playback<'_> {
    /// One step undone; a failure is logged and kept for the error. A file set aside stays
    /// locked until its step is done (`_held` goes with `step`).
    fn step(&mut self, step: Step) {
        let (what, r) = match step {
            Step::Path { path, prior, note } => self.path(&path, &prior, note),
            Step::Dir(d) => return self.dir(&d),
            Step::Aside { path, aside, .. } => {
                let r = self.aside(&path, &aside);
                (format!("put back {}", self.root.show(&path)), r)
            }
        };
        match r {
            Ok(()) => self.back.push(what),
            Err(r) => {
                crate::error!("{what}: FAILED: {r}");
                self.not.push(format!("could NOT undo ({what}: {r})"));
            }
        }
    }

    /// `path` as it was before; what that was, for the log.
    fn path(&self, path: &str, prior: &Prior, note: Option<&str>) -> (String, Result<()>) {
        let shown = self.root.show(path);
        let r = restore(self.root, path, prior);
        let what = match prior {
            Prior::Absent => format!("removed {shown} again"),
            Prior::File { .. } => format!("restored {shown}"),
            Prior::Link(t) => format!("restored {shown} to {t}"),
        };
        let what = match note {
            Some(n) => format!("{what} {n}"),
            None => what,
        };
        (what, r)
    }

    /// A directory this run made, removed if empty.
    fn dir(&mut self, d: &str) {
        let r = match split(d) {
            Ok((parent, name)) => match self.root.dir(parent) {
                Ok(Some(p)) => p.remove_empty_dir(name),
                Ok(None) => Ok(()),
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        // Directories are not worth a line each unless they stay.
        if let Err(r) = r {
            crate::error!("{r}");
            self.not
                .push(format!("could NOT remove {}: {r}", self.root.show(d)));
        }
    }

    /// The file set aside as `aside` renamed back to `path`.
    fn aside(&self, path: &str, aside: &str) -> Result<()> {
        let (dir, name) = split(path)?;
        let (_, a) = split(aside)?;
        match self.root.dir(dir)? {
            Some(d) if d.kind_of(a).is_some() => {
                d.rename(a, name)?;
                // Two names of one file: rename leaves both (POSIX).
                if d.kind_of(a).is_some() {
                    d.remove(a)?;
                }
                Ok(())
            }
            // Recorded only once it existed, and locked since: something outside nodestrap
            // took it.
            _ => Err(Error::failed(format!(
                "{}: the copy set aside is gone",
                self.root.show(aside)
            ))),
        }
    }

    /// An action registered with `then_on_undo`.
    fn action(&mut self, what: &'static str, action: Action<'_>) {
        match action() {
            Ok(()) => self.back.push(what.to_string()),
            Err(r) => {
                crate::error!("{what} after putting the node back: {r}");
                self.not
                    .push(format!("{what} after putting the node back failed: {r}"));
            }
        }
    }

    /// `e` with what could not be put back, then what was (also logged).
    fn end(self, e: Error) -> Error {
        let e = self.not.into_iter().fold(e, Error::context);
        for b in &self.back {
            crate::warn!("{b}");
        }
        if self.back.is_empty() {
            e
        } else {
            e.context(format!("the node is as it was ({})", self.back.join("; ")))
        }
    }
}

fn restore(root: &Root, path: &str, prior: &Prior) -> Result<()> {
    match prior {
        Prior::Absent => root.remove(path),
        Prior::File { data, mode } => root.write_atomic(path, data, *mode),
        Prior::Link(t) => {
            let (d, name) = root.parent_of(path)?;
            d.replace_symlink(t, &name)
        }
    }
}

fn split(path: &str) -> Result<(&str, &str)> {
    split_node_path(path).ok_or_else(|| Error::failed(format!("{path}: not a file path")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp_root() -> (std::path::PathBuf, Root) {
        let mut rnd = [0u8; 8];
        rustix::rand::getrandom(&mut rnd, rustix::rand::GetRandomFlags::empty()).unwrap();
        let p = std::env::temp_dir().join(format!(
            "nodestrap-undo-{}",
            crate::crypto::digest::hex(&rnd)
        ));
        std::fs::create_dir_all(&p).unwrap();
        let r = Root::open(&p).unwrap();
        (p, r)
    }

    fn listing(p: &std::path::Path) -> Vec<String> {
        let mut out = Vec::new();
        fn walk(base: &std::path::Path, d: &std::path::Path, out: &mut Vec<String>) {
            for e in std::fs::read_dir(d).unwrap().flatten() {
                let p = e.path();
                let rel = p.strip_prefix(base).unwrap().display().to_string();
                let m = std::fs::symlink_metadata(&p).unwrap();
                if m.file_type().is_symlink() {
                    out.push(format!(
                        "{rel} -> {}",
                        std::fs::read_link(&p).unwrap().display()
                    ));
                } else if m.is_dir() {
                    out.push(format!("{rel}/"));
                    walk(base, &p, out);
                } else {
                    out.push(format!("{rel} = {}", std::fs::read_to_string(&p).unwrap()));
                }
            }
        }
        walk(p, p, &mut out);
        out.sort();
        out
    }

    #[test]
    fn every_kind_of_change_is_put_back() {
        let (p, r) = tmp_root();
        std::fs::create_dir_all(p.join("etc/ext")).unwrap();
        std::fs::write(p.join("etc/conf"), "old").unwrap();
        std::fs::write(p.join("etc/gone"), "keep me").unwrap();
        std::fs::write(p.join("etc/ext/img"), "old image").unwrap();
        std::os::unix::fs::symlink("/opt/a", p.join("etc/ext/k.raw")).unwrap();
        let before = listing(&p);
        let mut u = Undo::new(&r);
        u.write("/etc/conf", b"new", 0o600).unwrap();
        u.write("/etc/new.d/sub/file", b"x", 0o644).unwrap();
        assert!(u.link("/etc/ext/k.raw", "/opt/b").unwrap());
        assert!(!u.link("/etc/ext/k.raw", "/opt/b").unwrap());
        u.link("/etc/ext/c.raw", "/opt/c").unwrap();
        u.remove("/etc/gone").unwrap();
        let ext = r.dir("/etc/ext").unwrap().unwrap();
        u.creating(&ext, "img").unwrap();
        // As every caller does: a new file renamed over the old name.
        std::fs::write(p.join("etc/ext/.img.new"), "new image").unwrap();
        std::fs::rename(p.join("etc/ext/.img.new"), p.join("etc/ext/img")).unwrap();
        let ran = std::cell::Cell::new(false);
        u.then_on_undo("reloaded", || {
            ran.set(true);
            Ok(())
        });
        assert_ne!(listing(&p), before);
        let e = u.undo(Error::failed("boom"));
        assert!(ran.get());
        assert_eq!(listing(&p), before);
        let m = e.to_string();
        assert!(m.ends_with("boom"), "{m}");
        assert!(
            m.contains("restored") && m.contains("/etc/ext/k.raw to /opt/a"),
            "{m}"
        );
        assert!(m.contains("reloaded"), "{m}");
        std::fs::remove_dir_all(&p).unwrap();
    }

    #[test]
    fn commit_deletes_only_what_was_set_aside() {
        let (p, r) = tmp_root();
        std::fs::create_dir_all(p.join("s")).unwrap();
        std::fs::write(p.join("s/old"), "old").unwrap();
        std::fs::write(p.join("s/keep"), "keep").unwrap();
        let mut u = Undo::new(&r);
        u.set_aside("/s/old").unwrap();
        u.write("/s/new", b"new", 0o644).unwrap();
        // A concurrent sweep leaves the held file alone.
        r.dir("/s").unwrap().unwrap().sweep_leftovers(false);
        assert_eq!(std::fs::read_dir(p.join("s")).unwrap().count(), 3);
        u.commit();
        assert_eq!(listing(&p), vec!["s/", "s/keep = keep", "s/new = new"]);
        std::fs::remove_dir_all(&p).unwrap();
    }
}
