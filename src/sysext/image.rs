//! Check an image the way systemd-sysext will, before it may become current: a signed DDI's
//! signature, layout and hash tree (sysext::ddi), the file system,
//! the `extension-release` named after the extension, and its fields against the node's
//! os-release in systemd's order (docs/bootstrap.md, "sysext"). The image is mounted read-only
//! by the kernel that will merge it, through a loop device and a detached mount (fsopen and
//! fsmount): nothing appears in any mount table, and both vanish when the check ends.

use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use rustix::fs::{Mode, OFlags, ResolveFlags};
use rustix::mount::{FsMountFlags, FsOpenFlags, MountAttrFlags};

use crate::error::{Error, Result};
use crate::node::envfile::EnvFile;
use crate::sysext::ddi;
use crate::sysext::host::Host;

/// Under /usr: where the extension's release file is.
const RELEASE_DIR: &str = "lib/extension-release.d";
const RELEASE_CAP: u64 = 64 << 10;

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum FsType {
    Squashfs,
    Erofs,
    Ext4,
}

impl FsType {
    fn kernel_name(self) -> &'static str {
        match self {
            FsType::Squashfs => "squashfs",
            FsType::Erofs => "erofs",
            FsType::Ext4 => "ext4",
        }
    }

    /// By magic number, as blkid (and so systemd-dissect) finds it.
    pub(crate) fn probe(head: &[u8]) -> Option<FsType> {
        let at = |o: usize, m: &[u8]| head.get(o..o + m.len()) == Some(m);
        if at(0, b"hsqs") {
            Some(FsType::Squashfs)
        } else if at(1024, &0xE0F5_E1E2u32.to_le_bytes()) {
            Some(FsType::Erofs)
        } else if at(1080, &0xEF53u16.to_le_bytes()) {
            Some(FsType::Ext4)
        } else {
            None
        }
    }
}

/// Why an image is refused. `Unreadable` ones would make systemd-sysext merge nothing at all;
/// `Incompatible` ones it would skip.
#[derive(Debug)]
pub(crate) enum Refusal {
    Unreadable(String),
    Incompatible(String),
    Ours(String),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Unreadable(w) => write!(
                f,
                "{w}; systemd-sysext would fail to read its metadata and merge no extension at all"
            ),
            Refusal::Incompatible(w) => {
                write!(f, "{w}; systemd-sysext would skip it as incompatible")
            }
            Refusal::Ours(w) => f.write_str(w),
        }
    }
}

/// A good image: for a signed DDI, the certificate that signed it.
#[derive(Debug)]
pub(crate) struct Checked {
    pub(crate) signer: Option<usize>,
}

/// Check the image in `file` that will be merged as extension `name` on `host` under `trust`.
/// A bare file system is taken in `plain` mode; a signed DDI (a GPT disk image) when its root
/// hash signature, layout and hash tree are proven against the configured certificates, then
/// its file system is checked as a bare one's. `shown` names it in errors.
pub(crate) fn check(
    file: &File,
    name: &str,
    host: &Host,
    trust: &crate::sysext::trust::Trust,
    shown: &str,
) -> Result<Checked> {
    let refuse = |r: Refusal| Error::failed(format!("image {shown} refused: {r}"));
    let mut head = first_bytes(file, shown)?;
    let (region, signer) = ddi_region(file, &head, host, trust, shown)?;
    // Where /usr is in the file system: a /usr partition is /usr itself (systemd-repart's
    // CopyFiles=/usr:/), a bare file system or a root partition holds it as usr/.
    let usr = match region {
        Some((_, _, ddi::Designator::Usr)) => "",
        _ => "usr/",
    };
    let region = region.map(|(offset, len, _)| (offset, len));
    if let Some((offset, _)) = region {
        head = vec![0u8; 2048];
        let n = read_head(file, &mut head, offset)
            .map_err(|e| Error::failed(format!("{shown}: {e}")))?;
        head.truncate(n);
    }
    let fs = FsType::probe(&head).ok_or_else(|| {
        refuse(Refusal::Unreadable(
            "not a squashfs, erofs or ext4 file system, nor a signed DDI holding one".into(),
        ))
    })?;
    let mnt = mount_ro(file, fs, region).map_err(|e| {
        refuse(Refusal::Unreadable(format!(
            "the kernel cannot mount it as {}: {e}",
            fs.kernel_name()
        )))
    })?;
    let release = read_release(&mnt.fd, name, usr).map_err(refuse)?;
    if exists(&mnt.fd, &format!("{usr}lib/os-release")) {
        return Err(refuse(Refusal::Incompatible(
            "it contains /usr/lib/os-release, which an extension may not carry".into(),
        )));
    }
    if !usr.is_empty() && exists(&mnt.fd, "opt") {
        return Err(refuse(Refusal::Ours(
            "it ships /opt, which would make all of /opt read-only once merged, /opt/extensions included".into(),
        )));
    }
    validate(&release, name, host).map_err(|w| refuse(Refusal::Incompatible(w)))?;
    Ok(Checked { signer })
}

/// Where the file system is: the whole file (a bare one, `None`), or a signed DDI's data
/// partition, proven, with its designator; and the certificate that signed it.
type Region = (Option<(u64, u64, ddi::Designator)>, Option<usize>);

fn ddi_region(
    file: &File,
    head: &[u8],
    host: &Host,
    trust: &crate::sysext::trust::Trust,
    shown: &str,
) -> Result<Region> {
    let refuse = |r: Refusal| Error::failed(format!("image {shown} refused: {r}"));
    Ok(match ddi::gpt_sector(head) {
        Some(sector) => {
            let size = file
                .metadata()
                .map_err(|e| Error::failed(format!("{shown}: {e}")))?
                .len();
            let d = ddi::read(file, sector, size, host.arch).map_err(|w| {
                refuse(Refusal::Unreadable(format!(
                    "a disk image, but not a signed sysext DDI: {w}"
                )))
            })?;
            if let Some(why) = ddi::unverified(d.designator, trust.systemd) {
                return Err(refuse(Refusal::Unreadable(format!(
                    "a signed DDI, but {why}"
                ))));
            }
            if trust.certs.is_empty() {
                return Err(refuse(Refusal::Unreadable(
                    "a signed DDI, and no --sysext-verity-certs names a certificate to check it with: systemd refuses an image signed by a certificate not in /etc/verity.d, whatever the policy".into(),
                )));
            }
            let p =
                ddi::prove(file, &d, &trust.certs).map_err(|w| refuse(Refusal::Unreadable(w)))?;
            crate::info!(
                "{shown}: signed DDI, root hash {} {}",
                p.root_hash,
                trust.root_of(p.signer)
            );
            (
                Some((d.data.offset, d.data.len, d.designator)),
                Some(p.signer),
            )
        }
        None if trust.mode == crate::sysext::trust::Mode::Signed => {
            return Err(refuse(Refusal::Unreadable(format!(
                "a plain image, and --sysext-trust signed takes only signed DDIs: the policy {} refuses it, and with it every other extension of the boot's merge",
                crate::sysext::trust::POLICY
            ))));
        }
        None => (None, None),
    })
}

/// The image's first 8 KiB (where a GPT or a file system's superblock is); an empty file is
/// refused as such.
fn first_bytes(file: &File, shown: &str) -> Result<Vec<u8>> {
    let mut head = vec![0u8; 8192];
    let n = read_head(file, &mut head, 0).map_err(|e| Error::failed(format!("{shown}: {e}")))?;
    if n == 0 {
        let r = Refusal::Unreadable("it is empty (0 bytes): no file system, no DDI".into());
        return Err(Error::failed(format!("image {shown} refused: {r}")));
    }
    head.truncate(n);
    Ok(head)
}

fn read_head(file: &File, buf: &mut [u8], at: u64) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match rustix::io::pread(file, &mut buf[n..], at + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(n)
}

/// The extension-release file: exactly `extension-release.<name>`, else (as systemd allows)
/// the only `extension-release.*` when it carries `user.extension-release.strict=0`.
/// `usr`: where /usr is in the file system (`usr/`, or `` for a /usr partition).
fn read_release(mnt: &OwnedFd, name: &str, usr: &str) -> std::result::Result<EnvFile, Refusal> {
    let exact = format!("{usr}{RELEASE_DIR}/extension-release.{name}");
    let path = match open_in(mnt, &exact, OFlags::RDONLY) {
        Ok(f) => Some((exact, f)),
        Err(_) => lenient_release(mnt, usr),
    };
    let Some((path, f)) = path else {
        // A /usr partition whose file system holds usr/ at its top: systemd finds no release
        // file in it either ("No medium found"), and merges nothing of it.
        let nested = usr.is_empty() && exists(mnt, &format!("usr/{RELEASE_DIR}"));
        return Err(Refusal::Unreadable(format!(
            "it has no /usr/{RELEASE_DIR}/extension-release.{name} (the name inside must match the name it is merged under, {name}){}",
            if nested {
                "; its /usr partition's file system holds usr/ at its top, but a /usr partition is /usr itself (systemd-repart: CopyFiles=/usr:/)"
            } else {
                ""
            }
        )));
    };
    // Shown as the node will see it once merged.
    let path = if usr.is_empty() {
        format!("usr/{path}")
    } else {
        path
    };
    let mut text = String::new();
    File::from(f)
        .take(RELEASE_CAP + 1)
        .read_to_string(&mut text)
        .map_err(|e| Refusal::Unreadable(format!("/{path}: {e}")))?;
    if text.len() as u64 > RELEASE_CAP {
        return Err(Refusal::Unreadable(format!(
            "/{path}: over {RELEASE_CAP} bytes"
        )));
    }
    EnvFile::parse(&text, &format!("/{path}")).map_err(|e| Refusal::Unreadable(e.to_string()))
}

fn lenient_release(mnt: &OwnedFd, usr: &str) -> Option<(String, OwnedFd)> {
    let dir = open_in(
        mnt,
        &format!("{usr}{RELEASE_DIR}"),
        OFlags::RDONLY | OFlags::DIRECTORY,
    )
    .ok()?;
    let mut found = Vec::new();
    for ent in rustix::fs::Dir::read_from(&dir).ok()? {
        let n = String::from_utf8_lossy(ent.ok()?.file_name().to_bytes()).into_owned();
        if n.starts_with("extension-release.") {
            found.push(n);
        }
    }
    let [only] = found.as_slice() else {
        return None;
    };
    let path = format!("{usr}{RELEASE_DIR}/{only}");
    let f = open_in(mnt, &path, OFlags::RDONLY).ok()?;
    let mut v = [0u8; 8];
    let n = rustix::fs::fgetxattr(&f, "user.extension-release.strict", &mut v[..]).ok()?;
    (&v[..n] == b"0").then_some((path, f))
}

/// systemd's `extension_release_validate`, in its order, for the scope `system` (v252-v257;
/// v258 also takes a word of the host's ID_LIKE, which nodestrap does not yet).
pub(crate) fn validate(r: &EnvFile, name: &str, host: &Host) -> std::result::Result<(), String> {
    if r.vars.is_empty() {
        return Err(format!("its extension-release.{name} is empty"));
    }
    let scope = r.get("SYSEXT_SCOPE").unwrap_or("system portable");
    if !scope.split_whitespace().any(|s| s == "system") {
        return Err(format!(
            "extension '{name}' is for scope '{scope}', not 'system' (SYSEXT_SCOPE)"
        ));
    }
    if let Some(a) = r
        .get("ARCHITECTURE")
        .filter(|a| !a.is_empty() && *a != "_any")
    {
        if a != host.arch {
            return Err(format!(
                "extension '{name}' is for architecture '{a}', but deployed on top of '{}'",
                host.arch
            ));
        }
    }
    let id = match r.get("ID").filter(|i| !i.is_empty()) {
        None => {
            return Err(format!(
                "extension '{name}' does not contain ID in extension-release but requested to match '{}' or be '_any'",
                host.id
            ))
        }
        Some("_any") => return Ok(()),
        Some(i) => i,
    };
    if id != host.id {
        return Err(format!(
            "extension '{name}' is for OS '{id}', but deployed on top of '{}'",
            host.id
        ));
    }
    if host.version_id.is_none() && host.sysext_level.is_none() {
        return Ok(());
    }
    let field = |k| r.get(k).filter(|v| !v.is_empty());
    if let (Some(want), Some(have)) = (field("SYSEXT_LEVEL"), host.sysext_level.as_deref()) {
        return match want == have {
            true => Ok(()),
            false => Err(format!(
                "extension '{name}' is for sysext API level '{want}', but deployed on top of '{have}'"
            )),
        };
    }
    match (field("VERSION_ID"), host.version_id.as_deref()) {
        (Some(want), Some(have)) if want == have => Ok(()),
        (Some(want), have) => Err(format!(
            "extension '{name}' is for OS '{want}', but deployed on top of '{}'",
            have.unwrap_or("")
        )),
        (None, _) => Err(format!(
            "extension '{name}' has neither a SYSEXT_LEVEL matching the host's nor a VERSION_ID"
        )),
    }
}

fn open_in(mnt: &OwnedFd, path: &str, flags: OFlags) -> std::io::Result<OwnedFd> {
    Ok(rustix::fs::openat2(
        mnt,
        path,
        flags | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
    )?)
}

fn exists(mnt: &OwnedFd, path: &str) -> bool {
    open_in(mnt, path, OFlags::PATH).is_ok()
}

/// A read-only detached mount of `file`, and the loop device under it (freed with the last
/// reference: LO_FLAGS_AUTOCLEAR).
struct Mounted {
    fd: OwnedFd,
    _loop: OwnedFd,
}

/// `region`: (offset, length) of the partition to mount, for a DDI.
fn mount_ro(file: &File, fs: FsType, region: Option<(u64, u64)>) -> std::io::Result<Mounted> {
    let (dev, lo) = attach_loop(file, region)?;
    let ctx = rustix::mount::fsopen(fs.kernel_name(), FsOpenFlags::FSOPEN_CLOEXEC)?;
    rustix::mount::fsconfig_set_string(&ctx, "source", dev.as_str())?;
    rustix::mount::fsconfig_set_flag(&ctx, "ro")?;
    rustix::mount::fsconfig_create(&ctx)?;
    let fd = rustix::mount::fsmount(
        &ctx,
        FsMountFlags::FSMOUNT_CLOEXEC,
        MountAttrFlags::MOUNT_ATTR_RDONLY
            | MountAttrFlags::MOUNT_ATTR_NOSUID
            | MountAttrFlags::MOUNT_ATTR_NODEV
            | MountAttrFlags::MOUNT_ATTR_NOEXEC,
    )?;
    Ok(Mounted { fd, _loop: lo })
}

// <linux/loop.h>
const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LOOP_GET_STATUS64: libc::c_ulong = 0x4C05;
const LO_FLAGS_READ_ONLY: u32 = 1;
const LO_FLAGS_AUTOCLEAR: u32 = 4;

#[repr(C)]
struct LoopInfo64 {
    device: u64,
    inode: u64,
    rdevice: u64,
    offset: u64,
    sizelimit: u64,
    number: u32,
    encrypt_type: u32,
    encrypt_key_size: u32,
    flags: u32,
    file_name: [u8; 64],
    crypt_name: [u8; 64],
    encrypt_key: [u8; 32],
    init: [u64; 2],
}

#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

/// The file each bound loop device reads, as (major, minor, inode) of the backing file
/// (LOOP_GET_STATUS64): every image systemd-sysext merged is one of them while it is merged.
/// Compared by identity, not by name: `backing_file` in sysfs names the file relative to the
/// mount it was opened through, which a bind mount changes.
pub(crate) fn loop_backings() -> Vec<(u32, u32, u64)> {
    let Ok(rd) = std::fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        // Only bound devices have a backing file.
        if !name.starts_with("loop") || !e.path().join("loop/backing_file").exists() {
            continue;
        }
        let Ok(lo) = rustix::fs::open(
            format!("/dev/{name}").as_str(),
            OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        ) else {
            continue;
        };
        // SAFETY: all-zero is a valid loop_info64, which the call fills in.
        let mut info: LoopInfo64 = unsafe { std::mem::zeroed() };
        // SAFETY: info is a live, properly laid out struct loop_info64 for the whole call.
        let r = unsafe {
            libc::ioctl(
                lo.as_raw_fd(),
                LOOP_GET_STATUS64 as _,
                &mut info as *mut LoopInfo64,
            )
        };
        if r == 0 {
            // The kernel's "huge" encoding of a device number (new_encode_dev).
            let d = info.device;
            let major = ((d & 0xfff00) >> 8) as u32;
            let minor = ((d & 0xff) | ((d >> 12) & 0xfff00)) as u32;
            out.push((major, minor, info.inode));
        }
    }
    out
}

/// A free loop device bound read-only to `file` (LOOP_CONFIGURE, Linux 5.8+); another process
/// may take the same free device first, so a busy one is tried again.
fn attach_loop(file: &File, region: Option<(u64, u64)>) -> std::io::Result<(String, OwnedFd)> {
    let ctl = rustix::fs::open(
        "/dev/loop-control",
        OFlags::RDWR | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut last = std::io::Error::other("no loop device");
    for _ in 0..16 {
        // SAFETY: LOOP_CTL_GET_FREE takes no argument and returns a device number.
        let n = unsafe { libc::ioctl(ctl.as_raw_fd(), LOOP_CTL_GET_FREE as _) };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let dev = format!("/dev/loop{n}");
        let lo = rustix::fs::open(
            dev.as_str(),
            OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        // SAFETY: all-zero is a valid loop_config; only fd and flags are set.
        let mut cfg: LoopConfig = unsafe { std::mem::zeroed() };
        cfg.fd = file.as_fd().as_raw_fd() as u32;
        cfg.info.flags = LO_FLAGS_READ_ONLY | LO_FLAGS_AUTOCLEAR;
        if let Some((offset, len)) = region {
            cfg.info.offset = offset;
            cfg.info.sizelimit = len;
        }
        // SAFETY: cfg is a live, properly laid out struct loop_config for the whole call.
        let r = unsafe {
            libc::ioctl(
                lo.as_raw_fd(),
                LOOP_CONFIGURE as _,
                &cfg as *const LoopConfig,
            )
        };
        if r == 0 {
            return Ok((dev, lo));
        }
        last = std::io::Error::last_os_error();
        if last.raw_os_error() != Some(libc::EBUSY) {
            return Err(last);
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(id: &str, version: Option<&str>, level: Option<&str>) -> Host {
        Host {
            id: id.into(),
            version_id: version.map(Into::into),
            sysext_level: level.map(Into::into),
            arch: "x86-64",
            source: "t".into(),
        }
    }

    fn v(text: &str, h: &Host) -> std::result::Result<(), String> {
        validate(&EnvFile::parse(text, "t").unwrap(), "k", h)
    }

    /// The cases as systemd-sysext 252 (Debian 12) and 257 (Debian 13) decided them when tried.
    #[test]
    fn systemd_order_and_words() {
        let deb = host("debian", Some("13"), None);
        assert!(v("ID=_any\n", &deb).is_ok());
        assert!(v("ID=debian\nVERSION_ID=13\nARCHITECTURE=x86-64\n", &deb).is_ok());
        assert!(v("ID=fedora\nVERSION_ID=13\n", &deb)
            .unwrap_err()
            .contains("is for OS 'fedora', but deployed on top of 'debian'"));
        assert!(v("ID=debian\nVERSION_ID=12\n", &deb)
            .unwrap_err()
            .contains("is for OS '12', but deployed on top of '13'"));
        assert!(v("VERSION_ID=13\n", &deb)
            .unwrap_err()
            .contains("does not contain ID"));
        // Architecture is checked before ID, even against _any.
        assert!(v("ID=_any\nARCHITECTURE=arm64\n", &deb)
            .unwrap_err()
            .contains("architecture 'arm64'"));
        assert!(v("ID=_any\nSYSEXT_SCOPE=initrd\n", &deb)
            .unwrap_err()
            .contains("scope"));
        // Debian has no SYSEXT_LEVEL: a level alone is refused, with VERSION_ID it merges.
        assert!(v("ID=debian\nSYSEXT_LEVEL=1.0\n", &deb).is_err());
        assert!(v("ID=debian\nSYSEXT_LEVEL=1.0\nVERSION_ID=13\n", &deb).is_ok());
        let flatcar = host("flatcar", Some("4593.2.5"), Some("1.0"));
        assert!(v("ID=flatcar\nSYSEXT_LEVEL=1.0\n", &flatcar).is_ok());
        assert!(v(
            "ID=flatcar\nSYSEXT_LEVEL=2.0\nVERSION_ID=4593.2.5\n",
            &flatcar
        )
        .is_err());
        // A rolling host (no VERSION_ID, no SYSEXT_LEVEL) takes any version.
        assert!(v("ID=arch\nVERSION_ID=1\n", &host("arch", None, None)).is_ok());
        assert!(validate(&EnvFile::default(), "k", &deb)
            .unwrap_err()
            .contains("empty"));
    }

    #[test]
    fn magic_numbers() {
        let mut b = vec![0u8; 2048];
        assert_eq!(FsType::probe(&b), None);
        b[..4].copy_from_slice(b"hsqs");
        assert_eq!(FsType::probe(&b), Some(FsType::Squashfs));
        let mut e = vec![0u8; 2048];
        e[1024..1028].copy_from_slice(&[0xE2, 0xE1, 0xF5, 0xE0]);
        assert_eq!(FsType::probe(&e), Some(FsType::Erofs));
        assert_eq!(FsType::probe(&e[..1026]), None);
    }
}
