//! The one verified write: a payload's bytes reach their final name only after they hashed to
//! what a trusted source says. coreos-installer's shape (hash while copying, judge at the end)
//! and bootupd's (temp file beside the target, fsync, rename, fsync the folder). Every stager
//! (torcx stores, sysext images, reprovision's payload) and the fetcher's `download` use it;
//! the fetcher reads `Staging` to decide whether another attempt is worth it.

use std::io::{self, Read, Write};

use crate::crypto::digest::{copy_hashing, Algo, CopyError, Digest};
use crate::error::{Error, Result};
use crate::node::root::Dir;
use crate::node::undo::Undo;

/// What the bytes must hash to.
pub enum Expect<'a> {
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
}

/// Why a verified copy failed, which decides what its caller does next.
pub enum Staging {
    /// Reading the source failed (for a download: worth another attempt).
    Read(io::Error),
    /// Creating, writing or persisting the file failed.
    Write(Error),
    /// The content is not what was expected: the computed digest (`sha512-…`), and what was
    /// expected from where (`the signed manifest says sha512-…`).
    Mismatch { got: String, want: String },
}

/// What a verified copy wrote.
pub struct Written {
    pub bytes: u64,
    /// The digest of those bytes, lower-case hex, in the expectation's algorithm.
    pub hex: String,
}

/// Copy `r` into `w` while hashing (on a second thread), then judge the digest against
/// `expect`. `w` has all the bytes either way: a caller writing a final name must not let
/// them become visible before this returns `Ok` (`write_verified` does that).
pub fn copy_verified(
    r: &mut dyn Read,
    w: &mut dyn Write,
    expect: &Expect,
) -> std::result::Result<Written, Staging> {
    let algo = expect.algo();
    let mut hasher = Digest {
        algo,
        hex: String::new(),
    }
    .hasher();
    let bytes = match copy_hashing(&mut &mut *r, &mut hasher, &mut &mut *w) {
        Ok(n) => n,
        Err(CopyError::Read(e)) => return Err(Staging::Read(e)),
        Err(CopyError::Write(e)) => return Err(Staging::Write(e.into())),
    };
    let hex = hasher.finish_hex();
    match expect {
        Expect::Digest(d, from) if d.hex != hex => Err(Staging::Mismatch {
            got: format!("{}-{hex}", d.algo_name()),
            want: format!("{from} says {d}"),
        }),
        _ => Ok(Written { bytes, hex }),
    }
}

/// Stream `r` into a temp file in `dir` (mode `mode`) while hashing; only content that hashes
/// as `expect` says and then passes `check` (the whole file, read back: its format) is fsynced
/// and renamed to `name`, the folder fsynced, recorded in `undo` first when the name is part
/// of the node (whatever held it is set aside, and comes back if the run fails). Otherwise the
/// temp file is removed and `name` is untouched.
pub fn write_verified(
    dir: &Dir,
    name: &str,
    mode: u32,
    expect: &Expect,
    check: &dyn Fn(&std::fs::File) -> Result<()>,
    r: &mut dyn Read,
    undo: Option<&mut Undo>,
) -> std::result::Result<Written, Staging> {
    let mut tmp = dir.create_temp(name, mode).map_err(Staging::Write)?;
    let written = match copy_verified(r, tmp.file(), expect) {
        Err(Staging::Write(e)) => return Err(Staging::Write(e.context(dir.show(name)))),
        other => other?,
    };
    check(&tmp.reopen().map_err(Staging::Write)?).map_err(Staging::Write)?;
    if let Some(undo) = undo {
        undo.creating(dir, name).map_err(Staging::Write)?;
    }
    tmp.persist().map_err(Staging::Write)?;
    Ok(written)
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
