//! Steps 3 and 4 for RHEL: the payload verified, unpacked, and its entry script run.

use std::time::Duration;

use super::setup::*;
use crate::cli::Reprovision;
use crate::crypto::digest::{Algo, Digest};
use crate::error::{Error, Result};
use crate::inplace::progress::Reporter;
use crate::net::fetch::Request;
use crate::node::dir::Dir;
use crate::node::exec::{self, Command, Env};
use crate::node::verified::{unchecked, Expect, VerifiedWrite};

/// Steps 3 and 4 for RHEL: download and verify the payload, unpack it into a private folder,
/// run its entry script.
/// `seen`: the SHA-256 of preflight's fetch. Without a configured `payload-sha256` it pins the
/// payload: what is applied must be the very bytes preflight checked.
pub(super) fn rhel_configure(
    a: &Reprovision,
    s: &Setup,
    node: &str,
    progress: &Reporter,
    seen: Option<String>,
) -> Result<()> {
    let (worker, cluster, region) = s.secrets.ids.clone().expect("rhel ids");
    if a.dry_run {
        crate::info!(
            "dry run: would download the payload, unpack it under {} and run {}",
            s.root.show(WORK),
            a.payload_entry
        );
        return Ok(());
    }
    let work = work_dir(&s.root)?;
    // A folder left by a crashed run goes first: it is unpacked afresh.
    work.remove_dir_tree(PAYLOAD_DIR)?;

    progress.report("fetch", "started", "bootstrap payload");
    let want = match (&s.secrets.payload_sha256, seen) {
        (Some(d), _) => Some((d.clone(), "payload-sha256")),
        (None, Some(hex)) => Some((
            Digest {
                algo: Algo::Sha256,
                hex,
            },
            "the preflight fetch",
        )),
        (None, None) => None,
    };
    let url = s.secrets.payload_url();
    let mut req = Request::get(&url);
    bearer(&mut req, &s.secrets.token);
    let expect = match &want {
        Some((d, from)) => Expect::Digest(d, from),
        None => Expect::Record(Algo::Sha256),
    };
    // The payload's private work folder: nothing of the node to put back.
    let mut sink = VerifiedWrite::new(&work, PAYLOAD_FILE, 0o600, expect, &unchecked, None);
    let got = s
        .pinned
        .stream(&req, PAYLOAD_CAP, Some((&work, PAYLOAD_FILE)), &mut sink);
    let (n, sha) = match got {
        Ok(w) => (w.bytes, w.hex),
        Err(e) => {
            progress.report("fetch", "failed", &e.to_string());
            return Err(e.into());
        }
    };
    let verified = match &want {
        Some((_, says)) => format!("verified against {says}"),
        None => "no payload-sha256 to check".to_string(),
    };
    crate::info!(
        "payload from {}: {n} bytes, sha256 {sha} ({verified})",
        s.secrets.url
    );
    progress.report("fetch", "succeeded", &format!("{n} bytes, sha256 {sha}"));

    progress.report(
        "configure",
        "started",
        "unpacking the payload and running its entry script",
    );
    let r = unpack_and_run(a, s, &work, node, (&worker, &cluster, &region));
    remove_payload(&work);
    r?;
    progress.report(
        "configure",
        "succeeded",
        &format!("{} exited 0", a.payload_entry),
    );
    Ok(())
}

/// The unpacked payload and its archive may hold credentials: neither stays. One that cannot be
/// removed is named, and the next run (whatever its phase, `sweep_payload`) tries again.
fn remove_payload(work: &Dir) {
    let dir = work.remove_dir_tree(PAYLOAD_DIR).map(|_| ());
    for (name, r) in [
        (PAYLOAD_DIR, dir),
        (PAYLOAD_FILE, work.remove(PAYLOAD_FILE)),
    ] {
        if let Err(e) = r {
            crate::warn!(
                "{} not removed, and it may hold credentials: the next run tries again: {e}",
                work.show(name)
            );
        }
    }
}

/// What a run that could not remove the payload left (`remove_payload`), removed at the start of
/// every run that changes the node, before it looks at its phase: a node already handed off or
/// done keeps no credentials either.
pub(super) fn sweep_payload(root: &crate::node::root::Root) -> Result<()> {
    if let Some(work) = root.dir(WORK)? {
        remove_payload(&work);
    }
    Ok(())
}

pub(super) fn unpack_and_run(
    a: &Reprovision,
    s: &Setup,
    work: &Dir,
    node: &str,
    (worker, cluster, region): (&str, &str, &str),
) -> Result<()> {
    let archive = work.open(PAYLOAD_FILE)?;
    let dest = work.create_private_dir(PAYLOAD_DIR)?;
    let sum = crate::inplace::payload::unpack_tar_gz(
        archive,
        &dest,
        &s.secrets.url,
        &crate::inplace::payload::Limits::default(),
    )?;
    crate::info!(
        "payload unpacked into {}: {} files, {} directories, {} symlinks, {} hard links, {} bytes",
        work.show(PAYLOAD_DIR),
        sum.files,
        sum.dirs,
        sum.symlinks,
        sum.hardlinks,
        sum.bytes
    );
    let dir = work.host_path(PAYLOAD_DIR)?;
    let entry = dir.join(&a.payload_entry);
    match std::fs::symlink_metadata(&entry) {
        Ok(m) if m.is_file() => {}
        Ok(_) => {
            return Err(Error::failed(format!(
                "payload entry {}: not a regular file",
                a.payload_entry
            )))
        }
        Err(e) => {
            return Err(Error::failed(format!(
                "payload entry {}: {e}",
                a.payload_entry
            )))
        }
    }
    let mut env = base_env();
    env.extend([
        ("WORKER_ID".into(), worker.to_string()),
        ("CLUSTER_ID".into(), cluster.to_string()),
        ("REGION".into(), region.to_string()),
        ("NODE_NAME".into(), node.to_string()),
        ("HOST_ROOT".into(), a.root.to_string_lossy().into_owned()),
        ("HOME".into(), "/root".into()),
    ]);
    crate::info!(
        "running the payload's {} (timeout {} s)",
        a.payload_entry,
        a.entry_timeout
    );
    exec::stream_to_log(
        &Command {
            program: entry,
            args: Vec::new(),
            cwd: dir,
            env: Env::Only(env),
            timeout: Duration::from_secs(a.entry_timeout),
            grace: KILL_GRACE,
        },
        &a.payload_entry,
    )
}
