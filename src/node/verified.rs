//! The one verified write: a payload's bytes reach their final name only after they hashed to
//! what a trusted source says. coreos-installer's shape (hash while copying, judge at the end)
//! and bootupd's (temp file beside the target, fsync, rename, fsync the folder). Every stager
//! (torcx stores, sysext images, reprovision's payload) and the fetcher's `download` use it;
//! the fetcher reads `Staging` to decide whether another attempt is worth it.

use std::io::{self, Read, Write};

use crate::crypto::digest::{copy_hashing, Algo, CopyError, Digest, Hasher};
use crate::error::{Error, Result};
use crate::node::dir::{Dir, TempFile};
use crate::node::undo::Undo;

/// What the bytes must hash to.
#[derive(Clone, Copy)]
pub(crate) enum Expect<'a> {
    /// This digest, which `from` says (`the signed manifest`): a mismatch names both.
    Digest(&'a Digest, &'a str),
    /// Nothing known beforehand: the digest in this algorithm is only computed and returned.
    Record(Algo),
}

impl Expect<'_> {
    fn algo(&self) -> Algo {
        match self {
            Expect::Digest(d, _) => d.algo,
            Expect::Record(a) => *a,
        }
    }

    /// `Ok` unless the digest `hex` is not the one expected.
    fn judge(&self, hex: &str) -> std::result::Result<(), Staging> {
        match self {
            Expect::Digest(d, from) if d.hex != hex => Err(Staging::Mismatch {
                got: format!("{}-{hex}", d.algo_name()),
                want: format!("{from} says {d}"),
            }),
            _ => Ok(()),
        }
    }
}

/// Why a verified copy failed, which decides what its caller does next.
pub(crate) enum Staging {
    /// Reading the source failed (for a download: worth another attempt).
    Read(io::Error),
    /// Creating, writing or persisting the file failed.
    Write(Error),
    /// The content is not what was expected: the computed digest (`sha512-…`), and what was
    /// expected from where (`the signed manifest says sha512-…`).
    Mismatch { got: String, want: String },
}

/// What a verified copy wrote.
pub(crate) struct Written {
    pub(crate) bytes: u64,
    /// The digest of those bytes, lower-case hex, in the expectation's algorithm.
    pub(crate) hex: String,
}

/// Where a downloaded body goes, attempt after attempt. A sink that keeps what a broken
/// attempt delivered (`kept`) has the next attempt ask for only the rest (HTTP `Range`).
pub(crate) trait BodySink<T> {
    /// Bytes kept from earlier attempts.
    fn kept(&self) -> u64 {
        0
    }
    /// The next attempt's body starts from byte 0 again: drop what was kept.
    fn restart(&mut self) {}
    /// One attempt's body: all of it, or the rest after `kept` bytes.
    fn take(&mut self, body: &mut dyn Read) -> std::result::Result<T, Staging>;
}

/// A consumer that keeps nothing between attempts: each gets the whole body.
impl<T, F: FnMut(&mut dyn Read) -> std::result::Result<T, Staging>> BodySink<T> for F {
    fn take(&mut self, body: &mut dyn Read) -> std::result::Result<T, Staging> {
        self(body)
    }
}

/// Copy `r` into `w` while hashing (on a second thread), then judge the digest against
/// `expect`. `w` has all the bytes either way: a caller writing a final name must not let
/// them become visible before this returns `Ok` (`write_verified` does that).
pub(crate) fn copy_verified(
    r: &mut dyn Read,
    w: &mut dyn Write,
    expect: &Expect,
) -> std::result::Result<Written, Staging> {
    let mut hasher = expect.algo().hasher();
    let bytes = match copy_hashing(&mut &mut *r, &mut hasher, &mut &mut *w) {
        Ok(n) => n,
        Err(CopyError::Read(e)) => return Err(Staging::Read(e)),
        Err(CopyError::Write(e)) => return Err(Staging::Write(e.into())),
    };
    let hex = hasher.finish_hex();
    expect.judge(&hex)?;
    Ok(Written { bytes, hex })
}

/// Stream `r` into a temp file in `dir` (mode `mode`) while hashing; only content that hashes
/// as `expect` says and then passes `check` (the whole file, read back: its format) is fsynced
/// and renamed to `name`, the folder fsynced, recorded in `undo` first when the name is part
/// of the node (whatever held it is set aside, and comes back if the run fails). Otherwise the
/// temp file is removed and `name` is untouched.
pub(crate) fn write_verified(
    dir: &Dir,
    name: &str,
    mode: u32,
    expect: &Expect,
    check: &dyn Fn(&std::fs::File) -> Result<()>,
    r: &mut dyn Read,
    undo: Option<&mut Undo>,
) -> std::result::Result<Written, Staging> {
    VerifiedWrite::new(dir, name, mode, *expect, check, undo).take(r)
}

/// The check of a file whose digest says all.
pub(crate) fn unchecked(_: &std::fs::File) -> Result<()> {
    Ok(())
}

/// `write_verified` as a download's sink: the temp file and the hash state outlive a broken
/// attempt, so the next one appends the rest. The temp file goes with the sink unless it
/// became `name`.
pub(crate) struct VerifiedWrite<'a, 'u> {
    dir: &'a Dir,
    name: &'a str,
    mode: u32,
    expect: Expect<'a>,
    check: &'a dyn Fn(&std::fs::File) -> Result<()>,
    undo: Option<&'a mut Undo<'u>>,
    /// The temp file, its hash so far, and how many attempts wrote to it.
    part: Option<(TempFile<'a>, Hasher, u32)>,
}

impl<'a, 'u> VerifiedWrite<'a, 'u> {
    pub(crate) fn new(
        dir: &'a Dir,
        name: &'a str,
        mode: u32,
        expect: Expect<'a>,
        check: &'a dyn Fn(&std::fs::File) -> Result<()>,
        undo: Option<&'a mut Undo<'u>>,
    ) -> Self {
        VerifiedWrite {
            dir,
            name,
            mode,
            expect,
            check,
            undo,
            part: None,
        }
    }
}

impl BodySink<Written> for VerifiedWrite<'_, '_> {
    fn kept(&self) -> u64 {
        // The file holds exactly the bytes hashed so far (`copy_hashing` keeps both even when
        // a read fails).
        self.part
            .as_ref()
            .and_then(|(t, _, _)| t.written().ok())
            .unwrap_or(0)
    }

    fn restart(&mut self) {
        self.part = None;
    }

    fn take(&mut self, body: &mut dyn Read) -> std::result::Result<Written, Staging> {
        let (mut tmp, mut hasher, pieces) = match self.part.take() {
            Some((t, h, n)) => (t, h, n + 1),
            None => {
                let t = self
                    .dir
                    .create_temp(self.name, self.mode)
                    .map_err(Staging::Write)?;
                (t, self.expect.algo().hasher(), 1)
            }
        };
        match copy_hashing(&mut &mut *body, &mut hasher, &mut tmp.file()) {
            Ok(_) => {}
            // Kept for the next attempt, which asks for the rest.
            Err(CopyError::Read(e)) => {
                self.part = Some((tmp, hasher, pieces));
                return Err(Staging::Read(e));
            }
            Err(CopyError::Write(e)) => {
                return Err(Staging::Write(
                    Error::from(e).context(self.dir.show(self.name)),
                ))
            }
        }
        let written = Written {
            bytes: tmp.written().map_err(Staging::Write)?,
            hex: hasher.finish_hex(),
        };
        match self.expect.judge(&written.hex) {
            // Pieces of two different files (the server's changed between attempts) hash to
            // neither: the whole body is fetched once more before the mismatch is believed.
            Err(Staging::Mismatch { got, .. }) if pieces > 1 => {
                return Err(Staging::Read(io::Error::other(format!(
                    "the {} bytes put together from {pieces} attempts hash to {got}, not the expected digest; fetching the whole body again",
                    written.bytes
                ))))
            }
            r => r?,
        }
        (self.check)(&tmp.reopen().map_err(Staging::Write)?).map_err(Staging::Write)?;
        if let Some(undo) = self.undo.as_deref_mut() {
            undo.creating(self.dir, self.name).map_err(Staging::Write)?;
        }
        tmp.persist().map_err(Staging::Write)?;
        Ok(written)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::digest::{hex, sha256};
    use crate::node::root::Root;

    fn tmp_root() -> (std::path::PathBuf, Root) {
        let mut rnd = [0u8; 8];
        rustix::rand::getrandom(&mut rnd, rustix::rand::GetRandomFlags::empty()).unwrap();
        let p = std::env::temp_dir().join(format!("nodestrap-verified-{}", hex(&rnd)));
        std::fs::create_dir_all(p.join("store")).unwrap();
        let r = Root::open(&p).unwrap();
        (p, r)
    }

    fn names(p: &std::path::Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(p.join("store"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    fn sha256_of(b: &[u8]) -> Digest {
        Digest {
            algo: Algo::Sha256,
            hex: hex(&sha256(b)),
        }
    }

    #[test]
    fn matching_bytes_get_the_name_and_a_failed_run_takes_them_back() {
        let (p, r) = tmp_root();
        let dir = r.dir("/store").unwrap().unwrap();
        let body = b"image bytes".repeat(10_000);
        let d = sha256_of(&body);
        let mut u = Undo::new(&r);
        let w = write_verified(
            &dir,
            "img",
            0o644,
            &Expect::Digest(&d, "the signed list"),
            &|_| Ok(()),
            &mut &body[..],
            Some(&mut u),
        )
        .unwrap_or_else(|_| panic!("a matching write failed"));
        assert_eq!(
            (w.bytes, w.hex.as_str()),
            (body.len() as u64, d.hex.as_str())
        );
        assert_eq!(std::fs::read(p.join("store/img")).unwrap(), body);
        let _ = u.undo(Error::failed("a later step failed"));
        assert_eq!(names(&p), Vec::<String>::new());
        std::fs::remove_dir_all(&p).unwrap();
    }

    #[test]
    fn a_mismatch_or_a_failed_check_leaves_the_name_as_it_was() {
        let (p, r) = tmp_root();
        std::fs::write(p.join("store/img"), "the old image").unwrap();
        let dir = r.dir("/store").unwrap().unwrap();
        let want = sha256_of(b"what the list says");
        match write_verified(
            &dir,
            "img",
            0o644,
            &Expect::Digest(&want, "the signed list"),
            &|_| Ok(()),
            &mut &b"something else"[..],
            None,
        ) {
            Err(Staging::Mismatch { got, want: says }) => {
                assert_eq!(got, format!("sha256-{}", hex(&sha256(b"something else"))));
                assert_eq!(says, format!("the signed list says {want}"));
            }
            _ => panic!("a mismatch was not refused as one"),
        }
        let body = b"right bytes, wrong format";
        let d = sha256_of(body);
        let refused = write_verified(
            &dir,
            "img",
            0o644,
            &Expect::Digest(&d, "the signed list"),
            &|_| Err(Error::failed("not an image")),
            &mut &body[..],
            None,
        );
        assert!(
            matches!(refused, Err(Staging::Write(e)) if e.to_string().contains("not an image"))
        );
        assert_eq!(names(&p), vec!["img".to_string()]);
        assert_eq!(
            std::fs::read(p.join("store/img")).unwrap(),
            b"the old image"
        );
        std::fs::remove_dir_all(&p).unwrap();
    }

    #[test]
    fn without_an_expectation_the_digest_is_only_recorded() {
        let mut out = Vec::new();
        let w = copy_verified(
            &mut &b"payload"[..],
            &mut out,
            &Expect::Record(Algo::Sha256),
        )
        .unwrap_or_else(|_| panic!("recording failed"));
        assert_eq!((w.bytes, w.hex), (7, hex(&sha256(b"payload"))));
        assert_eq!(out, b"payload");
    }
}
