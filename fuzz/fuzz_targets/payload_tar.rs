//! Reprovision payloads (`.tar.gz`) unpacked into a private folder: whatever the archive holds,
//! nothing outside the folder changes; when it unpacks, the tree is what the summary says.
//!
//! Input that starts with the gzip magic is used as is (framing, trailer, appended data);
//! anything else is a tar stream whose header checksums are fixed up, so mutations reach the
//! entry logic rather than dying at the checksum, and is wrapped in stored-block gzip.
#![no_main]

use std::collections::HashSet;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use nodestrap::inplace::payload::{unpack_tar_gz, Limits, Summary};

/// Small caps: a deflate bomb or a long run of entries is refused in a few milliseconds.
const LIMITS: Limits = Limits {
    max_bytes: 1 << 20,
    max_entries: 256,
    max_path: 4096,
};

fn base() -> &'static Path {
    static BASE: OnceLock<PathBuf> = OnceLock::new();
    BASE.get_or_init(|| {
        let b = std::env::temp_dir().join(format!("nodestrap-fuzz-payload-{}", std::process::id()));
        let _ = fs::remove_dir_all(&b);
        fs::create_dir_all(b.join("canary")).unwrap();
        fs::write(b.join("canary/keep"), "keep").unwrap();
        b
    })
}

/// Header checksums over every 512-byte header the tar reader will look at: a header, then
/// its data (size from the octal field), rounded up to a block.
fn fix_checksums(tar: &mut [u8]) {
    let mut at = 0;
    while at + 512 <= tar.len() {
        let h = &mut tar[at..at + 512];
        if h.iter().all(|b| *b == 0) {
            at += 512;
            continue;
        }
        h[148..156].fill(b' ');
        let sum: u32 = h.iter().map(|b| u32::from(*b)).sum();
        h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
        let size = std::str::from_utf8(&h[124..136])
            .ok()
            .and_then(|s| u64::from_str_radix(s.trim_matches(|c| c == ' ' || c == '\0'), 8).ok())
            .unwrap_or(0);
        at += 512 + (size.min(1 << 30) as usize).div_ceil(512) * 512;
    }
}

fn gzip_stored(data: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::none());
    gz.write_all(data).unwrap();
    gz.finish().unwrap()
}

/// The unpacked tree, counted without following links: (dirs, file names, symlinks, bytes
/// over distinct inodes).
fn walk(dir: &Path, seen: &mut HashSet<u64>, t: &mut Summary) {
    for e in fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let m = fs::symlink_metadata(e.path()).unwrap();
        let mode = m.mode() & 0o7777;
        if m.file_type().is_dir() {
            assert_eq!(mode, 0o755, "{:?}", e.path());
            t.dirs += 1;
            walk(&e.path(), seen, t);
        } else if m.file_type().is_file() {
            assert_eq!(
                mode & !0o755,
                0,
                "{:?}: no setuid, no group/other write",
                e.path()
            );
            t.files += 1;
            if seen.insert(m.ino()) {
                t.bytes += m.len();
            }
        } else if m.file_type().is_symlink() {
            t.symlinks += 1;
        } else {
            panic!("{:?}: neither file, folder nor symlink", e.path());
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let tgz = if data.starts_with(&[0x1f, 0x8b]) {
        data.to_vec()
    } else {
        let mut tar = data.to_vec();
        fix_checksums(&mut tar);
        gzip_stored(&tar)
    };
    let base = base();
    let dest = base.join("dest");
    fs::DirBuilder::new().mode(0o700).create(&dest).unwrap();
    let fd = fs::File::open(&dest).unwrap();
    let r = unpack_tar_gz(&tgz[..], &fd, "payload.tar.gz", &LIMITS);
    drop(fd);
    let mut names: Vec<_> = fs::read_dir(base)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["canary", "dest"],
        "nothing appears beside the folder"
    );
    assert_eq!(fs::read_dir(base.join("canary")).unwrap().count(), 1);
    assert_eq!(fs::read(base.join("canary/keep")).unwrap(), b"keep");
    if let Ok(sum) = r {
        let mut t = Summary::default();
        walk(&dest, &mut HashSet::new(), &mut t);
        assert_eq!(t.dirs, sum.dirs);
        assert_eq!(t.files, sum.files + sum.hardlinks);
        assert_eq!(t.symlinks, sum.symlinks);
        assert_eq!(t.bytes, sum.bytes);
        assert!(sum.bytes <= LIMITS.max_bytes);
    }
    fs::remove_dir_all(&dest).unwrap();
});
