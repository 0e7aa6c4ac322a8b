//! `nodestrap join-service`: hands join tickets to nodes, in the cluster (a DaemonSet on the
//! control-plane nodes). A node is authenticated by its client certificate, which the
//! node-provisioning CA issued; its identity is the certificate's public key hash, its role the
//! certificate's organisation (`nodestrap:control-plane`, else worker). Each identity gets at
//! most one ticket, ever: the record is written durably before the ticket leaves. Tokens and
//! keys are never logged.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls::ServerConfig;
use serde::{Deserialize, Serialize};

use crate::activation::kubeadm;
use crate::activation::mtls::{self, Peer};
use crate::activation::nodelock::Role;
use crate::activation::wire::{
    self, File, Ticket, TicketRequest, CONTROL_PLANE_FILES, TICKET_PATH,
};
use crate::cli::JoinService;
use crate::error::{Error, Result};
use crate::node::root::Root;
use crate::node::signals;

/// The certificate organisation that makes a node a control plane.
const CONTROL_PLANE_ORG: &str = "nodestrap:control-plane";

/// The ticket record: who got a ticket, by identity (`sha256:<hex>` of the node's public key):
/// `{"issued": {IDENTITY: {"node": CN, "role": ROLE, "at": UNIX_SECONDS}}}`. Read strictly: a
/// record that loses an entry would let that node get a second ticket.
#[derive(Serialize, Deserialize, Debug, Default, PartialEq)]
#[serde(deny_unknown_fields)]
struct Record {
    issued: Issued,
}

type Issued = BTreeMap<String, IssuedTo>;

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
struct IssuedTo {
    /// The certificate's common name.
    node: String,
    role: Role,
    /// Unix seconds.
    at: u64,
}

/// The record file's text (`name` for messages); any flaw is an error, never an empty record.
fn parse_record(text: &str, name: &str) -> Result<Issued> {
    serde_json::from_str::<Record>(text)
        .map(|r| r.issued)
        .map_err(|e| Error::failed(format!("{name}: not a ticket record: {e}")))
}

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
        Some(t) => parse_record(&t, &show(&a.state))?,
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
    signals::catch_sigterm();
    let server = svc.server.clone();
    mtls::serve(
        &listener,
        signals::signalled,
        |tcp, addr| preauth(&server, tcp, addr),
        |asked| {
            svc.answer(asked);
            true
        },
        |mut asked: Asked| {
            // Stopping: no ticket is spent now; the node asks again (another service, or this
            // one once it is back).
            let b = mtls::error_body("stopping", "the join service is stopping; ask again");
            if let Err(e) = mtls::respond(&mut asked.s, 503, &b) {
                log::warn!("{}: answering: {e}", asked.who);
            }
        },
    )?;
    log::info!("join service stopped by signal");
    Ok(())
}

/// A node that passed its handshake with a well-formed ticket request.
struct Asked {
    s: mtls::ServerStream,
    peer: Peer,
    who: String,
}

/// Before anything is spent, in the connection's own thread: the handshake (the node's
/// certificate must come from the node-provisioning CA), then the request, which must be
/// `POST /v1/ticket` with a well-formed body. Anything else is answered here and goes no
/// further: a malformed request never costs a ticket.
fn preauth(server: &Arc<ServerConfig>, tcp: TcpStream, addr: SocketAddr) -> Option<Asked> {
    let (mut s, peer) = match mtls::accept(tcp, server, mtls::PREAUTH_TIMEOUT) {
        Ok(x) => x,
        Err(e) => {
            log::warn!("refused a connection from {addr}: {e}");
            return None;
        }
    };
    let who = format!("node {} ({}) at {addr}", peer.cn, peer.spki);
    let refusal = match mtls::read_request(&mut s) {
        Err(e) => (400, mtls::error_body("bad_request", &e.to_string())),
        Ok(r) if r.path != TICKET_PATH || r.method != "POST" => (
            404,
            mtls::error_body(
                "not_found",
                &format!("{} {}: only POST {TICKET_PATH}", r.method, r.path),
            ),
        ),
        Ok(r) => match TicketRequest::parse(&r.body) {
            Ok(TicketRequest {}) => return Some(Asked { s, peer, who }),
            Err(m) => (400, mtls::error_body("invalid", &m)),
        },
    };
    log::warn!(
        "{who}: request refused before a ticket was spent: {}",
        refusal.1["message"].as_str().unwrap_or_default()
    );
    if let Err(e) = mtls::respond(&mut s, refusal.0, &refusal.1) {
        log::warn!("{who}: answering: {e}");
    }
    None
}

impl Svc<'_> {
    /// The serialized part: one ticket at a time, recorded before it leaves.
    fn answer(&mut self, mut asked: Asked) {
        let (status, body) = match self.ticket(&asked.peer, &asked.who) {
            Ok(t) => match serde_json::to_value(&t) {
                Ok(v) => (200, v),
                Err(e) => (500, mtls::error_body("internal", &e.to_string())),
            },
            Err((status, code, e)) => {
                log::warn!("{}: {e}", asked.who);
                (status, mtls::error_body(code, &e))
            }
        };
        // The token command had its own time limit: the answer gets a full one.
        asked.s.sock.restart();
        if let Err(e) = mtls::respond(&mut asked.s, status, &body) {
            log::warn!("{}: answering: {e}", asked.who);
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
                    "this node identity already got a ticket (as {:?} at {}); refused",
                    r.node, r.at
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
        let record = IssuedTo {
            node: peer.cn.clone(),
            role,
            at,
        };
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
        log::info!("bootstrap token created by --token-command");
        Ok(token.to_string())
    }

    fn save(&self) -> Result<()> {
        let mut text = serde_json::to_vec_pretty(&Record {
            issued: self.issued.clone(),
        })?;
        text.push(b'\n');
        self.root.write_atomic(&self.a.state, &text, 0o644)
    }
}

/// For the fuzz target (fuzz/): a ticket record as read, written back as `save` writes it.
#[doc(hidden)]
pub fn fuzz_parse_record(text: &str, name: &str) -> Result<String> {
    let issued = parse_record(text, name)?;
    Ok(serde_json::to_string_pretty(&Record { issued })?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticket_record_is_read_strictly() {
        let good = r#"{"issued": {"sha256:ab": {"node": "n1", "role": "control-plane", "at": 7}}}"#;
        let issued = parse_record(good, "/x/issued.json").unwrap();
        assert_eq!(
            issued["sha256:ab"],
            IssuedTo {
                node: "n1".into(),
                role: Role::ControlPlane,
                at: 7
            }
        );
        // What save writes reads back the same.
        let text = serde_json::to_string(&Record {
            issued: issued.clone(),
        })
        .unwrap();
        assert_eq!(parse_record(&text, "x").unwrap(), issued);
        assert!(parse_record(r#"{"issued": {}}"#, "x").unwrap().is_empty());
        // Valid JSON that is not a full record: an error naming the file and serde's reason,
        // never an empty record (which would hand out second tickets).
        for (bad, why) in [
            ("{}", "missing field `issued`"),
            (r#"{"issued": []}"#, "invalid type"),
            (
                r#"{"issued": {"sha256:ab": {"node": "n1"}}}"#,
                "missing field `role`",
            ),
            (
                r#"{"issued": {"sha256:ab": {"node": "n1", "role": "boss", "at": 1}}}"#,
                "unknown variant `boss`",
            ),
            (
                r#"{"issued": {}, "issuedd": {"sha256:ab": {}}}"#,
                "unknown field `issuedd`",
            ),
            ("[]", "expected struct Record"),
            ("", "EOF"),
        ] {
            let e = parse_record(bad, "/var/lib/x/issued.json").unwrap_err();
            let m = e.to_string();
            assert!(
                m.starts_with("/var/lib/x/issued.json: not a ticket record: ") && m.contains(why),
                "{bad}: {m}"
            );
        }
    }
}
