//! Steps 3 and 4 for RHCOS: the machine-config-server's config handed to the machine-config
//! daemon.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use super::setup::*;
use crate::cli::Reprovision;
use crate::error::{Context, Error, Result};
use crate::inplace::mco;
use crate::inplace::progress::Reporter;
use crate::node::dir::Dir;
use crate::node::exec::{self, Command, Env};
use crate::node::root::{Root, CONFIG_CAP};

/// Steps 3 and 4 for RHCOS: complete the fetched config, get the MCD (before anything on the
/// Node changes: a failed extraction must leave the label for a retry), and persist the config
/// as the MachineConfig the MCD reads. Returns the rendered config's name and the MCD (none in
/// a dry run).
pub(super) fn rhcos_configure(
    a: &Reprovision,
    s: &Setup,
    progress: &Reporter,
    mut cfg: Value,
) -> Result<(String, Option<PathBuf>)> {
    let src = &s.secrets.url;
    let r = rendered(progress, &cfg, src)?;
    let image = mcd_image(a, &cfg, src)?;
    progress.report("configure", "started", &r.name);
    let (kubeconfig, from) = node_kubeconfig(s)?;
    crate::info!("{} for the node from {from}", mco::KUBECONFIG);
    mco::set_file(&mut cfg, mco::KUBECONFIG, &kubeconfig);
    mco::set_file(
        &mut cfg,
        mco::NODE_ANNOTATIONS,
        &mco::node_annotations(&r.name),
    );
    // The MCS's own (emptied) copy: the MCD would write it over the file it is consuming.
    mco::remove_file(&mut cfg, mco::ENCAPSULATED);
    let mc = mco::machine_config(&r, &cfg);
    let data = serde_json::to_vec(&mc).expect("serialisable");
    let mcd = persist(a, s, &r, image, &data)?;
    progress.report(
        "configure",
        "succeeded",
        &format!("MachineConfig {} persisted", r.name),
    );
    Ok((r.name, mcd))
}

/// Step 3's end: the fetched config's rendered name, reported.
fn rendered(progress: &Reporter, cfg: &Value, src: &str) -> Result<mco::Rendered> {
    progress.report("fetch", "started", "Ignition config");
    let r = mco::rendered(cfg, src);
    let r = match r {
        Ok(r) => r,
        Err(e) => {
            progress.report("fetch", "failed", &e.to_string());
            return Err(e);
        }
    };
    crate::info!(
        "Ignition config from {src}: spec {}, rendered config {} (from {})",
        mco::version(cfg),
        r.name,
        r.from
    );
    progress.report(
        "fetch",
        "succeeded",
        &format!("Ignition spec {} for {}", mco::version(cfg), r.name),
    );
    Ok(r)
}

/// The image the MCD comes from: none with --mcd-binary, else the one the config's MCD units
/// name.
fn mcd_image(a: &Reprovision, cfg: &Value, src: &str) -> Result<Option<String>> {
    match (&a.mcd_binary, mco::mco_image(cfg)) {
        (Some(_), _) => Ok(None),
        (None, Some(i)) => {
            crate::info!("machine-config-daemon comes from {i} (named by the config's MCD units)");
            Ok(Some(i))
        }
        (None, None) => Err(Error::failed(format!(
            "{src}: no machine-config-operator image in its machine-config-daemon units to take machine-config-daemon from; give --mcd-binary"
        ))),
    }
}

/// The kubeconfig the node gets, and where it comes from: the Secret's, else the node's own.
fn node_kubeconfig(s: &Setup) -> Result<(Vec<u8>, String)> {
    Ok(match &s.secrets.kubeconfig {
        Some(k) => (k.clone(), "the Secret's kubeconfig".to_string()),
        None => match s.root.read(mco::KUBECONFIG, CONFIG_CAP)? {
            Some(k) => (k, s.root.show(mco::KUBECONFIG)),
            None => {
                return Err(Error::config(format!(
                    "no kubeconfig for the node: the Secret has no key kubeconfig and {} does not exist",
                    s.root.show(mco::KUBECONFIG)
                )))
            }
        },
    })
}

/// Step 4's end: the MCD got, then the MachineConfig written where it reads it; the MCD (none
/// in a dry run, which only says what it would do).
fn persist(
    a: &Reprovision,
    s: &Setup,
    r: &mco::Rendered,
    image: Option<String>,
    data: &[u8],
) -> Result<Option<PathBuf>> {
    if a.dry_run {
        crate::info!(
            "dry run: would write {} ({} bytes) and run machine-config-daemon",
            s.root.show(mco::ENCAPSULATED),
            data.len()
        );
        return Ok(None);
    }
    let mcd = match (&a.mcd_binary, image) {
        (Some(p), _) => p.clone(),
        (None, Some(image)) => extract_mcd(a, &work_dir(&s.root)?, &image)?,
        (None, None) => unreachable!("checked above"),
    };
    // 0600: it carries the kubeconfig.
    s.root.write_atomic(mco::ENCAPSULATED, data, 0o600)?;
    crate::info!(
        "wrote {} (MachineConfig {}, {} bytes)",
        s.root.show(mco::ENCAPSULATED),
        r.name,
        data.len()
    );
    Ok(Some(mcd))
}

/// Step 6 for RHCOS: `machine-config-daemon firstboot-complete-machineconfig`, which applies the
/// MachineConfig and reboots the node itself.
pub(super) fn run_mcd(a: &Reprovision, mcd: &Path) -> Result<()> {
    let root = a.root.to_string_lossy().into_owned();
    crate::info!(
        "running {} firstboot-complete-machineconfig --root-mount {root}",
        mcd.display()
    );
    exec::stream_to_log(
        &Command {
            program: mcd.to_path_buf(),
            args: vec![
                "firstboot-complete-machineconfig".into(),
                "--root-mount".into(),
                root,
                "--machineconfig-file".into(),
                mco::ENCAPSULATED.into(),
            ],
            cwd: PathBuf::from("/"),
            env: Env::Only(base_env()),
            timeout: Duration::from_secs(a.entry_timeout),
            grace: KILL_GRACE,
        },
        "machine-config-daemon",
    )
}

/// Step 6 for RHCOS, judged as the MCD behaves: once it has applied the config it renames the
/// encapsulated file away, queues the reboot and sleeps until the shutdown kills it (it never
/// exits 0 then). Ended by a signal or our timeout after that rename, it did its part.
pub(super) fn mcd_hand_off(a: &Reprovision, root: &Root, mcd: &Path) -> Result<()> {
    match run_mcd(a, mcd) {
        Err(e) if finished_on_disk(root, Flow::Rhcos) => {
            crate::info!(
                "machine-config-daemon applied the config ({} is gone) and ended while its reboot is under way: {e}",
                root.show(mco::ENCAPSULATED)
            );
            Ok(())
        }
        r => r,
    }
}

/// The MCD from the machine-config-operator image the config names, with the configured
/// extraction command (`oc image extract` by default) into a private folder.
pub(super) fn extract_mcd(a: &Reprovision, work: &Dir, image: &str) -> Result<PathBuf> {
    work.remove_dir_tree(MCD_DIR)?;
    work.create_private_dir(MCD_DIR)?;
    let dir = work.host_path(MCD_DIR)?.to_string_lossy().into_owned();
    let root = a.root.to_string_lossy().trim_end_matches('/').to_string();
    let words: Vec<String> = a
        .mcd_extract_command
        .split_whitespace()
        .map(|w| {
            w.replace("{image}", image)
                .replace("{dir}", &dir)
                .replace("{root}", &root)
        })
        .collect();
    let (program, args) = words.split_first().expect("setup checked it is not empty");
    crate::info!("extracting machine-config-daemon from {image} with {program}");
    exec::stream_to_log(
        &Command {
            program: PathBuf::from(program),
            args: args.to_vec(),
            cwd: PathBuf::from("/"),
            env: Env::Only(base_env()),
            timeout: EXTRACT_TIMEOUT,
            grace: KILL_GRACE,
        },
        "mcd-extract",
    )?;
    let bin = PathBuf::from(&dir).join("machine-config-daemon");
    let meta = std::fs::symlink_metadata(&bin)
        .with_ctx(|| format!("{program} left no machine-config-daemon in {dir}"))?;
    if !meta.is_file() {
        return Err(Error::failed(format!(
            "{}: not a regular file",
            bin.display()
        )));
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755))
        .with_ctx(|| bin.display())?;
    Ok(bin)
}
