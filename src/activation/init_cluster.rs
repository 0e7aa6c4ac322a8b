//! `nodestrap init-cluster`: the admin's side of the init exchange. It checks the request the
//! way the node will, waits for the node's init server to be reachable, sends the request once
//! (an init that started is never resumed or repeated), and writes the admin kubeconfig it gets
//! back atomically, mode 0600. On failure it prints the node's error and the tail of its log.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::activation::exchange::{self, CallError, Endpoint};
use crate::activation::mtls::{self, Identity};
use crate::activation::wire::{self, InitRequest, INIT_PATH};
use crate::cli::InitCluster;
use crate::error::{Error, Result};
use crate::node::root::{read_host_file, Root};

/// Pause between tries while the node cannot be reached.
const RETRY: Duration = Duration::from_secs(3);

pub fn run(a: &InitCluster) -> Result<()> {
    // 1. Options and the request, checked as the node will check them.
    let asking = request(a)?;
    // 2. Send once the node answers; only an unreachable node is tried again.
    let (status, answer) = send(a, &asking)?;
    // 3. The answer: the admin kubeconfig written, or the node's error and kubeadm's output.
    write_answer(&asking, status, &answer)
}

/// Step 1's result: where to send what, and where the kubeconfig goes.
struct Asking {
    ep: Endpoint,
    cfg: std::sync::Arc<rustls::ClientConfig>,
    body: Vec<u8>,
    out: PathBuf,
    cluster: String,
}

/// Step 1: every option and the request, checked as the node will check them.
fn request(a: &InitCluster) -> Result<Asking> {
    let ep = Endpoint::parse(&a.endpoint, "--endpoint")?;
    // Zero would leave no time for the answer (and as a socket timeout means none at all).
    if a.timeout == 0 {
        return Err(Error::config("--timeout 0: must be at least 1"));
    }
    let secret = read_host_file(&a.secret_file, 4096, "--secret-file")?;
    let secret = String::from_utf8(secret)
        .map_err(|_| {
            Error::config(format!(
                "--secret-file {}: not UTF-8 text",
                a.secret_file.display()
            ))
        })?
        .trim_end_matches(['\r', '\n'])
        .to_string();
    if secret.is_empty() {
        return Err(Error::config(format!(
            "--secret-file {}: empty",
            a.secret_file.display()
        )));
    }
    let req = InitRequest {
        cluster_name: a.cluster_name.clone(),
        kubernetes_version: a.kubernetes_version.clone(),
        pod_cidr: a.pod_cidr.clone(),
        service_cidr: a.service_cidr.clone(),
        apiserver_sans: a
            .apiserver_sans
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect(),
        control_plane_endpoint: a.control_plane_endpoint.clone(),
        init_secret: secret,
    };
    req.validate()
        .map_err(|m| Error::config(wire::as_flag(&m)))?;
    let out = absolute(&a.out)?;
    let host = |p: &PathBuf, flag: &str| read_host_file(p, 1 << 20, flag);
    let id = Identity {
        chain: mtls::certs(&host(&a.cert, "--cert")?, &a.cert.display().to_string())?,
        key: mtls::key(&host(&a.key, "--key")?, &a.key.display().to_string())?,
    };
    let ca = mtls::certs(&host(&a.ca, "--ca")?, &a.ca.display().to_string())?;
    let cfg = mtls::client_config(&ca, &id, &a.cert.display().to_string())?;
    let body = serde_json::to_vec(&req)?;
    Ok(Asking {
        ep,
        cfg,
        body,
        out,
        cluster: req.cluster_name,
    })
}

/// Step 2: the request, sent once the node answers (an unreachable node is tried again within
/// `--wait`); its status and body.
fn send(a: &InitCluster, asking: &Asking) -> Result<(u16, Vec<u8>)> {
    let Asking { ep, cfg, body, .. } = asking;
    let start = Instant::now();
    loop {
        match exchange::post(
            cfg,
            ep,
            a.server_name.as_deref(),
            INIT_PATH,
            body,
            Duration::from_secs(10),
            Duration::from_secs(a.timeout),
        ) {
            Ok(x) => return Ok((x.status, x.body)),
            Err(CallError::Unreachable(e))
                if start.elapsed() + RETRY < Duration::from_secs(a.wait) =>
            {
                crate::info!("{e}; trying again in {} s", RETRY.as_secs());
                std::thread::sleep(RETRY);
            }
            Err(e) => return Err(e.into_error()),
        }
    }
}

/// Step 3: a refusal printed with the node's kubeadm output; else the admin kubeconfig written
/// atomically, 0600.
fn write_answer(asking: &Asking, status: u16, answer: &[u8]) -> Result<()> {
    let Asking {
        ep, out, cluster, ..
    } = asking;
    if status != 200 {
        let (code, msg) = exchange::answer_error(status, answer);
        let v: serde_json::Value = serde_json::from_slice(answer).unwrap_or_default();
        if let Some(tail) = v["log_tail"].as_str().filter(|t| !t.is_empty()) {
            use std::io::Write as _;
            let _ = writeln!(
                std::io::stderr(),
                "--- end of the node's kubeadm output ---\n{}\n---",
                tail.trim_end()
            );
        }
        return Err(Error::failed(format!(
            "init request to {}: {msg} ({code})",
            ep.url
        )));
    }
    let v: serde_json::Value = serde_json::from_slice(answer)
        .map_err(|e| Error::failed(format!("init answer from {}: {e}", ep.url)))?;
    let kubeconfig = v["kubeconfig"]
        .as_str()
        .filter(|k| !k.is_empty())
        .ok_or_else(|| Error::failed(format!("init answer from {}: no kubeconfig", ep.url)))?;
    let fs = Root::open(Path::new("/"))?;
    fs.write_atomic(&out.to_string_lossy(), kubeconfig.as_bytes(), 0o600)
        .map_err(|e| e.context("--out"))?;
    crate::info!("admin kubeconfig written to {}", out.display());
    crate::outln!(
        "nodestrap: init-cluster done cluster={} ca-cert-hash={} kubeconfig={}",
        cluster,
        v["ca_cert_hash"].as_str().unwrap_or("unknown"),
        out.display()
    )?;
    Ok(())
}

fn absolute(p: &Path) -> Result<PathBuf> {
    if p.is_absolute() {
        return Ok(p.to_path_buf());
    }
    std::env::current_dir()
        .map(|d| d.join(p))
        .map_err(|e| Error::config(format!("--out {}: {e}", p.display())))
}
