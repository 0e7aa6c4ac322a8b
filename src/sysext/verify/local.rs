//! The boot check's checks on the node itself (`nodestrap verify` on a sysext node): per
//! extension its link, its image's digest, the merge, the loop device that reads the image and
//! its program's own version (docs/verify.md, "What it checks").

use crate::error::{Error, Result};
use crate::node::root::Root;
use crate::node::status::{Check, Chosen};
use crate::sysext::merge;
use crate::sysext::stage;

/// An image is hashed in full; a larger one is not one nodestrap staged.
const IMAGE_CAP: u64 = 8 << 30;

/// The checks on the node itself, per extension; and the extensions whose image is to blame
/// (merged intact from the recorded link, yet not in /usr or another version runs). What takes
/// time (hashing each image, each program's `--version`, `systemd-sysext status`) runs side by
/// side (`probes`); the checks are then made in order.
pub(super) fn local_checks(root: &Root, expected: &[Chosen]) -> (Vec<Check>, Vec<String>) {
    let (merged, digests, said) = probes(root, expected);
    let backing = crate::sysext::image::loop_backings();
    let mut out = Vec::new();
    let mut lying = Vec::new();
    for ((c, digest), said) in expected.iter().zip(digests).zip(said) {
        let first = out.len();
        let blame = extension_checks(root, c, digest, said, &merged, &backing, &mut out);
        // Only when the link and the file are as recorded (the node's part).
        if blame && out[first..first + 2].iter().all(|k| k.ok) {
            lying.push(c.name.clone());
        }
    }
    (out, lying)
}

/// What a program's `--version` said (or why not), and the command line; `None` for an
/// extension without a program to ask.
type Said = Option<(std::result::Result<String, String>, Vec<String>)>;

/// Side by side: what `systemd-sysext status` merged for /usr, each image's digest now, and
/// what each program says its version is.
fn probes(root: &Root, expected: &[Chosen]) -> (Result<Vec<String>>, Vec<String>, Vec<Said>) {
    std::thread::scope(|s| {
        let merged = s.spawn(merge::status_usr);
        let digests: Vec<_> = expected
            .iter()
            .map(|c| s.spawn(move || digest_of(root, &c.image, &c.digest)))
            .collect();
        let said: Vec<_> = expected
            .iter()
            .map(|c| {
                s.spawn(move || {
                    merge::version_probe(&c.name)
                        .map(|argv| (crate::node::exec::version_line(&argv), argv))
                })
            })
            .collect();
        let join = |e: Box<dyn std::any::Any + Send>| {
            e.downcast_ref::<&str>()
                .map(|m| m.to_string())
                .unwrap_or_else(|| "a check's thread panicked".into())
        };
        (
            merged
                .join()
                .map_err(|e| Error::failed(join(e)))
                .and_then(|m| m),
            digests
                .into_iter()
                .map(|h| h.join().unwrap_or_else(join))
                .collect::<Vec<_>>(),
            said.into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|e| Some((Err(join(e)), Vec::new())))
                })
                .collect::<Vec<_>>(),
        )
    })
}

/// The checks of extension `c`, pushed to `out`: its link, its image's digest, the merge, the
/// loop device, its program's version. Whether the image is to blame: when the merge took the
/// others and not this one, or when another version runs from it; never for an error or a
/// merge that failed as a whole.
fn extension_checks(
    root: &Root,
    c: &Chosen,
    digest: String,
    said: Said,
    merged: &Result<Vec<String>>,
    backing: &[(u32, u32, u64)],
    out: &mut Vec<Check>,
) -> bool {
    let n = &c.name;
    let link = format!("{}/{n}.raw", stage::LINKS);
    out.push(Check::compare(
        format!("{n} link {}", root.show(&link)),
        c.image.as_str(),
        root.dir(stage::LINKS)
            .ok()
            .flatten()
            .and_then(|d| d.link_target(&format!("{n}.raw")))
            .unwrap_or_else(|| "no link".to_string()),
    ));
    out.push(Check::compare(
        format!("{n} image {}", root.show(&c.image)),
        c.digest.as_str(),
        digest,
    ));
    let mut blame = false;
    out.push(Check::compare(
        format!("{n} merged for /usr"),
        "listed by systemd-sysext status",
        match merged {
            Ok(m) if m.contains(n) => "listed by systemd-sysext status".to_string(),
            Ok(m) if m.is_empty() => "nothing merged".to_string(),
            Ok(m) => {
                blame = true;
                format!("not listed (merged: {})", m.join(", "))
            }
            Err(e) => e.to_string(),
        },
    ));
    out.push(Check::compare(
        format!("{n} merged image"),
        "read by a loop device",
        match identity(root, &c.image) {
            Ok(id) if backing.contains(&id) => "read by a loop device".to_string(),
            Ok(_) => "no loop device reads it".to_string(),
            Err(e) => e,
        },
    ));
    if let Some((line, argv)) = said {
        let version = c.version.trim_start_matches('v');
        out.push(Check::compare(
            format!("{n} {}", argv.join(" ")),
            format!("version {version}"),
            match line {
                Ok(s) if crate::node::exec::says_version(&s, version) => {
                    format!("version {version}")
                }
                Ok(s) => {
                    blame = true;
                    format!("{s:?}")
                }
                Err(e) => e,
            },
        ));
    }
    blame
}

/// (major, minor, inode) of the file at `node_path`.
fn identity(root: &Root, node_path: &str) -> std::result::Result<(u32, u32, u64), String> {
    match root.open_file(node_path) {
        Ok(Some(f)) => rustix::fs::fstat(&f)
            .map(|st| {
                (
                    rustix::fs::major(st.st_dev),
                    rustix::fs::minor(st.st_dev),
                    st.st_ino,
                )
            })
            .map_err(|e| format!("{}: {e}", root.show(node_path))),
        Ok(None) => Err("no such file".to_string()),
        Err(e) => Err(e.to_string()),
    }
}

/// `sha256-<hex>` of the image now, or why it cannot be read.
pub(super) fn digest_of(root: &Root, node_path: &str, recorded: &str) -> String {
    let Some(d) = crate::crypto::digest::Digest::parse(recorded) else {
        return format!("a record that names no digest ({recorded:?})");
    };
    let f = match root.open_file(node_path) {
        Ok(Some(f)) => f,
        Ok(None) => return "no such file".to_string(),
        Err(e) => return e.to_string(),
    };
    let mut h = d.hasher();
    let mut sink = std::io::sink();
    match crate::crypto::digest::copy_hashing(
        &mut std::io::Read::take(f, IMAGE_CAP),
        &mut h,
        &mut sink,
    ) {
        Ok(_) => format!("{}-{}", d.algo_name(), h.finish_hex()),
        Err(
            crate::crypto::digest::CopyError::Read(e) | crate::crypto::digest::CopyError::Write(e),
        ) => format!("unreadable: {e}"),
    }
}
