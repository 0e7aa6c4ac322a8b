//! A signed sysext DDI (Discoverable Disk Image, `systemd-repart --make-ddi=sysext`), judged as
//! systemd-sysext will judge it under `root=signed+absent:usr=signed+absent`, before it may be
//! linked: the GPT holds, for the node's architecture, a root or a /usr file system with its
//! dm-verity hash partition and its signature partition, and nothing else; the signature
//! partition's PKCS#7 over the root hash verifies against a trusted certificate (systemd's
//! userspace check: docs/bootstrap.md, "Signed images"); the partitions are the ones that root
//! hash names (systemd-repart derives their UUIDs from it); and the hash tree computed from the
//! data is the one stored, with that root hash: what dm-verity will check block by block.

use std::fs::File;

use serde::Deserialize;

use crate::crypto::pkcs7::{self, Cert};

/// GPT partition entries looked at: the standard table has 128.
const MAX_ENTRIES: u32 = 128;
/// The signature partition's JSON: systemd-repart writes about 2 KiB.
const MAX_SIG_JSON: u64 = 64 << 10;

/// One partition: where it is in the file, in bytes, and its unique GUID in string order.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Part {
    pub offset: u64,
    pub len: u64,
    pub(crate) uuid: [u8; 16],
}

/// Which file system the DDI carries.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Designator {
    Root,
    Usr,
}

/// A DDI's layout for the node's architecture.
#[derive(Debug)]
pub struct Ddi {
    pub(crate) designator: Designator,
    pub data: Part,
    pub verity: Part,
    pub sig: Part,
}

/// A DDI proven: the certificate that signed its root hash, and the root hash.
#[derive(Debug)]
pub struct Proven {
    pub(crate) signer: usize,
    pub(crate) root_hash: String,
}

#[derive(Deserialize)]
struct SigJson {
    #[serde(rename = "rootHash")]
    root_hash: String,
    signature: String,
}

/// Whether `head` (the file's first 4 KiB and more) starts a GPT disk image rather than a bare
/// file system, and its sector size.
pub fn gpt_sector(head: &[u8]) -> Option<u64> {
    [512u64, 4096]
        .into_iter()
        .find(|s| head.get(*s as usize..*s as usize + 8) == Some(b"EFI PART"))
}

/// The partition type GUIDs (string form) of `arch` (systemd's names: `x86-64`, `arm64`):
/// root, root-verity, root-verity-sig, usr, usr-verity, usr-verity-sig.
fn types(arch: &str) -> Option<[&'static str; 6]> {
    match arch {
        "x86-64" => Some([
            "4f68bce3-e8cd-4db1-96e7-fbcaf984b709",
            "2c7357ed-ebd2-46d9-aec1-23d437ec2bf5",
            "41092b05-9fc8-4523-994f-2def0408b176",
            "8484680c-9521-48c6-9c11-b0720656f69e",
            "77ff5f63-e7b6-4633-acf4-1565b864c0e6",
            "e7bb33fb-06cf-4e81-8273-e543b413e2e2",
        ]),
        "arm64" => Some([
            "b921b045-1df0-41c3-af44-4c6f280d3fae",
            "df3300ce-d69f-4c92-978c-9bfb0f38d820",
            "6db69de6-29f4-4758-a7a5-962190f00ce3",
            "b0e01050-ee5f-4390-949a-9101b17104e9",
            "6e11a4e7-fbca-4ded-b9e9-e1a512bb664e",
            "c23ce4ff-44bd-4b00-b2d4-b41b3419e02a",
        ]),
        _ => None,
    }
}

const ROLES: [&str; 6] = [
    "root",
    "root-verity",
    "root-verity-sig",
    "usr",
    "usr-verity",
    "usr-verity-sig",
];

/// A GPT GUID as stored (first three fields little-endian) in string order.
fn guid(b: &[u8]) -> [u8; 16] {
    let mut g = [0u8; 16];
    g.copy_from_slice(&b[..16]);
    g[..4].reverse();
    g[4..6].reverse();
    g[6..8].reverse();
    g
}

fn guid_str(g: &[u8; 16]) -> String {
    let h = crate::crypto::digest::hex(g);
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

fn pread(file: &File, buf: &mut [u8], at: u64) -> Result<(), String> {
    let mut n = 0;
    while n < buf.len() {
        match rustix::io::pread(file, &mut buf[n..], at + n as u64) {
            Ok(0) => return Err(format!("ends at {} bytes", at + n as u64)),
            Ok(k) => n += k,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok(())
}

/// The layout systemd-sysext's strict policy accepts for `arch`: one of root or /usr, with its
/// verity and signature partitions, and no other partition (another architecture's root, an
/// unsigned one, anything systemd might pick or refuse). `size` is the file's.
pub fn read(file: &File, sector: u64, size: u64, arch: &str) -> Result<Ddi, String> {
    let types =
        types(arch).ok_or_else(|| format!("no DDI partition types for architecture {arch}"))?;
    let (table, esize) = entries(file, sector)?;
    let found = partitions(&table, esize, sector, size, &types, arch)?;
    let pick = |base: usize, d: Designator| -> Result<Option<Ddi>, String> {
        match (found[base], found[base + 1], found[base + 2]) {
            (None, None, None) => Ok(None),
            (Some(data), Some(verity), Some(sig)) => Ok(Some(Ddi {
                designator: d,
                data,
                verity,
                sig,
            })),
            (data, verity, sig) => Err(format!(
                "its {} partition is not signed: {} present, {} present, {} present; the policy `{}=signed+absent` refuses it",
                ROLES[base],
                if data.is_some() { ROLES[base] } else { "no data" },
                if verity.is_some() { ROLES[base + 1] } else { "no verity" },
                if sig.is_some() { ROLES[base + 2] } else { "no signature" },
                ROLES[base]
            )),
        }
    };
    match (pick(0, Designator::Root)?, pick(3, Designator::Usr)?) {
        (Some(d), None) | (None, Some(d)) => Ok(d),
        (Some(_), Some(_)) => {
            Err("it has both a root and a /usr partition; a sysext carries one".into())
        }
        (None, None) => Err(format!("no {arch} root or /usr partition")),
    }
}

fn le32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

fn le64(b: &[u8], o: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[o..o + 8]);
    u64::from_le_bytes(x)
}

/// The header's and the entries' CRC-32, as libblkid (and so systemd) checks them.
fn crc(b: &[u8]) -> u32 {
    let mut c = flate2::Crc::new();
    c.update(b);
    c.sum()
}

/// The GPT header at `sector`, checked, and its partition entries (checked too) with their size.
fn entries(file: &File, sector: u64) -> Result<(Vec<u8>, u32), String> {
    let mut hdr = [0u8; 92];
    pread(file, &mut hdr, sector).map_err(|e| format!("GPT header: {e}"))?;
    let mut zeroed = hdr;
    zeroed[16..20].fill(0);
    if le32(&hdr, 12) != 92 || crc(&zeroed) != le32(&hdr, 16) {
        return Err("its GPT header's size or CRC is wrong".into());
    }
    let (entries_lba, count, esize) = (le64(&hdr, 72), le32(&hdr, 80), le32(&hdr, 84));
    if count > MAX_ENTRIES || !(128..=512).contains(&esize) || !esize.is_multiple_of(8) {
        return Err(format!(
            "GPT with {count} entries of {esize} bytes: not a table systemd-repart writes"
        ));
    }
    let mut table = vec![0u8; (count * esize) as usize];
    let at = entries_lba
        .checked_mul(sector)
        .ok_or("GPT entries beyond the file")?;
    pread(file, &mut table, at).map_err(|e| format!("GPT entries: {e}"))?;
    if crc(&table) != le32(&hdr, 88) {
        return Err("its GPT partition entries' CRC is wrong".into());
    }
    Ok((table, esize))
}

/// The partitions of `table` by role (in `ROLES`' order): each within the file, of one of
/// `arch`'s types, and no role twice.
fn partitions(
    table: &[u8],
    esize: u32,
    sector: u64,
    size: u64,
    types: &[&str; 6],
    arch: &str,
) -> Result<[Option<Part>; 6], String> {
    let mut found: [Option<Part>; 6] = [None; 6];
    for e in table.chunks(esize as usize) {
        if e[..16].iter().all(|b| *b == 0) {
            continue;
        }
        let t = guid_str(&guid(&e[..16]));
        let (first, last) = (le64(e, 32), le64(e, 40));
        let span = last
            .checked_sub(first)
            .and_then(|n| n.checked_add(1))
            .and_then(|n| n.checked_mul(sector));
        let offset = first.checked_mul(sector);
        let (Some(len), Some(offset)) = (span, offset) else {
            return Err(format!("partition {t}: its extent is not a range"));
        };
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(format!("partition {t}: it extends beyond the file"));
        }
        let Some(i) = types.iter().position(|x| *x == t) else {
            return Err(format!(
                "partition type {t} is not a {arch} root or /usr with its verity and signature: the strict policy takes nothing else"
            ));
        };
        if found[i].is_some() {
            return Err(format!("two {} partitions", ROLES[i]));
        }
        found[i] = Some(Part {
            offset,
            len,
            uuid: guid(&e[16..32]),
        });
    }
    Ok(found)
}

/// The signature partition's root hash signed by one of `certs`, the partitions named by that
/// root hash, and the hash tree that gives it: what dm-verity and systemd will check.
pub fn prove(file: &File, d: &Ddi, certs: &[Cert]) -> Result<Proven, String> {
    let n = d.sig.len.min(MAX_SIG_JSON) as usize;
    let mut raw = vec![0u8; n];
    pread(file, &mut raw, d.sig.offset).map_err(|e| format!("signature partition: {e}"))?;
    let end = raw.iter().position(|b| *b == 0).unwrap_or(raw.len());
    let sig: SigJson = serde_json::from_slice(&raw[..end])
        .map_err(|e| format!("signature partition: not systemd's verity signature JSON: {e}"))?;
    let root = hex_bytes(&sig.root_hash)
        .filter(|r| r.len() >= 32)
        .ok_or("signature partition: rootHash is not a hex hash")?;
    let der = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, &sig.signature)
        .map_err(|e| format!("signature partition: signature is not base64: {e}"))?;
    let signer = pkcs7::verify_detached(&der, sig.root_hash.to_ascii_lowercase().as_bytes(), certs)
        .map_err(|e| format!("its root hash signature does not verify: {e}"))?;
    // systemd-repart names the data partition by the root hash's first 128 bits and the verity
    // partition by its last: the signature is for these partitions.
    if d.data.uuid[..] != root[..16] || d.verity.uuid[..] != root[root.len() - 16..] {
        return Err(format!(
            "its partitions ({}, {}) are not the ones root hash {} names",
            guid_str(&d.data.uuid),
            guid_str(&d.verity.uuid),
            sig.root_hash
        ));
    }
    let tree = verity_root(file, d)?;
    if tree != root {
        return Err(format!(
            "its data and hash tree give root hash {}, not the signed {}",
            crate::crypto::digest::hex(&tree),
            sig.root_hash
        ));
    }
    Ok(Proven {
        signer,
        root_hash: sig.root_hash.to_ascii_lowercase(),
    })
}

/// The first systemd that sets up dm-verity for a sysext whose data partition is /usr: 257 looks
/// only for a root partition's signature, mounts the /usr file system straight from its loop
/// partition and still counts it as signed (upstream 923eabf085a0, in 258).
pub(crate) const MIN_USR_VERITY_SYSTEMD: u32 = 258;

/// Why the node's systemd (`systemd`, its version) would merge a DDI of `designator`
/// unverified, if it would: a /usr partition before systemd 258 (an unknown one counts as such).
pub(crate) fn unverified(designator: Designator, systemd: Option<u32>) -> Option<String> {
    let old = systemd.is_none_or(|v| v < MIN_USR_VERITY_SYSTEMD);
    (designator == Designator::Usr && old).then(|| {
        format!(
            "its data partition is /usr, which {} merges without dm-verity, its signature never checked (systemd {MIN_USR_VERITY_SYSTEMD} or later checks it): on this node only a DDI with a root partition (systemd-repart --make-ddi=sysext) is taken",
            systemd.map_or("a systemd of unknown version".into(), |v| format!("systemd {v}"))
        )
    })
}

/// The whole judgement of a file as the strict policy's merge will make it: a signed DDI of
/// one of `certs` (its index), or why not (a plain image, a layout, a /usr partition the node's
/// systemd would not verify, a signature).
pub(crate) fn judge(
    file: &File,
    arch: &str,
    certs: &[Cert],
    systemd: Option<u32>,
) -> Result<usize, String> {
    let mut head = vec![0u8; 8192];
    let size = file.metadata().map_err(|e| e.to_string())?.len();
    let n = head.len().min(size as usize);
    pread(file, &mut head[..n], 0)?;
    let Some(sector) = gpt_sector(&head[..n]) else {
        return Err("a plain image, not a signed DDI".into());
    };
    let d = read(file, sector, size, arch)?;
    if let Some(why) = unverified(d.designator, systemd) {
        return Err(why);
    }
    prove(file, &d, certs).map(|p| p.signer)
}

fn hex_bytes(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || s.len() > 128 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// The root hash of the data partition under the verity partition's superblock (cryptsetup's
/// format, hash type 1: each block hashed as salt then block; hash blocks of digests padded with
/// zeros, level by level while a level has more than one digest), each computed hash block
/// compared with the one stored (the tree starts one hash block after the superblock, its top
/// level first).
fn verity_root(file: &File, d: &Ddi) -> Result<Vec<u8>, String> {
    let sb = Superblock::read(file, d)?;
    // Level 0: the data blocks' digests.
    let mut level = data_digests(file, d, &sb)?;
    // Up the tree: each level's hash blocks, kept to compare with the stored ones.
    let per = (sb.hbs / 32) as usize;
    // A single data block is its own root: no hash block at all.
    let mut levels: Vec<Vec<u8>> = Vec::new();
    while level.len() > 1 {
        let mut stored = Vec::with_capacity(level.len().div_ceil(per) * sb.hbs as usize);
        let mut next = Vec::with_capacity(level.len().div_ceil(per));
        for group in level.chunks(per) {
            let start = stored.len();
            for g in group {
                stored.extend_from_slice(g);
            }
            stored.resize(start + sb.hbs as usize, 0);
            let mut out = [0u8; 32];
            out.copy_from_slice(sha256(&[&sb.salt, &stored[start..]]).as_ref());
            next.push(out);
        }
        levels.push(stored);
        level = next;
    }
    stored_tree(file, d, sb.hbs, &levels)?;
    Ok(level[0].to_vec())
}

/// What verity_root takes from the verity superblock: block sizes, data blocks and salt.
struct Superblock {
    dbs: u64,
    hbs: u64,
    blocks: u64,
    salt: Vec<u8>,
}

impl Superblock {
    /// The superblock at the verity partition's start, in the one form nodestrap checks.
    fn read(file: &File, d: &Ddi) -> Result<Self, String> {
        let mut sb = [0u8; 512];
        pread(file, &mut sb, d.verity.offset).map_err(|e| format!("verity superblock: {e}"))?;
        if &sb[..8] != b"verity\0\0" {
            return Err("its verity partition has no verity superblock".into());
        }
        let (version, hash_type) = (le32(&sb, 8), le32(&sb, 12));
        let alg = &sb[32..64];
        let alg = std::str::from_utf8(&alg[..alg.iter().position(|b| *b == 0).unwrap_or(32)])
            .unwrap_or("?");
        let (dbs, hbs) = (le32(&sb, 64) as u64, le32(&sb, 68) as u64);
        let blocks = le64(&sb, 72);
        let salt = &sb[88..88 + (u16::from_le_bytes([sb[80], sb[81]]) as usize).min(256)];
        if version != 1 || hash_type != 1 || alg != "sha256" {
            return Err(format!(
                "verity superblock version {version}, hash type {hash_type}, {alg}: nodestrap checks version 1, type 1, sha256 (what systemd-repart writes)"
            ));
        }
        let pow2 = |b: u64| b.is_power_of_two() && (512..=65536).contains(&b);
        if !pow2(dbs) || !pow2(hbs) || blocks == 0 {
            return Err(format!(
                "verity superblock: blocks of {dbs} and {hbs} bytes, {blocks} data blocks"
            ));
        }
        if blocks.checked_mul(dbs).is_none_or(|n| n > d.data.len) {
            return Err(format!(
                "verity superblock: {blocks} data blocks of {dbs} bytes, more than the data partition's {} bytes",
                d.data.len
            ));
        }
        Ok(Superblock {
            dbs,
            hbs,
            blocks,
            salt: salt.to_vec(),
        })
    }
}

fn sha256(parts: &[&[u8]]) -> ring::digest::Digest {
    let mut c = ring::digest::Context::new(&ring::digest::SHA256);
    for p in parts {
        c.update(p);
    }
    c.finish()
}

/// The data blocks' digests, read in large chunks.
fn data_digests(file: &File, d: &Ddi, sb: &Superblock) -> Result<Vec<[u8; 32]>, String> {
    let (dbs, blocks) = (sb.dbs, sb.blocks);
    let mut level: Vec<[u8; 32]> = Vec::with_capacity(blocks as usize);
    let chunk = (dbs * 256).min(blocks * dbs);
    let mut buf = vec![0u8; chunk as usize];
    let mut done = 0u64;
    while done < blocks {
        let n = (blocks - done).min(chunk / dbs);
        let b = &mut buf[..(n * dbs) as usize];
        pread(file, b, d.data.offset + done * dbs).map_err(|e| format!("data partition: {e}"))?;
        for blk in b.chunks(dbs as usize) {
            let mut out = [0u8; 32];
            out.copy_from_slice(sha256(&[&sb.salt, blk]).as_ref());
            level.push(out);
        }
        done += n;
    }
    Ok(level)
}

/// The computed hash blocks (`levels`, bottom first) against the verity partition's, top level
/// first from one hash block after the superblock.
fn stored_tree(file: &File, d: &Ddi, hbs: u64, levels: &[Vec<u8>]) -> Result<(), String> {
    let mut at = d.verity.offset + hbs;
    for stored in levels.iter().rev() {
        if at + stored.len() as u64 > d.verity.offset + d.verity.len {
            return Err("its hash tree does not fit its verity partition".into());
        }
        let mut on_disk = vec![0u8; stored.len()];
        pread(file, &mut on_disk, at).map_err(|e| format!("verity partition: {e}"))?;
        if on_disk != *stored {
            return Err(
                "its stored hash tree is not the one its data gives: dm-verity would fail reads"
                    .into(),
            );
        }
        at += stored.len() as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_usr_partition_needs_systemd_258() {
        assert!(unverified(Designator::Usr, Some(257)).is_some_and(|w| w.contains("systemd 257")));
        assert!(unverified(Designator::Usr, None).is_some_and(|w| w.contains("unknown version")));
        assert_eq!(unverified(Designator::Usr, Some(258)), None);
        assert_eq!(unverified(Designator::Root, Some(257)), None);
        assert_eq!(unverified(Designator::Root, None), None);
    }

    /// A real DDI by systemd-repart 257 (the fuzz seed: its partitions packed, the GPT's CRCs
    /// made again) and the certificate that signed it: proven; with another certificate, or a
    /// byte of its data changed, not.
    #[test]
    fn a_real_repart_ddi_is_proven_and_a_changed_one_is_not() {
        let bytes = include_bytes!("../../fuzz/corpus/sysext_ddi/repart-signed.raw");
        let cert =
            Cert::from_pem(include_bytes!("../../fuzz/fixtures/pkcs7-signer.crt"), "c").unwrap();
        let dir = std::env::temp_dir().join(format!("nodestrap-ddi-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let judge = |b: &[u8], certs: &[Cert]| -> Result<Proven, String> {
            let p = dir.join("i.raw");
            std::fs::write(&p, b).unwrap();
            let f = File::open(&p).unwrap();
            let d = read(&f, gpt_sector(b).unwrap(), b.len() as u64, "x86-64")?;
            assert_eq!(d.designator, Designator::Root);
            prove(&f, &d, certs)
        };
        let p = judge(bytes, &cert).unwrap();
        assert_eq!(p.signer, 0);
        assert_eq!(p.root_hash.len(), 64);
        assert!(judge(bytes, &[])
            .unwrap_err()
            .contains("signer certificate not found"));
        let mut changed = bytes.to_vec();
        let data = 40 * 512 + 100;
        changed[data] ^= 1;
        assert!(judge(&changed, &cert)
            .unwrap_err()
            .contains("give root hash"));
        let mut table = bytes.to_vec();
        table[1024 + 60] ^= 1;
        assert!(judge(&table, &cert).unwrap_err().contains("entries' CRC"));
        let f = dir.join("i.raw");
        std::fs::write(&f, bytes).unwrap();
        let e = read(&File::open(&f).unwrap(), 512, bytes.len() as u64, "arm64").unwrap_err();
        assert!(e.contains("is not a arm64 root or /usr"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn gpt_guids_read_in_string_order() {
        // The x86-64 root type as GPT stores it.
        let stored = [
            0xe3, 0xbc, 0x68, 0x4f, 0xcd, 0xe8, 0xb1, 0x4d, 0x96, 0xe7, 0xfb, 0xca, 0xf9, 0x84,
            0xb7, 0x09,
        ];
        assert_eq!(
            guid_str(&guid(&stored)),
            "4f68bce3-e8cd-4db1-96e7-fbcaf984b709"
        );
        assert_eq!(hex_bytes("0aFf"), Some(vec![0x0a, 0xff]));
        assert!(hex_bytes("0g").is_none());
        let mut head = vec![0u8; 8192];
        assert_eq!(gpt_sector(&head), None);
        head[512..520].copy_from_slice(b"EFI PART");
        assert_eq!(gpt_sector(&head), Some(512));
    }
}
