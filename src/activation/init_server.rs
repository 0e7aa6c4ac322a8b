//! activate's init server: an admin's `POST /v1/init`, authenticated (admin CA, init secret)
//! and validated, kubeadm's configuration judged by kubeadm and its images found, all before
//! the node lock; then `kubeadm init` and the admin kubeconfig as the answer (docs/activate.md).

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use crate::activation::exchange;
use crate::activation::kubeadm::{self, InitSpec};
use crate::activation::mtls;
use crate::activation::nodelock::Role;
use crate::activation::racers::{remove_or_warn, reset_manifests, Ctx, Side, PKI};
use crate::activation::wire::{InitRequest, INIT_PATH};
use crate::error::{Error, Result};

const ADMIN_CONF: &str = "/etc/kubernetes/admin.conf";
/// kubeadm configs live in /run (tmpfs) only while a request is handled.
const INIT_CONFIG: &str = "/run/nodestrap/kubeadm-init.yaml";

enum Conn {
    Next,
    Won(String),
    Fatal(Error),
}

pub(super) fn init_server(ctx: &Ctx, listener: &TcpListener) -> Result<Side> {
    let mut end = Ok(Side::Stopped);
    exchange::serve(
        listener,
        || ctx.stop.requested(),
        |tcp, addr| init_preauth(ctx, tcp, addr),
        |asked| match init_conn(ctx, asked) {
            Conn::Next => true,
            Conn::Won(cluster) => {
                end = Ok(Side::Won {
                    role: Role::ControlPlane,
                    via: "init",
                    cluster,
                });
                false
            }
            Conn::Fatal(e) => {
                end = Err(e);
                false
            }
        },
        // An admin who asks while activation ends is told why, never met by a closed port.
        |asked| refuse_taken(ctx, asked),
    )?;
    match end {
        Ok(Side::Stopped) if ctx.lock.is_taken() => Ok(Side::Lost),
        other => other,
    }
}

fn answer(s: &mut exchange::ServerStream, who: &str, status: u16, body: serde_json::Value) {
    // kubeadm init may have run since the request: the answer gets a full time limit.
    s.sock.restart();
    if let Err(e) = exchange::respond(s, status, &body) {
        crate::warn!("init server: answering {who}: {e}");
    }
}

/// An admin whose certificate, secret and request passed.
struct Asked {
    s: exchange::ServerStream,
    who: String,
    body: InitRequest,
}

/// Steps 1 to 4, in the connection's own thread, before anything is locked: the handshake
/// (the client's certificate must come from the admin CA), then one request: the secret
/// first, then every field, CIDRs against the node's own address. A refusal is answered here.
fn init_preauth(ctx: &Ctx, tcp: TcpStream, addr: SocketAddr) -> Option<Asked> {
    let node_ip = tcp.local_addr().ok().map(|a| a.ip());
    let (mut s, peer) = match exchange::accept(tcp, &ctx.server, exchange::PREAUTH_TIMEOUT) {
        Ok(x) => x,
        Err(e) => {
            crate::warn!("init server: refused a connection from {addr}: {e}; node lock untouched");
            return None;
        }
    };
    let who = format!("{} at {addr}", peer.cn);
    match init_request(ctx, &mut s, node_ip) {
        Ok(body) => Some(Asked { s, who, body }),
        Err((status, code, m)) => {
            crate::warn!("init server: request from {who} refused, node lock untouched: {m}");
            answer(&mut s, &who, status, exchange::error_body(code, &m));
            None
        }
    }
}

fn init_conn(ctx: &Ctx, asked: Asked) -> Conn {
    let Asked { mut s, who, body } = asked;
    // 5. kubeadm's config for this request; with --images, every image kubeadm init runs under
    //    it is in containerd: a node without one stays fresh, and the admin is told which.
    if let Err((status, code, e)) = prepare_init(ctx, &body) {
        remove_or_warn(ctx.root, INIT_CONFIG, "a kubeadm config");
        crate::error!("init server: init request from {who}: {e}");
        answer(
            &mut s,
            &who,
            status,
            exchange::error_body(code, &e.to_string()),
        );
        return Conn::Next;
    }
    // 6. The node lock.
    let source = format!("init request from {who}");
    let locked = ctx
        .lock
        .try_lock(Role::ControlPlane, &body.cluster_name, None, &source);
    match locked {
        Ok(true) => ctx.stop.wake(),
        Ok(false) => {
            remove_or_warn(ctx.root, INIT_CONFIG, "a kubeadm config");
            refuse_taken(ctx, Asked { s, who, body });
            return Conn::Next;
        }
        Err(_) => {}
    }
    // 7. kubeadm init; 8. done, then the answer (a lost answer does not undo a cluster). Any
    //    failure from the lock on is fatal, and answered with the tail of kubeadm's output.
    let result = locked.map_err(plain).and_then(|_| {
        let kubeconfig = init_cluster(ctx, &body)?;
        let ca_hash = ctx
            .root
            .read(&format!("{PKI}/ca.crt"), 1 << 20)
            .ok()
            .flatten()
            .and_then(|pem| mtls::certs(&pem, "ca.crt").ok())
            .and_then(|c| crate::crypto::x509::spki_sha256(&c[0]));
        ctx.lock.done(ca_hash.clone()).map_err(plain)?;
        Ok((kubeconfig, ca_hash))
    });
    remove_or_warn(ctx.root, INIT_CONFIG, "a kubeadm config");
    let (kubeconfig, ca_hash) = match result {
        Ok(x) => x,
        Err((e, tail)) => {
            let e = ctx.fatal(e);
            let mut b = exchange::error_body("init_failed", &e.to_string());
            if !tail.is_empty() {
                b["log_tail"] = tail.into();
            }
            answer(&mut s, &who, 500, b);
            return Conn::Fatal(e);
        }
    };
    ctx.stop.request();
    crate::info!(
        "init server: cluster {} initialized for {who}; answering with the admin kubeconfig",
        body.cluster_name
    );
    answer(
        &mut s,
        &who,
        200,
        serde_json::json!({"kubeconfig": kubeconfig, "cluster_name": body.cluster_name, "ca_cert_hash": ca_hash}),
    );
    Conn::Won(body.cluster_name)
}

/// 409 `already_activating`, naming what the node is now (or a still-fresh node that is
/// stopping: 503, ask again).
fn refuse_taken(ctx: &Ctx, asked: Asked) {
    let Asked { mut s, who, .. } = asked;
    if !ctx.lock.is_taken() {
        crate::info!("init server: init request from {who}: stopping, node still fresh; refused");
        let b = exchange::error_body(
            "stopping",
            "the node is stopping and still fresh; ask again",
        );
        return answer(&mut s, &who, 503, b);
    }
    let what = ctx.lock.describe();
    crate::info!(
        "init server: init request from {who}: the node is already activating ({what}); refused"
    );
    let b = exchange::error_body(
        "already_activating",
        &format!("the node is already activating: {what}"),
    );
    answer(&mut s, &who, 409, b);
}

/// Steps 2 to 4 of an init connection: read the request, check the init secret before any
/// field is looked at, then every other field. An error is (HTTP status, code, message).
fn init_request(
    ctx: &Ctx,
    s: &mut exchange::ServerStream,
    node_ip: Option<std::net::IpAddr>,
) -> std::result::Result<InitRequest, (u16, &'static str, String)> {
    let req = exchange::read_request(s).map_err(|e| (400, "bad_request", e.to_string()))?;
    if req.path != INIT_PATH || req.method != "POST" {
        let status = if req.path == INIT_PATH { 405 } else { 404 };
        let m = format!("{} {}: only POST {INIT_PATH}", req.method, req.path);
        return Err((status, "not_found", m));
    }
    let body: InitRequest = serde_json::from_slice(&req.body)
        .map_err(|e| (400, "invalid", format!("init request does not parse: {e}")))?;
    if !ctx.secret.matches(body.init_secret.as_bytes()) {
        return Err((403, "bad_secret", "wrong init secret".into()));
    }
    body.validate()
        .and_then(|()| match node_ip {
            Some(ip) => body.validate_for_node(ip),
            None => Ok(()),
        })
        .and_then(|()| ctx.names.check_version(&body.kubernetes_version))
        .map_err(|m| (400, "invalid", format!("init request: {m}")))?;
    Ok(body)
}

/// Step 5: kubeadm's config for the request, written where `kubeadm init` will read it (0600;
/// removed once the request is over), then, with --images, the check of the images kubeadm
/// lists under that very config. An error is (HTTP status, code, error); the node stays fresh.
fn prepare_init(ctx: &Ctx, r: &InitRequest) -> std::result::Result<(), (u16, &'static str, Error)> {
    let config = kubeadm::init_config(&InitSpec {
        cluster_name: &r.cluster_name,
        kubernetes_version: &r.kubernetes_version,
        pod_cidr: &r.pod_cidr,
        service_cidr: &r.service_cidr,
        sans: &r.apiserver_sans,
        control_plane_endpoint: r.control_plane_endpoint.as_deref(),
        images: &ctx.names,
    });
    ctx.root
        .write_atomic(INIT_CONFIG, config.as_bytes(), 0o600)
        .map_err(|e| (500, "init_failed", e))?;
    // A version this kubeadm cannot deploy, or a field it refuses, is the request's fault and
    // costs the node nothing; past the lock it would cost the node.
    kubeadm::validate(&ctx.a.kubeadm, &ctx.root.show(INIT_CONFIG))
        .map_err(|e| (400, "invalid", e))?;
    match &ctx.images {
        Some(images) => images
            .ready_for_init(INIT_CONFIG, &r.kubernetes_version)
            .map_err(|e| (503, "missing_images", e)),
        None => Ok(()),
    }
}

/// `kubeadm init` from a fresh manifests folder; the admin kubeconfig it wrote. On failure,
/// the error and the tail of kubeadm's output.
fn init_cluster(ctx: &Ctx, r: &InitRequest) -> std::result::Result<String, (Error, String)> {
    reset_manifests(ctx.root).map_err(plain)?;
    let argv = vec![
        ctx.a.kubeadm.clone(),
        "init".into(),
        "--config".into(),
        ctx.root.show(INIT_CONFIG),
        // Its default token would be printed: nothing here may carry one.
        "--skip-token-print".into(),
    ];
    crate::info!(
        "running kubeadm init for cluster {} ({})",
        r.cluster_name,
        r.kubernetes_version
    );
    let ran = kubeadm::run(&argv, Duration::from_secs(ctx.a.kubeadm_timeout)).map_err(plain)?;
    if !ran.ok {
        return Err((
            Error::failed(format!("kubeadm init: {}", ran.status)),
            ran.tail,
        ));
    }
    crate::info!("kubeadm init succeeded");
    let conf = ctx
        .root
        .read_text(ADMIN_CONF)
        .map_err(plain)?
        .ok_or_else(|| {
            plain(Error::failed(format!(
                "kubeadm init succeeded but left no {}",
                ctx.root.show(ADMIN_CONF)
            )))
        })?;
    Ok(conf)
}

/// An error without kubeadm output to go with it.
fn plain(e: Error) -> (Error, String) {
    (e, String::new())
}
