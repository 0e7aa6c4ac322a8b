//! `nodestrap join-service`: hands join tickets to nodes, in the cluster (a DaemonSet on the
//! control-plane nodes). A node is authenticated by its client certificate, which the
//! node-provisioning CA issued; its identity is the certificate's public key hash, its role the
//! certificate's organisation (`nodestrap:control-plane`, else worker). Each identity gets at
//! most one ticket, ever: the record is written durably before the ticket leaves. Tokens and
//! keys are never logged.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::cli::JoinService;
use crate::error::{Error, Result};
use crate::kubeadm;
use crate::mtls::{self, Peer};
use crate::nodelock::Role;
use crate::root::Root;
use crate::stop;
use crate::wire::{self, File, Ticket, CONTROL_PLANE_FILES, TICKET_PATH};

/// The certificate organisation that makes a node a control plane.
pub const CONTROL_PLANE_ORG: &str = "nodestrap:control-plane";
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Who got a ticket, by identity (`sha256:<hex>` of the node's public key):
/// `{"issued": {IDENTITY: {"node": CN, "role": ROLE, "at": UNIX_SECONDS}}}`.
type Issued = serde_json::Map<String, serde_json::Value>;

struct Svc<'a> {
    a: &'a JoinService,
    root: &'a Root,
    server: std::sync::Arc<rustls::ServerConfig>,
    discovery_hash: String,
    token_cmd: Vec<String>,
    issued: Issued,
}

pub fn run(a: &JoinService) -> Result<()> {
    // 1. Options.
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
    wire::check_cluster_name(&a.cluster_name)
        .map_err(|m| Error::config(format!("--{}", m.replace('_', "-"))))?;
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
    let root = Root::open(&a.root)?;

    // 2. Inputs: serving identity, node CA, cluster CA (its hash goes into every ticket), the
    //    record of tickets already issued.
    let show = |p: &str| root.show(p);
    let id = mtls::load_identity(&root, ("--cert", &a.cert), ("--key", &a.key))?;
    let node_ca = mtls::load_certs(&root, "--node-ca", &a.node_ca)?;
    let cluster_ca = mtls::load_certs(&root, "--cluster-ca", &a.cluster_ca)?;
    let discovery_hash = mtls::spki_sha256(&cluster_ca[0]).ok_or_else(|| {
        Error::config(format!(
            "{}: certificate does not parse",
            show(&a.cluster_ca)
        ))
    })?;
    let issued = match root.read_text(&a.state)? {
        Some(t) => match serde_json::from_str::<serde_json::Value>(&t) {
            Ok(serde_json::Value::Object(mut o)) => match o.remove("issued") {
                Some(serde_json::Value::Object(m)) => m,
                _ => Issued::new(),
            },
            Ok(_) | Err(_) => {
                return Err(Error::failed(format!(
                    "{}: not a ticket record",
                    show(&a.state)
                )))
            }
        },
        None => Issued::new(),
    };
    log::info!(
        "{} node identities already have a ticket (from {})",
        issued.len(),
        show(&a.state)
    );
    log::info!(
        "cluster CA {} gives the discovery hash {discovery_hash}",
        show(&a.cluster_ca)
    );
    let mut svc = Svc {
        server: mtls::server_config(&id, &node_ca, &show(&a.cert))?,
        a,
        root: &root,
        discovery_hash,
        token_cmd,
        issued,
    };

    // 3. Serve, one node at a time (each takes milliseconds plus the token command), until
    //    SIGTERM; a request being handled finishes first.
    let listener =
        TcpListener::bind(listen).map_err(|e| Error::failed(format!("--listen {listen}: {e}")))?;
    let bound = listener
        .local_addr()
        .map(|l| l.to_string())
        .unwrap_or_default();
    log::info!(
        "join service listening on {bound}: nodes need a certificate from {}",
        show(&a.node_ca)
    );
    stop::catch_sigterm();
    mtls::serve(&listener, stop::signalled, |tcp, addr| {
        svc.conn(tcp, addr);
        true
    })?;
    log::info!("join service stopped by signal");
    Ok(())
}

impl Svc<'_> {
    fn conn(&mut self, tcp: TcpStream, addr: SocketAddr) {
        // 1. Handshake: the node's certificate must come from the node-provisioning CA.
        let (mut s, peer) = match mtls::accept(tcp, &self.server, REQUEST_TIMEOUT) {
            Ok(x) => x,
            Err(e) => {
                log::warn!("refused a connection from {addr}: {e}");
                return;
            }
        };
        let who = format!("node {} ({}) at {addr}", peer.cn, peer.spki);
        let (status, body) = match mtls::read_request(&mut s) {
            Err(e) => (400, mtls::error_body("bad_request", &e.to_string())),
            Ok(r) if r.path != TICKET_PATH || r.method != "POST" => (
                404,
                mtls::error_body(
                    "not_found",
                    &format!("{} {}: only POST {TICKET_PATH}", r.method, r.path),
                ),
            ),
            Ok(_) => match self.ticket(&peer, &who) {
                Ok(t) => (200, serde_json::to_value(&t).unwrap_or_default()),
                Err((status, code, e)) => {
                    log::warn!("{who}: {e}");
                    (status, mtls::error_body(code, &e))
                }
            },
        };
        if let Err(e) = mtls::respond(&mut s, status, &body) {
            log::warn!("{who}: answering: {e}");
        }
    }

    /// Steps 2 to 6: not issued before; the role's files; a token; the durable record; the
    /// ticket. An error is (HTTP status, code, message).
    fn ticket(
        &mut self,
        peer: &Peer,
        who: &str,
    ) -> std::result::Result<Ticket, (u16, &'static str, String)> {
        let internal = |e: String| (500, "internal", e);
        if let Some(r) = self.issued.get(&peer.spki) {
            return Err((
                409,
                "already_issued",
                format!(
                    "this node identity already got a ticket (as {} at {}); refused",
                    r["node"], r["at"]
                ),
            ));
        }
        let role = if peer.orgs.iter().any(|o| o == CONTROL_PLANE_ORG) {
            Role::ControlPlane
        } else {
            Role::Worker
        };
        let mut files = Vec::new();
        if role == Role::ControlPlane {
            for name in CONTROL_PLANE_FILES {
                let p = format!("{}/{name}", self.a.pki_dir.trim_end_matches('/'));
                let data = self
                    .root
                    .read_text(&p)
                    .map_err(|e| internal(e.to_string()))?
                    .ok_or_else(|| internal(format!("{} does not exist", self.root.show(&p))))?;
                files.push(File {
                    name: name.to_string(),
                    data,
                });
            }
        }
        let token = self.token().map_err(|e| internal(e.to_string()))?;
        let at = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let record = serde_json::json!({"node": peer.cn, "role": role.as_str(), "at": at});
        self.issued.insert(peer.spki.clone(), record);
        if let Err(e) = self.save() {
            self.issued.remove(&peer.spki);
            return Err(internal(e.to_string()));
        }
        log::info!(
            "{who}: ticket issued as {} (role from the certificate's organisation); recorded in {}",
            role.as_str(),
            self.root.show(&self.a.state)
        );
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
            let tail: Vec<&str> = r.tail.lines().filter(|l| !l.trim().is_empty()).collect();
            return Err(Error::failed(format!(
                "--token-command {}: {}",
                r.status,
                tail[tail.len().saturating_sub(3)..].join(" | ")
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
        log::info!("bootstrap token created by --token-command");
        Ok(token.to_string())
    }

    fn save(&self) -> Result<()> {
        let mut text = serde_json::to_vec_pretty(&serde_json::json!({"issued": self.issued}))?;
        text.push(b'\n');
        self.root.write_atomic(&self.a.state, &text, 0o644)
    }
}
