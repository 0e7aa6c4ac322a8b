//! `nodestrap join-service`: hands join tickets to nodes, in the cluster (a DaemonSet on the
//! control-plane nodes). A node is authenticated by its client certificate, which the
//! node-provisioning CA issued; its identity is the certificate's public key hash, its role the
//! certificate's organisation (`nodestrap:control-plane`, else worker). Each identity keeps at
//! most one ticket, ever, from all instances together: the ledger (ledger/) records it
//! durably before the ticket leaves, and for good once the node says it keeps it. Tokens and
//! keys are never logged.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use rustls::ServerConfig;

use crate::activation::appointments::{Book, Turn};
use crate::activation::exchange;
use crate::activation::kubeadm;
use crate::activation::ledger::{self, Claim, ClusterLedger, FileLedger, Keep, Ledger};
use crate::activation::mtls::{self, Peer};
use crate::activation::nodelock::Role;
use crate::activation::wire::{
    self, File, Ticket, TicketRequest, CONTROL_PLANE_FILES, KEPT_PATH, TICKET_PATH,
};
use crate::cli::JoinService;
use crate::error::{Error, Result};
use crate::net::kube;
use crate::net::retry::Retry;
use crate::node::root::Root;
use crate::node::signals;

/// The certificate organisation that makes a node a control plane.
const CONTROL_PLANE_ORG: &str = "nodestrap:control-plane";

/// What a node asked to come back later is told to wait, at least: the ledger's API server
/// was busy or down (or this instance is stopping).
const TRY_LATER: u64 = 10;

/// The API client serving nodes: a ledger call gives up within this, so that a node waiting on
/// an API server that is down gets "try later" well within its own --join-timeout.
const LEDGER_CALL_BUDGET: Duration = Duration::from_secs(5);
/// At start, the API server may itself be starting (a control-plane node that boots).
const LEDGER_START_BUDGET: Duration = Duration::from_secs(120);

struct Svc<'a> {
    a: &'a JoinService,
    root: &'a Root,
    server: std::sync::Arc<rustls::ServerConfig>,
    discovery_hash: String,
    token_cmd: Vec<String>,
    ledger: Ledger<'a>,
    /// Slots for the nodes that come faster than tickets are made.
    book: Book,
}

pub fn run(a: &JoinService) -> Result<()> {
    // 1. Options.
    let (listen, token_cmd, instance) = options(a)?;
    let root = Root::open(&a.root)?;
    // 2. Inputs: serving identity, node CA, cluster CA (its hash goes into every ticket), the
    //    record of tickets already issued.
    let mut svc = load(a, &root, &instance, token_cmd)?;
    // 3. Listen.
    let listener = bind(a, &svc, listen, &instance)?;
    // 4. Serve, one node at a time (each takes milliseconds plus the token command), until
    //    SIGTERM; a request being handled finishes first.
    serve(&mut svc, &listener)?;
    svc.ledger.flush();
    crate::info!("join service stopped by signal");
    Ok(())
}

/// Step 1: the options, checked; the address to listen on, the token command, this instance's
/// name.
fn options(a: &JoinService) -> Result<(SocketAddr, Vec<String>, String)> {
    let listen: SocketAddr = a
        .listen
        .parse()
        .map_err(|_| Error::config(format!("--listen {:?}: expected ADDRESS:PORT", a.listen)))?;
    if !wire::host_port(&a.api_server_endpoint) {
        return Err(Error::config(format!(
            "--api-server-endpoint {:?}: expected HOST:PORT",
            a.api_server_endpoint
        )));
    }
    wire::check_cluster_name(&a.cluster_name).map_err(|m| Error::config(wire::as_flag(&m)))?;
    if let Some(v) = a
        .kubernetes_version
        .as_deref()
        .filter(|v| !wire::k8s_version(v))
    {
        return Err(Error::config(format!(
            "--kubernetes-version {v:?}: expected vMAJOR.MINOR.PATCH"
        )));
    }
    let token_cmd = kubeadm::argv(&a.token_command, "--token-command")?;
    if a.token_timeout == 0 {
        return Err(Error::config("--token-timeout 0: must be at least 1"));
    }
    Ok((listen, token_cmd, instance_name(a.instance.as_deref())?))
}

/// Step 2: what the service serves with, loaded and checked.
fn load<'a>(
    a: &'a JoinService,
    root: &'a Root,
    instance: &str,
    token_cmd: Vec<String>,
) -> Result<Svc<'a>> {
    let show = |p: &str| root.show(p);
    let id = mtls::load_identity(root, ("--cert", &a.cert), ("--key", &a.key))?;
    let node_ca = mtls::load_certs(root, "--node-ca", &a.node_ca)?;
    let cluster_ca = mtls::load_certs(root, "--cluster-ca", &a.cluster_ca)?;
    let discovery_hash = crate::crypto::x509::spki_sha256(&cluster_ca[0]).ok_or_else(|| {
        Error::config(format!(
            "{}: certificate does not parse",
            show(&a.cluster_ca)
        ))
    })?;
    let ledger = open_ledger(a, root, instance)?;
    crate::info!(
        "cluster CA {} gives the discovery hash {discovery_hash}",
        show(&a.cluster_ca)
    );
    crate::node::status::decide("ledger", ledger.describe(), "--ledger");
    crate::node::status::decide(
        "discovery-hash",
        &discovery_hash,
        format_args!("the cluster CA {}", show(&a.cluster_ca)),
    );
    Ok(Svc {
        server: mtls::server_config(&id, &node_ca, &show(&a.cert))?,
        a,
        root,
        discovery_hash,
        token_cmd,
        ledger,
        book: Book::default(),
    })
}

/// Step 3: the listening socket.
fn bind(a: &JoinService, svc: &Svc, listen: SocketAddr, instance: &str) -> Result<TcpListener> {
    let show = |p: &str| svc.root.show(p);
    let listener =
        TcpListener::bind(listen).map_err(|e| Error::failed(format!("--listen {listen}: {e}")))?;
    let bound = listener
        .local_addr()
        .map(|l| l.to_string())
        .unwrap_or_default();
    crate::info!(
        "join service {instance} listening on {bound}: nodes need a certificate from {}; \
         tickets recorded in {}",
        show(&a.node_ca),
        svc.ledger.describe()
    );
    Ok(listener)
}

/// Step 4: tickets until SIGTERM; a node that asks while the service stops is told to come back.
fn serve(svc: &mut Svc, listener: &TcpListener) -> Result<()> {
    signals::catch_sigterm();
    let server = svc.server.clone();
    exchange::serve(
        listener,
        signals::signalled,
        |tcp, addr| preauth(&server, tcp, addr),
        |asked| {
            svc.answer(asked);
            true
        },
        |mut asked: Asked| {
            // Stopping: no ticket is spent now; the node asks again (another service, or this
            // one once it is back).
            let b = exchange::error_body("stopping", "the join service is stopping; ask again");
            if let Err(e) = exchange::respond_later(&mut asked.s, &b, TRY_LATER) {
                crate::warn!("{}: answering: {e}", asked.who);
            }
        },
    )
}

/// `--instance`, else `NODE_NAME` (the DaemonSet's downward API), else the host name.
fn instance_name(flag: Option<&str>) -> Result<String> {
    let (name, from) = match flag {
        Some(f) => (f.to_string(), "--instance"),
        None => match std::env::var("NODE_NAME").ok().filter(|n| !n.is_empty()) {
            Some(n) => (n, "NODE_NAME"),
            None => (
                std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .map(|h| h.trim().to_string())
                    .unwrap_or_default(),
                "the host name",
            ),
        },
    };
    if name.is_empty() || name.len() > 253 || name.chars().any(|c| c.is_control()) {
        return Err(Error::config(format!(
            "{from} {name:?}: not an instance name (1 to 253 printable characters)"
        )));
    }
    Ok(name)
}

/// The ledger `--ledger` names, checked before anything is served.
fn open_ledger<'r>(a: &JoinService, root: &'r Root, instance: &str) -> Result<Ledger<'r>> {
    match a.ledger {
        crate::cli::Ledger::File => Ok(Ledger::File(FileLedger::open(
            root,
            &a.state,
            a.retry_window,
        )?)),
        crate::cli::Ledger::Cluster => {
            let pod = Root::open(std::path::Path::new("/"))?;
            let client = |retry| kube::api_client(a.kubeconfig.as_deref(), &pod, retry);
            let startup = client(
                Retry::exponential(u32::MAX, Duration::from_secs(1)).within(LEDGER_START_BUDGET),
            )?;
            let serving = client(
                Retry::exponential(3, Duration::from_millis(200))
                    .capped_at(Duration::from_secs(2))
                    .within(LEDGER_CALL_BUDGET),
            )?;
            // A claim is in flight as long as a ticket can take: the token command, the answer.
            let lease =
                a.token_timeout + exchange::PREAUTH_TIMEOUT.as_secs() + ledger::LEASE_MARGIN;
            let l = ClusterLedger::open(
                &startup,
                serving,
                &a.ledger_namespace,
                instance,
                lease,
                a.retry_window,
            )?;
            l.carry(root, &a.state)?;
            Ok(Ledger::Cluster(Box::new(l)))
        }
    }
}

/// The role a node's certificate asks for: its organisation.
fn role_of(peer: &Peer) -> Role {
    match peer.orgs.iter().any(|o| o == CONTROL_PLANE_ORG) {
        true => Role::ControlPlane,
        false => Role::Worker,
    }
}

/// A node that passed its handshake with a well-formed request.
struct Asked {
    s: exchange::ServerStream,
    peer: Peer,
    who: String,
    wants: Wants,
    /// The node's run, from its request (`TicketRequest::session`).
    session: Option<String>,
    /// When it was through its pre-authentication, ready for its turn.
    ready: std::time::Instant,
}

/// What a node asks for.
#[derive(Clone, Copy)]
enum Wants {
    /// `POST /v1/ticket`
    Ticket,
    /// `POST /v1/ticket/kept`: its node lock is durable, the ticket it got is final.
    Kept,
}

/// Before anything is spent, in the connection's own thread: the handshake (the node's
/// certificate must come from the node-provisioning CA), then the request, which must be
/// `POST /v1/ticket` or `POST /v1/ticket/kept` with a well-formed body. Anything else is
/// answered here and goes no further: a malformed request never costs a ticket.
fn preauth(server: &Arc<ServerConfig>, tcp: TcpStream, addr: SocketAddr) -> Option<Asked> {
    let (mut s, peer) = match exchange::accept(tcp, server, exchange::PREAUTH_TIMEOUT) {
        Ok(x) => x,
        Err(e) => {
            crate::warn!("refused a connection from {addr}: {e}");
            return None;
        }
    };
    let who = format!("node {} ({}) at {addr}", peer.cn, peer.spki);
    let wants = |r: &exchange::Request| match (r.method.as_str(), r.path.as_str()) {
        ("POST", TICKET_PATH) => Some(Wants::Ticket),
        ("POST", KEPT_PATH) => Some(Wants::Kept),
        _ => None,
    };
    let refusal = match exchange::read_request(&mut s) {
        Err(e) => (400, exchange::error_body("bad_request", &e.to_string())),
        Ok(r) => match (wants(&r), TicketRequest::parse(&r.body)) {
            (None, _) => (
                404,
                exchange::error_body(
                    "not_found",
                    &format!(
                        "{} {}: only POST {TICKET_PATH} and POST {KEPT_PATH}",
                        r.method, r.path
                    ),
                ),
            ),
            (Some(wants), Ok(TicketRequest { session })) => {
                return Some(Asked {
                    s,
                    peer,
                    who,
                    wants,
                    session,
                    ready: std::time::Instant::now(),
                })
            }
            (Some(_), Err(m)) => (400, exchange::error_body("invalid", &m)),
        },
    };
    crate::warn!(
        "{who}: request refused before a ticket was spent: {}",
        refusal.1["message"].as_str().unwrap_or_default()
    );
    if let Err(e) = exchange::respond(&mut s, refusal.0, &refusal.1) {
        crate::warn!("{who}: answering: {e}");
    }
    None
}

impl Svc<'_> {
    /// The serialized part, one node at a time.
    fn answer(&mut self, asked: Asked) {
        self.ledger.flush();
        match asked.wants {
            Wants::Ticket => self.issue(asked),
            Wants::Kept => self.keep(asked),
        }
    }

    /// The node's word that it keeps its ticket: the ledger makes it final.
    fn keep(&mut self, mut asked: Asked) {
        let started = std::time::Instant::now();
        let kept = self.ledger.keep(&asked.peer.spki);
        let took = started.elapsed();
        self.book.kept(took);
        match kept {
            Keep::Kept => {
                crate::info!(
                    "{}: keeps its ticket (its node lock is durable); recorded in {}, in {:.3} s",
                    asked.who,
                    self.ledger.describe(),
                    took.as_secs_f64()
                );
                self.reply(&mut asked, 200, serde_json::json!({}));
            }
            Keep::Refused(code, m) => {
                crate::warn!("{}: says it keeps a ticket: {m}", asked.who);
                self.reply(&mut asked, 409, exchange::error_body(code, &m));
            }
            Keep::Unavailable(m) => {
                crate::warn!(
                    "{}: recording that it keeps its ticket: {m}; told to say it again in \
                     {TRY_LATER} s",
                    asked.who
                );
                self.later(&mut asked, &format!("{m}; say it again"));
            }
        }
    }

    /// A node's turn: now, or a slot to come back at (docs/join-service.md, "Appointments").
    fn issue(&mut self, mut asked: Asked) {
        let now = std::time::SystemTime::now();
        let secs = now
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        match self
            .book
            .turn(&asked.peer.spki, secs, asked.ready.elapsed())
        {
            Turn::Now => {
                let started = std::time::Instant::now();
                if self.issue_now(&mut asked, started) {
                    self.book.served(started.elapsed());
                }
            }
            Turn::At { at, booked } => {
                let started = std::time::Instant::now();
                let at = now + Duration::from_secs_f64((at - secs).max(0.0));
                self.appoint(&mut asked, at, booked);
                self.book.refused(started.elapsed(), secs);
            }
        }
    }

    /// `503` with the node's slot as `Retry-After` (a date), or the book's end when it is full.
    fn appoint(&self, asked: &mut Asked, at: std::time::SystemTime, booked: bool) {
        let when = crate::node::status::rfc3339(at);
        let m = match booked {
            true => format!(
                "the join service makes tickets more slowly than nodes ask ({} waiting, {:.2} s \
                 a ticket, {:.2} s its keeping, {:.3} s a refusal): this node's slot is at \
                 {when}; ask again then",
                self.book.waiting(),
                self.book.ticket_secs(),
                self.book.keep_secs(),
                self.book.refusal_secs()
            ),
            false => format!(
                "the join service's appointment book is full: ask again at {when}, when it ends"
            ),
        };
        crate::info!("{}: {m}", asked.who);
        asked.s.sock.restart();
        let b = exchange::error_body("try_later", &m);
        if let Err(e) = exchange::respond_at(&mut asked.s, &b, at) {
            crate::warn!("{}: answering: {e}", asked.who);
        }
    }

    /// One ticket, claimed in the ledger before it is made and settled there once it was
    /// written to the node (its time, logged, from `began`): whether it was written.
    fn issue_now(&mut self, asked: &mut Asked, began: std::time::Instant) -> bool {
        if !asked.s.sock.peer_waiting() {
            crate::warn!(
                "{}: gone before its turn (it waited longer than it would); nothing spent",
                asked.who
            );
            return false;
        }
        let peer = &asked.peer;
        let role = role_of(peer);
        let asking = ledger::Asking {
            identity: &peer.spki,
            node: &peer.cn,
            role,
            session: asked.session.as_deref(),
        };
        let held = match self.ledger.claim(&asking) {
            Claim::Granted(h) => h,
            Claim::Refused(code, m) => {
                crate::warn!("{}: {m}", asked.who);
                self.reply(asked, 409, exchange::error_body(code, &m));
                return false;
            }
            Claim::Unavailable(m) => {
                crate::warn!("{}: {m}; told to ask again in {TRY_LATER} s", asked.who);
                self.later(asked, &format!("{m}; ask again"));
                return false;
            }
        };
        // Made, then (the file ledger) recorded, then written, each only if the node still
        // waits: a ticket is never recorded for a node that had gone.
        let ticket = self
            .ticket(role)
            .and_then(|t| serde_json::to_value(&t).map_err(|e| e.to_string()))
            .and_then(|t| match asked.s.sock.peer_waiting() {
                true => Ok(t),
                false => Err("the node was gone before its ticket was made".into()),
            })
            .and_then(|t| self.ledger.commit(&held).map(|()| t));
        let t = match ticket {
            Ok(t) => t,
            Err(e) => {
                crate::warn!("{}: no ticket: {e}", asked.who);
                self.ledger.settle(held, Err(short(&e)));
                self.reply(asked, 500, exchange::error_body("internal", &e));
                return false;
            }
        };
        // The token command had its own time limit: the answer gets a full one.
        asked.s.sock.restart();
        let sent = exchange::respond(&mut asked.s, 200, &t);
        match &sent {
            Ok(()) => {
                crate::info!(
                    "{}: ticket issued as {} (role from the certificate's organisation, attempt {}); \
                     recorded in {}, in {:.3} s",
                    asked.who,
                    role.as_str(),
                    held.attempt(),
                    self.ledger.describe(),
                    began.elapsed().as_secs_f64()
                );
                crate::node::status::decide(
                    &format!("ticket {}", asked.who),
                    role.as_str(),
                    format_args!("its certificate's organisation, attempt {}", held.attempt()),
                );
            }
            Err(e) => crate::warn!("{}: the ticket could not be written: {e}", asked.who),
        }
        let written = sent.is_ok();
        self.ledger.settle(
            held,
            sent.map_err(|e| short(&format!("writing the ticket to the node: {e}"))),
        );
        written
    }

    /// 503 `try_later` with `Retry-After`: the ledger could not be asked or written.
    fn later(&self, asked: &mut Asked, m: &str) {
        asked.s.sock.restart();
        let b = exchange::error_body("try_later", m);
        if let Err(e) = exchange::respond_later(&mut asked.s, &b, TRY_LATER) {
            crate::warn!("{}: answering: {e}", asked.who);
        }
    }

    fn reply(&self, asked: &mut Asked, status: u16, body: serde_json::Value) {
        asked.s.sock.restart();
        if let Err(e) = exchange::respond(&mut asked.s, status, &body) {
            crate::warn!("{}: answering: {e}", asked.who);
        }
    }

    /// The ticket for `role`: its files and a new token.
    fn ticket(&self, role: Role) -> std::result::Result<Ticket, String> {
        let mut files = Vec::new();
        if role == Role::ControlPlane {
            for name in CONTROL_PLANE_FILES {
                let p = format!("{}/{name}", self.a.pki_dir.trim_end_matches('/'));
                let data = self
                    .root
                    .read_text(&p)
                    .map_err(|e| e.to_string())?
                    .ok_or_else(|| format!("{} does not exist", self.root.show(&p)))?;
                files.push(File {
                    name: name.to_string(),
                    data,
                });
            }
        }
        let token = self.token().map_err(|e| e.to_string())?;
        Ok(Ticket {
            cluster_name: self.a.cluster_name.clone(),
            api_server_endpoint: self.a.api_server_endpoint.clone(),
            token,
            discovery_token_ca_cert_hash: self.discovery_hash.clone(),
            role,
            kubernetes_version: self.a.kubernetes_version.clone(),
            control_plane_files: files,
        })
    }

    /// A new bootstrap token from --token-command: its last non-empty output line.
    fn token(&self) -> Result<String> {
        let r = kubeadm::run(&self.token_cmd, Duration::from_secs(self.a.token_timeout))
            .map_err(|e| e.context("--token-command"))?;
        if !r.ok {
            return Err(Error::failed(format!(
                "--token-command {}: {}",
                r.status,
                kubeadm::last_lines(&r.tail, 3)
            )));
        }
        let out = String::from_utf8_lossy(&r.stdout);
        let token = out
            .lines()
            .map(str::trim)
            .rfind(|l| !l.is_empty())
            .unwrap_or("");
        if !kubeadm::valid_token(token) {
            // Whatever it printed is not repeated: it may be a malformed secret.
            return Err(Error::failed(
                "--token-command printed no bootstrap token ([a-z0-9]{6}.[a-z0-9]{16})",
            ));
        }
        crate::info!("bootstrap token created by --token-command");
        Ok(token.to_string())
    }
}

/// A reason kept in a ticket record: its first 300 characters.
fn short(m: &str) -> String {
    m.chars().take(300).collect()
}
