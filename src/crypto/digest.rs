//! Digests: `sha512-<hex>` (torcx, Ignition) and `sha256:<hex>` notations, computed while a
//! payload streams (coreos-installer's verify-while-reading shape). The one place that names
//! the SHA-2 implementation nodestrap's own code uses: ring's, chosen by measurement
//! (docs/build.md, "One SHA-2"): as fast as the sha2 crate at opt-level 3 for SHA-512 and 4x
//! faster than it at the binary's opt-level "z" for SHA-256, since its assembly does not depend
//! on the optimisation level; and already in the binary for TLS. (sequoia-openpgp brings the
//! sha2 crate along for its own signatures.)

use std::io::{self, Read, Write};
use std::sync::mpsc;

use ring::digest;

/// A digest in Ignition/torcx notation: `sha512-<hex>` (also `sha256-`, `sha384-`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Digest {
    pub(crate) algo: Algo,
    /// Lowercase hex.
    pub hex: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Algo {
    Sha256,
    Sha384,
    Sha512,
}

impl Digest {
    pub(crate) fn parse(s: &str) -> Option<Digest> {
        let (a, hex) = s.split_once('-')?;
        let (algo, len) = match a {
            "sha256" => (Algo::Sha256, 64),
            "sha384" => (Algo::Sha384, 96),
            "sha512" => (Algo::Sha512, 128),
            _ => return None,
        };
        if hex.len() != len || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        // torcx formatted lowercase and so never matched an uppercase manifest; we normalise.
        Some(Digest {
            algo,
            hex: hex.to_ascii_lowercase(),
        })
    }

    pub(crate) fn hasher(&self) -> Hasher {
        self.algo.hasher()
    }

    /// Hash a whole reader.
    pub(crate) fn matches(&self, mut r: impl Read) -> io::Result<bool> {
        let mut h = self.hasher();
        match copy_hashing(&mut r, &mut h, &mut io::sink()) {
            Ok(_) => Ok(h.finish_hex() == self.hex),
            Err(CopyError::Read(e) | CopyError::Write(e)) => Err(e),
        }
    }
}

impl Digest {
    pub(crate) fn algo_name(&self) -> &'static str {
        match self.algo {
            Algo::Sha256 => "sha256",
            Algo::Sha384 => "sha384",
            Algo::Sha512 => "sha512",
        }
    }
}

impl std::fmt::Display for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.algo_name(), self.hex)
    }
}

impl Algo {
    pub(crate) fn hasher(self) -> Hasher {
        Hasher(digest::Context::new(match self {
            Algo::Sha256 => &digest::SHA256,
            Algo::Sha384 => &digest::SHA384,
            Algo::Sha512 => &digest::SHA512,
        }))
    }
}

pub(crate) struct Hasher(digest::Context);

impl Hasher {
    pub(crate) fn update(&mut self, b: &[u8]) {
        self.0.update(b)
    }
    pub(crate) fn finish_hex(self) -> String {
        hex(self.0.finish().as_ref())
    }
}

pub(crate) enum CopyError {
    Read(io::Error),
    Write(io::Error),
}

/// Bytes read, written and hashed at a time. TLS hands out 16 KiB records; SHA-2 and
/// write(2) both run far faster on large chunks (SHA-512 here: 1.6 s per 512 MiB in 256 KiB
/// updates, 2.3 s in 8 KiB ones).
const CHUNK: usize = 256 << 10;
/// Chunks in flight: one being read, one being hashed, one spare. Memory stays flat in the
/// payload size (768 KiB).
const CHUNKS: usize = 3;

/// Copy `r` into `w`, hashing every byte. Hashing runs on a second thread, one chunk behind
/// reading and writing: SHA-512 costs as much as decrypting, copying and writing together, so
/// a download is hashed at the speed of one of the two rather than their sum (bench/fetch).
/// A thread that cannot be started is a read error (a download is tried again).
pub(crate) fn copy_hashing(
    r: &mut impl Read,
    h: &mut Hasher,
    w: &mut impl Write,
) -> std::result::Result<u64, CopyError> {
    std::thread::scope(|scope| {
        let (to_hash, hash_queue) = mpsc::sync_channel::<Vec<u8>>(CHUNKS);
        let (give_back, returned) = mpsc::sync_channel::<Vec<u8>>(CHUNKS);
        let hashing = std::thread::Builder::new()
            .name("hash".into())
            .spawn_scoped(scope, move || {
                for chunk in hash_queue {
                    h.update(&chunk);
                    if give_back.send(chunk).is_err() {
                        break;
                    }
                }
            });
        let hashing = hashing.map_err(|e| {
            CopyError::Read(io::Error::new(
                e.kind(),
                format!("starting the hashing thread: {e}"),
            ))
        })?;
        let mut spare: Vec<Vec<u8>> = (0..CHUNKS).map(|_| Vec::new()).collect();
        let mut total = 0u64;
        loop {
            let mut chunk = match spare.pop() {
                Some(c) => c,
                // The hasher gives every chunk back unless it is gone, which it is not
                // while `to_hash` lives.
                None => returned.recv().unwrap_or_default(),
            };
            // What came before a read error is written and hashed too: a resumed download
            // goes on from exactly the bytes the file and the hash have.
            let (filled, failed) = fill(r, &mut chunk);
            if filled > 0 {
                w.write_all(&chunk).map_err(CopyError::Write)?;
                total += filled as u64;
                if to_hash.send(chunk).is_err() {
                    break;
                }
            }
            if let Some(e) = failed {
                drop(to_hash);
                let _ = hashing.join();
                return Err(CopyError::Read(e));
            }
            if filled == 0 {
                break;
            }
        }
        drop(to_hash);
        let _ = hashing.join();
        Ok(total)
    })
}

/// Read into `chunk` until it holds `CHUNK` bytes, `r` ends or a read fails; `chunk` is cut
/// to what was read, and that length returned with the failure, if any.
fn fill(r: &mut impl Read, chunk: &mut Vec<u8>) -> (usize, Option<io::Error>) {
    chunk.resize(CHUNK, 0);
    let mut filled = 0;
    let mut failed = None;
    while filled < CHUNK {
        match r.read(&mut chunk[filled..]) {
            Ok(0) => break,
            Ok(k) => filled += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    chunk.truncate(filled);
    (filled, failed)
}

/// Lowercase hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// SHA-256 of a whole buffer.
pub(crate) fn sha256(b: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    out.copy_from_slice(digest::digest(&digest::SHA256, b).as_ref());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_parsing() {
        // sha512("test\n"), the value torcx's own tests use.
        let d = Digest::parse("sha512-0e3e75234abc68f4378a86b3f4b32a198ba301845b0cd6e50106e874345700cc6663a86c1ea125dc5e92be17c98f9a0f85ca9d5f595db2012f7cc3571945c123").unwrap();
        assert!(d.matches(&b"test\n"[..]).unwrap());
        assert!(!d.matches(&b"test"[..]).unwrap());
        assert!(Digest::parse("sha512-abc").is_none());
        assert!(Digest::parse("md5-d41d8cd98f00b204e9800998ecf8427e").is_none());
        assert!(Digest::parse(&format!("sha256-{}", "g".repeat(64))).is_none());
        let up = Digest::parse(&format!("sha256-{}", "AB".repeat(32))).unwrap();
        assert_eq!(up.hex, "ab".repeat(32));
    }

    #[test]
    fn copy_hashing_hashes_and_writes_every_byte_in_order() {
        let data: Vec<u8> = (0..3 * CHUNK + 5)
            .map(|i| (i * 7 + i / 251) as u8)
            .collect();
        for len in [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 5] {
            let src = &data[..len];
            let want = hex(ring::digest::digest(&digest::SHA512, src).as_ref());
            // A reader that hands out odd-sized pieces, as TLS does.
            struct Pieces<'a>(&'a [u8], usize);
            impl Read for Pieces<'_> {
                fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
                    self.1 = self.1 % 5 + 1;
                    let n = b.len().min(self.0.len()).min(self.1 * 4099);
                    b[..n].copy_from_slice(&self.0[..n]);
                    self.0 = &self.0[n..];
                    Ok(n)
                }
            }
            let mut h = Digest::parse(&format!("sha512-{want}")).unwrap().hasher();
            let mut out = Vec::new();
            let n = match copy_hashing(&mut Pieces(src, 0), &mut h, &mut out) {
                Ok(n) => n,
                Err(_) => panic!("copy of {len} bytes failed"),
            };
            assert_eq!((n, out.as_slice()), (len as u64, src), "{len}");
            assert_eq!(h.finish_hex(), want, "{len}");
        }
        // A failing reader or writer is told apart.
        struct Broken;
        impl Read for Broken {
            fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
                Err(io::Error::other("reset"))
            }
        }
        let mut h = Digest::parse(&format!("sha256-{}", "0".repeat(64)))
            .unwrap()
            .hasher();
        assert!(matches!(
            copy_hashing(&mut Broken, &mut h, &mut io::sink()),
            Err(CopyError::Read(_))
        ));
        // What a reader gave before failing is written and hashed: a resumed copy goes on
        // from there and ends with the whole payload's digest.
        let data = &data[..CHUNK + 777];
        let cut = CHUNK + 100;
        let mut h = Digest::parse(&format!("sha512-{}", "0".repeat(128)))
            .unwrap()
            .hasher();
        let mut out = Vec::new();
        let failing = &mut Read::chain(&data[..cut], Broken);
        assert!(matches!(
            copy_hashing(failing, &mut h, &mut out),
            Err(CopyError::Read(_))
        ));
        assert_eq!(out.len(), cut);
        assert!(matches!(
            copy_hashing(&mut &data[cut..], &mut h, &mut out),
            Ok(677)
        ));
        assert_eq!(out, data);
        let whole = hex(ring::digest::digest(&digest::SHA512, data).as_ref());
        assert_eq!(h.finish_hex(), whole);
        let mut h = Algo::Sha256.hasher();
        let mut full = [0u8; 10];
        assert!(matches!(
            copy_hashing(&mut &data[..100], &mut h, &mut &mut full[..]),
            Err(CopyError::Write(_))
        ));
    }
}
