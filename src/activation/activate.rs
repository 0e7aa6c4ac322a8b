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

use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

use crate::activation::exchange::Endpoint;
use crate::activation::init_server::init_server;
use crate::activation::join_client::join_client;
use crate::activation::kubeadm::{self, ImageNames};
use crate::activation::nodelock::{self, State};
use crate::activation::racers::{Ctx, Side};
use crate::cli::{Activate, RebootMode};
use crate::error::{Error, Result};
use crate::net::oci;
use crate::node::reboot::Rebooter;
use crate::node::root::Root;
use crate::node::signals::{self, Stop};

pub fn run(a: &Activate) -> Result<()> {
    // 1. Options, before anything is read.
    let opts = options(a)?;
    let root = Root::open(&a.root)?;
    crate::node::temps::sweep(&root);
    let rebooter = crate::node::reboot::for_run(&root, a.reboot == RebootMode::Auto, false);
    // 2. Where this node stands: only a node without a marker is fresh.
    if !fresh(a, &root)? {
        return Ok(());
    }
    // 3. Inputs: the node's identity, both CAs, the init secret's hash; the image archives
    //    into containerd.
    let ctx = Ctx::load(a, &root, opts.endpoints, opts.names)?;
    import_images(&ctx)?;
    // 4. Listen.
    let listener = listen(a, &root, opts.listen)?;
    // 5. The race.
    let (init, join) = race(&ctx, &listener);
    // 6. The verdict.
    verdict(&ctx, [init, join], rebooter)
}

/// Step 1's findings: what the options say, checked.
struct Opts {
    listen: SocketAddr,
    endpoints: Vec<Endpoint>,
    names: ImageNames,
}

/// Step 1: every option checked before anything is read.
fn options(a: &Activate) -> Result<Opts> {
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
    Ok(Opts {
        listen,
        endpoints,
        names: image_names(a)?,
    })
}

/// Step 2: whether this node is fresh. A node whose activation is done only gets its kubelet
/// (false); one committed or reset is not fresh and is an error.
fn fresh(a: &Activate, root: &Root) -> Result<bool> {
    match nodelock::read(root)? {
        Some(m) if m.state == State::Done => {
            crate::info!(
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
            ensure_kubelet(a, root)?;
            summary(format_args!(
                "nodestrap: activate already done role={} cluster={}",
                m.role.as_str(),
                m.cluster
            ));
            return Ok(false);
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
            crate::info!(
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
    Ok(true)
}

/// Step 3's end: the image archives into containerd (`--images`).
fn import_images(ctx: &Ctx) -> Result<()> {
    if let Some(images) = &ctx.images {
        let n = images.import()?;
        crate::info!(
            "{n} image archive(s) from --images {} in containerd",
            ctx.root.show(images.dir)
        );
    }
    Ok(())
}

/// Step 4: the init server's socket.
fn listen(a: &Activate, root: &Root, listen: SocketAddr) -> Result<TcpListener> {
    let listener =
        TcpListener::bind(listen).map_err(|e| Error::failed(format!("--listen {listen}: {e}")))?;
    let bound = listener
        .local_addr()
        .map(|l| l.to_string())
        .unwrap_or_else(|_| a.listen.clone());
    crate::info!(
        "init server listening on {bound}: clients need a certificate from {}",
        root.show(&a.admin_ca)
    );
    Ok(listener)
}

/// Step 5: the two racers, init server and join client. The supervisor turns SIGTERM into a
/// stop: the init server finishes an init in flight first, the join client stops between
/// rounds.
fn race(ctx: &Ctx, listener: &TcpListener) -> (Result<Side>, Result<Side>) {
    signals::catch_sigterm();
    std::thread::scope(|s| {
        let i = s.spawn(|| racer(ctx, || init_server(ctx, listener)));
        let j = s.spawn(|| racer(ctx, || join_client(ctx)));
        while !(i.is_finished() && j.is_finished()) {
            if signals::signalled() && !ctx.stop.requested() {
                crate::info!("stop signal: stopping once any init in flight has finished");
                ctx.stop.request();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let panicked = |_| Err(Error::failed("a racer thread panicked"));
        (
            i.join().unwrap_or_else(panicked),
            j.join().unwrap_or_else(panicked),
        )
    })
}

/// Step 6: the verdict. A win stands whatever the other side ended with (it never held the
/// lock); a failure before the lock leaves the node fresh; one after it resets the node and
/// asks for a reboot.
fn verdict(ctx: &Ctx, sides: [Result<Side>; 2], rebooter: Box<dyn Rebooter>) -> Result<()> {
    let mut won = None;
    let mut errors = Vec::new();
    for side in sides {
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
            crate::warn!("the other side failed, after this node was activated: {e}");
        }
        summary(format_args!(
            "nodestrap: activate done role={} via={via} cluster={cluster}",
            role.as_str()
        ));
        return Ok(());
    }
    let Some(e) = errors.next() else {
        crate::info!("stopped before activation: the node is still fresh");
        summary(format_args!(
            "nodestrap: activate stopped; node still fresh"
        ));
        return Ok(());
    };
    for other in errors {
        crate::error!("the other side failed too: {other}");
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
            crate::error!("could not record the reset: {r}");
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
            crate::info!("kubelet started by --kubelet-command");
        }
        None if root.is_host() => {
            let job = crate::node::dbus::systemd_start("kubelet.service")?;
            crate::info!("kubelet.service started through systemd (job {job})");
        }
        None => crate::info!("--root is not /: the kubelet is left alone (no --kubelet-command)"),
    }
    Ok(())
}

/// The summary line on stdout. The node's state is already decided when it is written: a
/// stdout that went away is logged, and changes neither the outcome nor the exit code.
fn summary(line: std::fmt::Arguments) {
    if let Err(e) = crate::output::line(line) {
        crate::warn!("{e}");
    }
}
