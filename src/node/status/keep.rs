//! Keeping the status record: written atomically to the running system's run folder and under
//! the node's root, read back for `status`, the boot check and the next run.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::node::root::{read_capped, Root};
use crate::node::run::{run_dir, save_run_file};

use super::*;

pub(super) fn to_json(r: &Record) -> Result<Vec<u8>> {
    let mut v =
        serde_json::to_vec_pretty(r).map_err(|e| Error::failed(format!("status record: {e}")))?;
    v.push(b'\n');
    Ok(v)
}

/// The running system's copy of `command`'s record.
pub(crate) fn run_file(command: &str) -> PathBuf {
    run_dir().join(file_name(command))
}

/// Replaced atomically by a rename from a temp file of nodestrap's naming, like every file
/// nodestrap writes (a run killed mid-write leaves a temp that the next one sweeps). Not
/// fsynced: /run is a tmpfs, gone at the next boot anyway, and a run should not wait on a disk
/// for its progress report.
pub(super) fn save_run_dir(command: &str, json: &[u8]) -> Result<()> {
    save_run_file(&file_name(command), json)
        .map_err(|e| Error::failed(format!("status record {e}")))
}

/// Change the kept record of the last run under `root` (and the running system's copy when it
/// is of the same run): `nodestrap verify` adds what it found.
pub(crate) fn amend(root: &Root, before: &Record, after: &Record) -> Result<String> {
    let json = to_json(after)?;
    let at = kept(&after.command);
    // Only the record of that run: a bootstrap that ended since has its own.
    if let Some(f) = root.open_file(&at)? {
        let (now, _) = parse(f, &root.show(&at))?;
        if now.started != before.started {
            return Err(Error::failed(format!(
                "{}: a later run ({} started {}) replaced the record checked; not changed",
                root.show(&at),
                now.command,
                now.started
            )));
        }
    }
    root.write_atomic(&at, &json, 0o644)?;
    let run = run_file(&after.command);
    if let Ok(f) = std::fs::File::open(&run) {
        if parse(f, &run.display().to_string()).is_ok_and(|(r, _)| r.started == before.started) {
            save_run_dir(&after.command, &json)?;
        }
    }
    Ok(root.show(&at))
}

/// The record of the last bootstrap on this system's root, which a boot check verifies; none
/// is an error naming where it was looked for.
pub(crate) fn last_bootstrap() -> Result<(Record, String)> {
    load(Path::new("/"), "bootstrap")?.ok_or_else(|| {
        Error::failed(format!(
            "no status record at {} nor {KEPT}: no bootstrap has run, nothing to verify",
            run_file("bootstrap").display(),
        ))
    })
}

/// Whether the last bootstrap on `root` staged the torcx payload (its record decides a torcx
/// profile or the OS's version, which only torcx runs do); `false` without a readable record.
pub fn last_bootstrap_was_torcx(root: &Path) -> bool {
    matches!(load(root, "bootstrap"), Ok(Some((r, _)))
        if r.decisions.iter().any(|d| d.what == "torcx-profile" || d.what == "os"))
}

/// The record of the last run on `root`: the running system's copy when that run was on this
/// root (a run in the initramfs on /sysroot was on the root this system booted into), else the
/// one kept under `root`. `None` when neither exists; a file that is not a record is an error
/// naming it. A record of a run whose process is gone reads as interrupted.
pub(crate) fn load(root: &Path, command: &str) -> Result<Option<(Record, String)>> {
    let run = run_file(command);
    let found = match std::fs::File::open(&run) {
        Ok(f) => Some(parse(f, &run.display().to_string())?),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(Error::failed(format!("{}: {e}", run.display()))),
    };
    let found = match found {
        Some((r, from)) if same_root(&r.root, root) => Some((r, from)),
        Some((r, from)) => {
            crate::info!(
                "{from} is the record of a run on root {}, not {}: reading the record kept under {}",
                r.root,
                root.display(),
                root.display()
            );
            None
        }
        None => None,
    };
    let found = match found {
        Some(x) => Some(x),
        None => {
            let root = Root::open(root)?;
            let at = kept(command);
            match root.open_file(&at)? {
                Some(f) => Some(parse(f, &root.show(&at))?),
                None => None,
            }
        }
    };
    Ok(found.map(|(mut r, from)| {
        if r.state == State::Running && r.process.as_ref().is_some_and(|p| !p.alive()) {
            r.state = State::Interrupted;
        }
        (r, from)
    }))
}

/// Whether a record written with `--root written` is of the root `asked`.
pub(super) fn same_root(written: &str, asked: &Path) -> bool {
    let canon = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let (w, a) = (canon(Path::new(written)), canon(asked));
    w == a || (a == Path::new("/") && Path::new(written) == Path::new("/sysroot"))
}

pub(super) fn parse(f: std::fs::File, name: &str) -> Result<(Record, String)> {
    let bytes = read_capped(f, CAP).map_err(|e| Error::failed(format!("{name}: {e}")))?;
    Ok((from_json(&bytes, name)?, name.to_string()))
}

/// A record as `nodestrap status` reads it (serde_json's depth limit of 128 bounds nesting;
/// the caller bounds the size).
pub fn from_json(bytes: &[u8], name: &str) -> Result<Record> {
    let r: Record = serde_json::from_slice(bytes)
        .map_err(|e| Error::failed(format!("{name}: not a status record: {e}")))?;
    if r.schema != SCHEMA {
        return Err(Error::failed(format!(
            "{name}: status record schema {} (this nodestrap reads {SCHEMA})",
            r.schema
        )));
    }
    Ok(r)
}

/// The record as `nodestrap status --json` prints it and `finish` writes it.
pub fn to_json_text(r: &Record) -> Result<String> {
    to_json(r).map(|v| String::from_utf8_lossy(&v).into_owned())
}
