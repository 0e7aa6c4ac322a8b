//! `nodestrap activate`: a fresh node either initializes a cluster or joins one, never both,
//! never twice (Constellation's bootstrapper state machine, over JSON and mutual TLS).
//!
//! Two racers run in one process: the init server (an admin's `POST /v1/init`, client
//! certificate from the admin CA, init secret checked against the node's hash) and the join
//! client (polls join services for a ticket, presenting the node's identity and trusting only
//! the pinned cluster CA). Whichever has every input authenticated and validated first takes
//! the node lock, whose `committed` marker is durable before anything changes on the node.
//! Before the lock every error is answered or retried, and a racer that cannot go on ends the
//! run with exit 1, the node still fresh, for systemd to start again; after it every error is
//! fatal: the marker goes to `reset`, the failure is reported (to the admin too), and the node
//! reboots.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::{ClientConfig, ServerConfig};

use crate::activation::exchange::{self, Endpoint};
use crate::activation::images::Images;
use crate::activation::init_secret::SecretHash;
use crate::activation::kubeadm::{self, ImageNames, InitSpec, JoinSpec};
use crate::activation::mtls;
use crate::activation::nodelock::{self, NodeLock, Role, State};
use crate::activation::wire::{InitRequest, Ticket, INIT_PATH, TICKET_PATH};
use crate::cli::{Activate, RebootMode};
use crate::error::{Error, Result};
use crate::net::oci;
use crate::node::root::Root;
use crate::node::signals::{self, Stop};

const MANIFESTS: &str = "/etc/kubernetes/manifests";
const ADMIN_CONF: &str = "/etc/kubernetes/admin.conf";
const PKI: &str = "/etc/kubernetes/pki";
/// kubeadm configs live in /run (tmpfs) only while kubeadm runs; the join one holds the token.
const INIT_CONFIG: &str = "/run/nodestrap/kubeadm-init.yaml";
const JOIN_CONFIG: &str = "/run/nodestrap/kubeadm-join.yaml";

/// What one racer ended with. Errors are only the fatal ones, after the node lock.
enum Side {
    /// This side holds the node: its role, the way it got it (`init`, `join`), the cluster.
    Won {
        role: Role,
        via: &'static str,
        cluster: String,
    },
    Lost,
    Stopped,
}

/// Everything both racers share, loaded and checked before the first connection.
struct Ctx<'a> {
    a: &'a Activate,
    root: &'a Root,
    lock: NodeLock<'a>,
    stop: Stop,
    secret: SecretHash,
    server: Arc<ServerConfig>,
    client: Arc<ClientConfig>,
    /// SPKI hash of the pinned cluster CA.
    pinned: String,
    endpoints: Vec<Endpoint>,
    /// --images: where the images kubeadm runs come from.
    images: Option<Images<'a>>,
    /// What kubeadm is to call those images, and the addons it leaves out.
    names: ImageNames,
}

pub fn run(a: &Activate) -> Result<()> {
    // 1. Options, before anything is read.
    let listen: SocketAddr = a
        .listen
        .parse()
        .map_err(|_| Error::config(format!("--listen {:?}: expected ADDRESS:PORT", a.listen)))?;
    let mut endpoints = Vec::new();
    for e in a
        .join_endpoints
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
    {
        endpoints.push(Endpoint::parse(e, "--join-endpoints")?);
    }
    for (flag, v) in [
        ("--join-interval", a.join_interval),
        ("--join-timeout", a.join_timeout),
        ("--join-budget", a.join_budget),
        ("--kubeadm-timeout", a.kubeadm_timeout),
        ("--join-attempts", u64::from(a.join_attempts)),
    ] {
        if v == 0 {
            return Err(Error::config(format!("{flag} 0: must be at least 1")));
        }
    }
    if a.kubeadm.is_empty() {
        return Err(Error::config("--kubeadm: empty"));
    }
    let names = image_names(a)?;
    let root = Root::open(&a.root)?;
    crate::node::temps::sweep(&root);
    let rebooter = crate::node::reboot::for_run(&root, a.reboot == RebootMode::Auto, false);

    // 2. Where this node stands: only a node without a marker is fresh.
    match nodelock::read(&root)? {
        Some(m) if m.state == State::Done => {
            log::info!(
                "node state done in {} ({} of cluster {}, {}): only making sure the kubelet runs",
                root.show(nodelock::STATE_PATH),
                m.role.as_str(),
                m.cluster,
                m.source
            );
            crate::node::status::decide(
                "node-state",
                "done",
                format_args!("{} ({})", root.show(nodelock::STATE_PATH), m.source),
            );
            ensure_kubelet(a, &root)?;
            summary(format_args!(
                "nodestrap: activate already done role={} cluster={}",
                m.role.as_str(),
                m.cluster
            ));
            return Ok(());
        }
        Some(m) => {
            return Err(Error::config(format!(
                "{}: node state {} ({} of cluster {}, {}{}): this node is not fresh and will not \
                 init or join again; reprovision it",
                root.show(nodelock::STATE_PATH),
                if m.state == State::Reset {
                    "reset"
                } else {
                    "committed"
                },
                m.role.as_str(),
                m.cluster,
                m.source,
                m.reason
                    .map(|r| format!(", failed: {r}"))
                    .unwrap_or_default()
            )))
        }
        None => {
            log::info!(
                "no node state in {}: a fresh node",
                root.show(nodelock::STATE_PATH)
            );
            crate::node::status::decide(
                "node-state",
                "fresh",
                format_args!("no {}", root.show(nodelock::STATE_PATH)),
            );
        }
    }

    // 3. Inputs: the node's identity, both CAs, the init secret's hash; the image archives
    //    into containerd.
    let ctx = Ctx::load(a, &root, endpoints, names)?;
    if let Some(images) = &ctx.images {
        let n = images.import()?;
        log::info!(
            "{n} image archive(s) from --images {} in containerd",
            root.show(images.dir)
        );
    }

    // 4. Listen.
    let listener =
        TcpListener::bind(listen).map_err(|e| Error::failed(format!("--listen {listen}: {e}")))?;
    let bound = listener
        .local_addr()
        .map(|l| l.to_string())
        .unwrap_or_else(|_| a.listen.clone());
    log::info!(
        "init server listening on {bound}: clients need a certificate from {}",
        root.show(&a.admin_ca)
    );

    // 5. The race. The supervisor turns SIGTERM into a stop: the init server finishes an init
    //    in flight first, the join client stops between rounds.
    signals::catch_sigterm();
    let (init, join) = std::thread::scope(|s| {
        let i = s.spawn(|| racer(&ctx, || init_server(&ctx, &listener)));
        let j = s.spawn(|| racer(&ctx, || join_client(&ctx)));
        while !(i.is_finished() && j.is_finished()) {
            if signals::signalled() && !ctx.stop.requested() {
                log::info!("stop signal: stopping once any init in flight has finished");
                ctx.stop.request();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let panicked = |_| Err(Error::failed("a racer thread panicked"));
        (
            i.join().unwrap_or_else(panicked),
            j.join().unwrap_or_else(panicked),
        )
    });

    // 6. The verdict. A win stands whatever the other side ended with (it never held the lock).
    let mut won = None;
    let mut errors = Vec::new();
    for side in [init, join] {
        match side {
            Ok(Side::Won { role, via, cluster }) => won = Some((role, via, cluster)),
            Ok(Side::Lost | Side::Stopped) => {}
            Err(e) => errors.push(e),
        }
    }
    let mut errors = errors.into_iter();
    if let Some((role, via, cluster)) = won {
        crate::node::status::decide(
            "role",
            role.as_str(),
            format_args!("{via}, cluster {cluster}"),
        );
        for e in errors {
            log::warn!("the other side failed, after this node was activated: {e}");
        }
        summary(format_args!(
            "nodestrap: activate done role={} via={via} cluster={cluster}",
            role.as_str()
        ));
        return Ok(());
    }
    let Some(e) = errors.next() else {
        log::info!("stopped before activation: the node is still fresh");
        summary(format_args!(
            "nodestrap: activate stopped; node still fresh"
        ));
        return Ok(());
    };
    for other in errors {
        log::error!("the other side failed too: {other}");
    }
    if !ctx.lock.is_taken() {
        // Nothing on the node changed: exit 1, and systemd starts a fresh attempt.
        summary(format_args!(
            "nodestrap: activate failed before the node lock; node still fresh"
        ));
        return Err(e);
    }
    // Past the lock. A racer that panicked there never recorded the reset.
    if ctx.lock.state() != Some(State::Reset) {
        if let Err(r) = ctx.lock.reset(&e.to_string()) {
            log::error!("could not record the reset: {r}");
        }
    }
    summary(format_args!(
        "nodestrap: activate failed after the node lock; the node must be reprovisioned"
    ));
    // The error itself is logged once, by the caller, with the exit code.
    let why = "activation failed after the node lock (node state reset)";
    match rebooter.reboot(why) {
        Ok(()) => Err(e),
        Err(r) => Err(e.context(format!("and the reboot failed ({r})"))),
    }
}

/// Run one racer. When it fails or panics the other one is asked to stop too (between
/// requests or rounds: work under the lock always finishes), so the process ends and reports.
fn racer(ctx: &Ctx, f: impl FnOnce() -> Result<Side>) -> Result<Side> {
    struct OnPanic<'a>(&'a Stop);
    impl Drop for OnPanic<'_> {
        fn drop(&mut self) {
            if std::thread::panicking() {
                self.0.request();
            }
        }
    }
    let _guard = OnPanic(&ctx.stop);
    let r = f();
    if r.is_err() {
        ctx.stop.request();
    }
    r
}

impl<'a> Ctx<'a> {
    fn load(
        a: &'a Activate,
        root: &'a Root,
        endpoints: Vec<Endpoint>,
        names: ImageNames,
    ) -> Result<Ctx<'a>> {
        let show = |p: &str| root.show(p);
        let id = mtls::load_identity(
            root,
            ("--identity-cert", &a.identity_cert),
            ("--identity-key", &a.identity_key),
        )?;
        let admin_ca = mtls::load_certs(root, "--admin-ca", &a.admin_ca)?;
        let cluster_ca = mtls::load_certs(root, "--cluster-ca", &a.cluster_ca)?;
        let pinned = crate::crypto::x509::spki_sha256(&cluster_ca[0]).ok_or_else(|| {
            Error::config(format!(
                "{}: certificate does not parse",
                show(&a.cluster_ca)
            ))
        })?;
        let hash_text = mtls::read_pem(root, "--init-secret-hash", &a.init_secret_hash)?;
        let secret = SecretHash::parse(
            &String::from_utf8_lossy(&hash_text),
            &show(&a.init_secret_hash),
        )?;
        let me = mtls::peer(&id.chain[0]).ok_or_else(|| {
            Error::config(format!(
                "{}: certificate does not parse",
                show(&a.identity_cert)
            ))
        })?;
        log::info!(
            "node identity {} ({}) from {}",
            me.cn,
            me.spki,
            show(&a.identity_cert)
        );
        log::info!("cluster CA pinned from {}: {pinned}", show(&a.cluster_ca));
        Ok(Ctx {
            server: mtls::server_config(&id, &admin_ca, &show(&a.identity_cert))?,
            client: mtls::client_config(&cluster_ca, &id, &show(&a.identity_cert))?,
            a,
            root,
            lock: NodeLock::new(root),
            stop: Stop::default(),
            secret,
            pinned,
            endpoints,
            images: match &a.images {
                Some(dir) => Some(Images {
                    root,
                    dir,
                    ctr: kubeadm::argv(&a.ctr, "--ctr")?,
                    kubeadm: &a.kubeadm,
                }),
                None => None,
            },
            names,
        })
    }

    /// Past the lock: record `reset`, stop the other side, hand the error on.
    fn fatal(&self, e: Error) -> Error {
        if let Err(r) = self.lock.reset(&e.to_string()) {
            log::error!("could not record the reset: {r}");
        }
        self.stop.request();
        e
    }
}

// ---------------------------------------------------------------------------------------------
// The init server

enum Conn {
    Next,
    Won(String),
    Fatal(Error),
}

fn init_server(ctx: &Ctx, listener: &TcpListener) -> Result<Side> {
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
        log::warn!("init server: answering {who}: {e}");
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
            log::warn!("init server: refused a connection from {addr}: {e}; node lock untouched");
            return None;
        }
    };
    let who = format!("{} at {addr}", peer.cn);
    match init_request(ctx, &mut s, node_ip) {
        Ok(body) => Some(Asked { s, who, body }),
        Err((status, code, m)) => {
            log::warn!("init server: request from {who} refused, node lock untouched: {m}");
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
        log::error!("init server: init request from {who}: {e}");
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
    log::info!(
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
        log::info!("init server: init request from {who}: stopping, node still fresh; refused");
        let b = exchange::error_body(
            "stopping",
            "the node is stopping and still fresh; ask again",
        );
        return answer(&mut s, &who, 503, b);
    }
    let what = ctx.lock.describe();
    log::info!(
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
    let shown = ctx.root.show(INIT_CONFIG);
    kubeadm::validate(&ctx.a.kubeadm, &shown, &shown).map_err(|e| (400, "invalid", e))?;
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
    log::info!(
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
    log::info!("kubeadm init succeeded");
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

/// `--image-repository`, `--etcd-image-tag`, `--skip-addons`: image names as container tools
/// read them, so kubeadm's config holds nothing it would refuse.
fn image_names(a: &Activate) -> Result<ImageNames> {
    if let Some(r) = a
        .image_repository
        .as_deref()
        .filter(|r| !oci::image_repository(r))
    {
        return Err(Error::config(format!(
            "--image-repository {r:?}: expected [HOST[:PORT]/]PATH of lowercase letters, digits, . _ -"
        )));
    }
    if let Some(t) = a.etcd_image_tag.as_deref().filter(|t| !oci::image_tag(t)) {
        return Err(Error::config(format!(
            "--etcd-image-tag {t:?}: expected an image tag ([A-Za-z0-9_][A-Za-z0-9._-], at most 128)"
        )));
    }
    Ok(ImageNames {
        repository: a.image_repository.clone(),
        etcd_tag: a.etcd_image_tag.clone(),
        skip: a.skip_addons,
    })
}

/// An error without kubeadm output to go with it.
fn plain(e: Error) -> (Error, String) {
    (e, String::new())
}

/// Remove a file we wrote for kubeadm; failing that, say so (`what` it holds) and go on.
fn remove_or_warn(root: &Root, node_path: &str, what: &str) {
    if let Err(e) = root.remove(node_path) {
        log::warn!(
            "{}: could not remove it, and it holds {what}: {e}",
            root.show(node_path)
        );
    }
}

/// An empty manifests folder: what a previous attempt left must not confuse kubeadm.
fn reset_manifests(root: &Root) -> Result<()> {
    let parent = root.make_dir("/etc/kubernetes")?;
    if parent.remove_dir_tree("manifests")? {
        log::info!("emptied {}", root.show(MANIFESTS));
    }
    root.make_dir(MANIFESTS)?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The join client

fn join_client(ctx: &Ctx) -> Result<Side> {
    let interval = Duration::from_secs(ctx.a.join_interval);
    if ctx.endpoints.is_empty() {
        log::info!("join client off: no --join-endpoints");
    }
    let mut asked_later: Vec<Option<Instant>> = vec![None; ctx.endpoints.len()];
    loop {
        if ctx.lock.is_taken() {
            log::info!("join client: init has the node lock; not joining");
            return Ok(Side::Lost);
        }
        if ctx.stop.requested() {
            return Ok(Side::Stopped);
        }
        // Each pause is random between half and one and a half intervals: a fleet that boots
        // together does not come back to the join services in waves.
        let pause = interval.mul_f64(0.5 + crate::crypto::random::fraction());
        for (ep, not_before) in ctx.endpoints.iter().zip(asked_later.iter_mut()) {
            // A join service that said when to ask again (Retry-After) is not asked sooner.
            if not_before.is_some_and(|t| Instant::now() < t) {
                continue;
            }
            match request_ticket(ctx, ep) {
                Ok(t) => return join_with(ctx, ep, t),
                Err((e, None)) => log::warn!(
                    "join client: {e}; asking again in {:.1} s",
                    pause.as_secs_f64()
                ),
                Err((e, Some(after))) => {
                    let after = after.min(LONGEST_RETRY_AFTER);
                    *not_before = Some(Instant::now() + after);
                    log::warn!(
                        "join client: {e}; {} asks to wait {} s (Retry-After): asking it again \
                         in {:.1} s",
                        ep.url,
                        after.as_secs(),
                        pause.max(after).as_secs_f64()
                    )
                }
            }
            if ctx.lock.is_taken() || ctx.stop.requested() {
                break;
            }
        }
        if ctx.endpoints.is_empty() {
            ctx.stop.sleep(Duration::from_secs(3600));
        } else {
            ctx.stop.sleep(pause);
        }
    }
}

/// A join service's `Retry-After` is honoured up to this: a value beyond it (a misconfigured
/// service) must not keep a node from asking it for days.
const LONGEST_RETRY_AFTER: Duration = Duration::from_secs(3600);

/// One ticket call, bounded by --join-timeout; the ticket only if it is valid in every part.
/// No ticket: why, and how long the service asked to be left alone (its `Retry-After`).
fn request_ticket(
    ctx: &Ctx,
    ep: &Endpoint,
) -> std::result::Result<Ticket, (Error, Option<Duration>)> {
    let t = Duration::from_secs(ctx.a.join_timeout);
    let a = exchange::post(&ctx.client, ep, None, TICKET_PATH, b"{}", t, t)
        .map_err(|e| (e.into_error(), None))?;
    if a.status != 200 {
        let (_, msg) = exchange::answer_error(a.status, &a.body);
        return Err((
            Error::failed(format!("ticket from {}: {msg}", ep.url)),
            a.retry_after,
        ));
    }
    let failed = |m: String| (Error::failed(format!("ticket from {}: {m}", ep.url)), None);
    let ticket: Ticket =
        serde_json::from_slice(&a.body).map_err(|e| failed(format!("does not parse: {e}")))?;
    ticket
        .validate(&ctx.pinned)
        .map_err(|m| failed(format!("{m}; refused")))?;
    log::info!(
        "join client: ticket from {}: {} of cluster {} via API server {}",
        ep.url,
        ticket.role.as_str(),
        ticket.cluster_name,
        ticket.api_server_endpoint
    );
    Ok(ticket)
}

fn join_with(ctx: &Ctx, ep: &Endpoint, t: Ticket) -> Result<Side> {
    // 1. The node lock.
    let source = format!("ticket from {}", ep.url);
    match ctx.lock.try_lock(
        t.role,
        &t.cluster_name,
        Some(&t.discovery_token_ca_cert_hash),
        &source,
    ) {
        Ok(true) => {}
        Ok(false) => {
            log::info!("join client: a ticket arrived but init has the node lock; not joining");
            return Ok(Side::Lost);
        }
        Err(e) => return Err(ctx.fatal(e)),
    }
    match join_cluster(ctx, &t).and_then(|()| ctx.lock.done(None)) {
        Ok(()) => {
            ctx.stop.request();
            Ok(Side::Won {
                role: t.role,
                via: "join",
                cluster: t.cluster_name,
            })
        }
        Err(e) => Err(ctx.fatal(e)),
    }
}

/// Join steps 2 to 4: control-plane keys into place; the JoinConfiguration; `kubeadm join`, up to
/// `--join-attempts` times within `--join-budget`, from a fresh manifests folder each time. A
/// join that fails for good takes the ticket's files away again: the cluster CA keys must not
/// stay on a node that is being given up.
fn join_cluster(ctx: &Ctx, t: &Ticket) -> Result<()> {
    let mut written = Vec::new();
    let r = place_and_join(ctx, t, &mut written);
    if r.is_err() && !written.is_empty() {
        for p in &written {
            remove_or_warn(ctx.root, p, "a cluster key or certificate from the ticket");
        }
        log::info!(
            "join failed: removed the {} control-plane files of the ticket from {}",
            written.len(),
            ctx.root.show(PKI)
        );
    }
    r
}

fn place_and_join(ctx: &Ctx, t: &Ticket, written: &mut Vec<String>) -> Result<()> {
    for f in &t.control_plane_files {
        let mode = if f.name.ends_with(".key") {
            0o600
        } else {
            0o644
        };
        let p = format!("{PKI}/{}", f.name);
        // Listed before the write, which can fail after its rename (syncing the folder).
        written.push(p.clone());
        ctx.root.write_atomic(&p, f.data.as_bytes(), mode)?;
    }
    if !t.control_plane_files.is_empty() {
        log::info!(
            "wrote {} control-plane files from the ticket into {}",
            t.control_plane_files.len(),
            ctx.root.show(PKI)
        );
    }
    let config = kubeadm::join_config(&JoinSpec {
        api_server_endpoint: &t.api_server_endpoint,
        token: &t.token,
        ca_cert_hash: &t.discovery_token_ca_cert_hash,
        role: t.role,
        kubernetes_version: t.kubernetes_version.as_deref(),
    });
    ctx.root
        .write_atomic(JOIN_CONFIG, config.as_bytes(), 0o600)?;
    let r = join_attempts(ctx, t);
    remove_or_warn(ctx.root, JOIN_CONFIG, "the bootstrap token");
    r
}

fn join_attempts(ctx: &Ctx, t: &Ticket) -> Result<()> {
    let budget = Duration::from_secs(ctx.a.join_budget);
    let start = Instant::now();
    let argv = vec![
        ctx.a.kubeadm.clone(),
        "join".into(),
        "--config".into(),
        ctx.root.show(JOIN_CONFIG),
    ];
    let mut last = String::new();
    let mut n = 0;
    while n < ctx.a.join_attempts {
        let left = budget.saturating_sub(start.elapsed());
        if left.is_zero() {
            break;
        }
        n += 1;
        reset_manifests(ctx.root)?;
        log::info!(
            "running kubeadm join as {} via {} (attempt {n}/{}, {} s of the budget left)",
            t.role.as_str(),
            t.api_server_endpoint,
            ctx.a.join_attempts,
            left.as_secs()
        );
        last = match kubeadm::run(&argv, left.min(Duration::from_secs(ctx.a.kubeadm_timeout))) {
            Ok(r) if r.ok => {
                log::info!("kubeadm join succeeded");
                return Ok(());
            }
            Ok(r) => format!("{}: {}", r.status, kubeadm::last_lines(&r.tail, 3)),
            Err(e) => e.to_string(),
        };
        log::warn!(
            "kubeadm join attempt {n}/{} failed: {last}",
            ctx.a.join_attempts
        );
    }
    Err(Error::failed(format!(
        "kubeadm join failed {n} times within {} s: {last}",
        budget.as_secs()
    )))
}

// ---------------------------------------------------------------------------------------------

/// On an activated node: the kubelet must run (kubeadm enabled it; a reboot may need it started).
fn ensure_kubelet(a: &Activate, root: &Root) -> Result<()> {
    match &a.kubelet_command {
        Some(cmd) => {
            let r = kubeadm::run(
                &kubeadm::argv(cmd, "--kubelet-command")?,
                Duration::from_secs(120),
            )?;
            if !r.ok {
                return Err(Error::failed(format!(
                    "--kubelet-command: {}: {}",
                    r.status,
                    kubeadm::last_lines(&r.tail, 3)
                )));
            }
            log::info!("kubelet started by --kubelet-command");
        }
        None if root.is_host() => {
            let job = crate::node::dbus::systemd_start("kubelet.service")?;
            log::info!("kubelet.service started through systemd (job {job})");
        }
        None => log::info!("--root is not /: the kubelet is left alone (no --kubelet-command)"),
    }
    Ok(())
}

/// The summary line on stdout. The node's state is already decided when it is written: a
/// stdout that went away is logged, and changes neither the outcome nor the exit code.
fn summary(line: std::fmt::Arguments) {
    if let Err(e) = crate::output::line(line) {
        log::warn!("{e}");
    }
}
