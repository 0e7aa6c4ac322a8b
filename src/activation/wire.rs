//! The two JSON exchanges of activation, and the checks each side applies to what it gets:
//! the init request (admin → init server, `POST /v1/init`) and the join ticket (join service →
//! node, `POST /v1/ticket`, and the node's word that it kept it, `POST /v1/ticket/kept`).
//! Unknown fields are refused, so a typo never passes silently.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::activation::nodelock::Role;
use crate::net::names::dns_subdomain;

pub(crate) const INIT_PATH: &str = "/v1/init";
pub(crate) const TICKET_PATH: &str = "/v1/ticket";
/// The node's word, once its node lock is durable, that it keeps the ticket it got: from then
/// on the identity is refused for good (docs/join-service.md, "The states").
pub(crate) const KEPT_PATH: &str = "/v1/ticket/kept";

/// What a control-plane ticket carries, written to /etc/kubernetes/pki/<name> on the node:
/// the cluster-wide keys kubeadm would otherwise download (Constellation's list).
pub(crate) const CONTROL_PLANE_FILES: &[&str] = &[
    "ca.crt",
    "ca.key",
    "sa.key",
    "sa.pub",
    "front-proxy-ca.crt",
    "front-proxy-ca.key",
    "etcd/ca.crt",
    "etcd/ca.key",
];

#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct InitRequest {
    pub(crate) cluster_name: String,
    pub(crate) kubernetes_version: String,
    pub(crate) pod_cidr: String,
    pub(crate) service_cidr: String,
    #[serde(default)]
    pub(crate) apiserver_sans: Vec<String>,
    /// kubeadm's `controlPlaneEndpoint`: the address every node is told to reach the API server
    /// at (a load balancer's, or one that NAT keeps apart from the node's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) control_plane_endpoint: Option<String>,
    pub(crate) init_secret: String,
}

impl InitRequest {
    /// Every field but the secret (checked first, against the node's hash). The message names
    /// the field.
    pub fn validate(&self) -> Result<(), String> {
        check_cluster_name(&self.cluster_name)?;
        if !k8s_version(&self.kubernetes_version) {
            return Err(format!(
                "kubernetes_version {:?}: expected vMAJOR.MINOR.PATCH",
                self.kubernetes_version
            ));
        }
        for (field, v) in [
            ("pod_cidr", &self.pod_cidr),
            ("service_cidr", &self.service_cidr),
        ] {
            if !cidr(v) {
                return Err(format!("{field} {v:?}: expected ADDRESS/PREFIX"));
            }
        }
        if let (Some(pods), Some(services)) =
            (Cidr::parse(&self.pod_cidr), Cidr::parse(&self.service_cidr))
        {
            if pods.overlaps(&services) {
                return Err(format!(
                    "pod_cidr {} overlaps the service range {}",
                    self.pod_cidr, self.service_cidr
                ));
            }
        }
        if self.apiserver_sans.len() > 64 {
            return Err("apiserver_sans: more than 64 names".into());
        }
        for s in &self.apiserver_sans {
            if s.parse::<IpAddr>().is_err() && !dns_subdomain(s) {
                return Err(format!(
                    "apiserver_sans {s:?}: not an IP address or DNS name"
                ));
            }
        }
        if let Some(e) = &self.control_plane_endpoint {
            if !endpoint(e) {
                return Err(format!(
                    "control_plane_endpoint {e:?}: expected HOST or HOST:PORT (an IP address or DNS name)"
                ));
            }
        }
        Ok(())
    }
}

/// The body of `POST /v1/ticket` and of `POST /v1/ticket/kept`: a JSON object, with at most
/// the node's `session`; anything else is refused before a ticket is spent, so that a later
/// field cannot be silently ignored by an older service.
#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct TicketRequest {
    /// 32 lowercase hex digits, new in every run of the node's activate: a node that asks
    /// again from a new run, before it said it keeps a ticket, lost the one it got (killed
    /// before its node lock was durable). Asks of one run (the same session) never get two.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) session: Option<String>,
}

/// Largest ticket request body: `{"session": ...}` with room for whitespace.
pub(crate) const TICKET_REQUEST_CAP: usize = 4 << 10;

/// A session: 32 lowercase hex digits.
fn session_id(s: &str) -> bool {
    s.len() == 32 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

impl TicketRequest {
    /// The message names the limit or quotes a bounded excerpt of what was sent.
    pub fn parse(body: &[u8]) -> Result<TicketRequest, String> {
        if body.len() > TICKET_REQUEST_CAP {
            return Err(format!(
                "ticket request of {} bytes is over the {TICKET_REQUEST_CAP}-byte limit",
                body.len()
            ));
        }
        // serde would take `[]` for an empty struct: the body must be a JSON object.
        let quoted = || crate::error::excerpt(&String::from_utf8_lossy(body), 64);
        match serde_json::from_slice::<serde_json::Value>(body) {
            Ok(serde_json::Value::Object(m)) => {
                if let Some(k) = m.keys().find(|k| *k != "session") {
                    return Err(format!(
                        "ticket request: unknown field {:?}",
                        crate::error::excerpt(k, 64)
                    ));
                }
                match m.get("session") {
                    None => Ok(TicketRequest { session: None }),
                    Some(serde_json::Value::String(s)) if session_id(s) => Ok(TicketRequest {
                        session: Some(s.clone()),
                    }),
                    Some(v) => Err(format!(
                        "ticket request: session \"{}\" is not 32 lowercase hex digits",
                        crate::error::excerpt(&v.to_string(), 64)
                    )),
                }
            }
            Ok(_) => Err(format!(
                "ticket request \"{}\" is not a JSON object",
                quoted()
            )),
            Err(e) => Err(format!(
                "ticket request \"{}\" does not parse: {e}",
                quoted()
            )),
        }
    }
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct File {
    pub(crate) name: String,
    pub(crate) data: String,
}

#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct Ticket {
    pub(crate) cluster_name: String,
    /// `HOST:PORT` of the API server kubeadm join talks to.
    pub(crate) api_server_endpoint: String,
    pub(crate) token: String,
    /// `sha256:<hex>` of the cluster CA's SubjectPublicKeyInfo (kubeadm's discovery hash).
    pub(crate) discovery_token_ca_cert_hash: String,
    pub(crate) role: Role,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) kubernetes_version: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) control_plane_files: Vec<File>,
}

impl Ticket {
    /// All of it, before the node lock. `pinned_hash` is the SPKI hash of the cluster CA this
    /// node trusts: the CA kubeadm will discover must be that one.
    pub fn validate(&self, pinned_hash: &str) -> Result<(), String> {
        check_cluster_name(&self.cluster_name)?;
        if !host_port(&self.api_server_endpoint) {
            return Err(format!(
                "api_server_endpoint {:?}: expected HOST:PORT",
                self.api_server_endpoint
            ));
        }
        // The token itself is never repeated in a message.
        if !crate::activation::kubeadm::valid_token(&self.token) {
            return Err("token: not a bootstrap token ([a-z0-9]{6}.[a-z0-9]{16})".into());
        }
        let h = &self.discovery_token_ca_cert_hash;
        if !spki_hash(h) {
            return Err(format!(
                "discovery_token_ca_cert_hash {h:?}: expected sha256:<64 hex digits>"
            ));
        }
        if h != pinned_hash {
            return Err(format!(
                "discovery_token_ca_cert_hash {h} is not the pinned cluster CA's ({pinned_hash})"
            ));
        }
        if let Some(v) = &self.kubernetes_version {
            if !k8s_version(v) {
                return Err(format!(
                    "kubernetes_version {v:?}: expected vMAJOR.MINOR.PATCH"
                ));
            }
        }
        match self.role {
            Role::Worker if !self.control_plane_files.is_empty() => {
                return Err(
                    "control_plane_files: a worker ticket must not carry cluster keys".into(),
                )
            }
            Role::Worker => {}
            Role::ControlPlane => {
                for want in CONTROL_PLANE_FILES {
                    let n = self
                        .control_plane_files
                        .iter()
                        .filter(|f| f.name == *want)
                        .count();
                    if n != 1 {
                        return Err(format!(
                            "control_plane_files: {want} given {n} times, expected once"
                        ));
                    }
                }
                for f in &self.control_plane_files {
                    if !CONTROL_PLANE_FILES.contains(&f.name.as_str()) {
                        return Err(format!("control_plane_files: unexpected file {:?}", f.name));
                    }
                    if f.data.len() > 64 << 10 || !f.data.contains("-----BEGIN ") {
                        return Err(format!(
                            "control_plane_files: {} is not a PEM file of at most 64 KiB",
                            f.name
                        ));
                    }
                }
                let ca = &self
                    .control_plane_files
                    .iter()
                    .find(|f| f.name == "ca.crt")
                    .expect("checked")
                    .data;
                let der = crate::activation::mtls::certs(ca.as_bytes(), "ca.crt")
                    .map_err(|e| format!("control_plane_files: {e}"))?;
                if crate::crypto::x509::spki_sha256(&der[0]).as_deref() != Some(pinned_hash) {
                    return Err("control_plane_files: ca.crt is not the pinned cluster CA".into());
                }
            }
        }
        Ok(())
    }
}

/// A field message (`cluster_name "a_b": …`) as the command-line flag that gave the field
/// (`--cluster-name "a_b": …`): only the name changes, never the value quoted after it.
pub fn as_flag(m: &str) -> String {
    let end = m.find([' ', ':']).unwrap_or(m.len());
    format!("--{}{}", m[..end].replace('_', "-"), &m[end..])
}

pub(crate) fn check_cluster_name(n: &str) -> Result<(), String> {
    if n.len() <= 63 && !n.contains('.') && dns_subdomain(n) {
        Ok(())
    } else {
        Err(format!(
            "cluster_name {n:?}: expected a DNS label (a-z, 0-9, -)"
        ))
    }
}

/// `v1.31.2`, optionally with a pre-release (`v1.32.0-rc.1`).
pub(crate) fn k8s_version(v: &str) -> bool {
    let Some(rest) = v.strip_prefix('v') else {
        return false;
    };
    let (core, pre) = match rest.split_once('-') {
        Some((c, p)) => (c, Some(p)),
        None => (rest, None),
    };
    let nums: Vec<&str> = core.split('.').collect();
    nums.len() == 3
        && nums
            .iter()
            .all(|n| !n.is_empty() && n.len() <= 4 && n.bytes().all(|b| b.is_ascii_digit()))
        && pre.is_none_or(|p| {
            !p.is_empty() && p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.')
        })
}

impl InitRequest {
    /// The node's own address (the one the admin reached) must be in neither range: pods or
    /// services would shadow the node itself.
    pub(crate) fn validate_for_node(&self, node: IpAddr) -> Result<(), String> {
        for (field, v) in [
            ("pod_cidr", &self.pod_cidr),
            ("service_cidr", &self.service_cidr),
        ] {
            if Cidr::parse(v).is_some_and(|c| c.contains(node)) {
                return Err(format!("{field} {v} holds the node's own address {node}"));
            }
        }
        Ok(())
    }
}

/// An address range, `ADDRESS/PREFIX`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Cidr {
    net: u128,
    prefix: u8,
    v4: bool,
}

impl Cidr {
    pub(crate) fn parse(s: &str) -> Option<Cidr> {
        if !cidr(s) {
            return None;
        }
        let (addr, len) = s.split_once('/')?;
        let prefix: u8 = len.parse().ok()?;
        let (bits, v4) = match addr.parse::<IpAddr>().ok()? {
            IpAddr::V4(a) => (u128::from(u32::from(a)) << 96, true),
            IpAddr::V6(a) => (u128::from(a), false),
        };
        // A v4 address sits in the top 32 bits, so its prefix counts from the top as v6's does.
        Some(Cidr {
            net: bits & mask(prefix),
            prefix,
            v4,
        })
    }

    /// Two ranges of one family overlap when one holds the other's network address.
    pub(crate) fn overlaps(&self, o: &Cidr) -> bool {
        let p = self.prefix.min(o.prefix);
        self.v4 == o.v4 && (self.net & mask(p)) == (o.net & mask(p))
    }

    pub(crate) fn contains(&self, ip: IpAddr) -> bool {
        let (bits, v4) = match ip {
            IpAddr::V4(a) => (u128::from(u32::from(a)) << 96, true),
            IpAddr::V6(a) => (u128::from(a), false),
        };
        v4 == self.v4 && bits & mask(self.prefix) == self.net
    }
}

/// The top `bits` bits set.
fn mask(bits: u8) -> u128 {
    match bits {
        0 => 0,
        b => u128::MAX << (128 - u32::from(b.min(128))),
    }
}

pub(crate) fn cidr(s: &str) -> bool {
    let Some((addr, len)) = s.split_once('/') else {
        return false;
    };
    let Ok(addr) = addr.parse::<IpAddr>() else {
        return false;
    };
    let max = if addr.is_ipv4() { 32 } else { 128 };
    len.parse::<u8>().is_ok_and(|l| l <= max) && !len.starts_with('+')
}

/// `host:port` or `[v6]:port`.
pub(crate) fn host_port(s: &str) -> bool {
    let (host, port) = match s.strip_prefix('[') {
        Some(r) => match r.split_once("]:") {
            Some((h, p)) if h.parse::<std::net::Ipv6Addr>().is_ok() => (None, p),
            _ => return false,
        },
        None => match s.rsplit_once(':') {
            Some((h, p)) => (Some(h), p),
            None => return false,
        },
    };
    let host_ok = host.is_none_or(|h| h.parse::<std::net::Ipv4Addr>().is_ok() || dns_subdomain(h));
    host_ok && port.parse::<u16>().is_ok_and(|p| p > 0)
}

/// kubeadm's `controlPlaneEndpoint`: `host:port`, or a host alone (kubeadm adds the API
/// server's port); an IPv6 address in brackets.
fn endpoint(s: &str) -> bool {
    let bare = s.strip_prefix('[').and_then(|r| r.strip_suffix(']'));
    host_port(s)
        || bare.is_some_and(|h| h.parse::<std::net::Ipv6Addr>().is_ok())
        || s.parse::<std::net::Ipv4Addr>().is_ok()
        || dns_subdomain(s)
}

pub(crate) fn spki_hash(h: &str) -> bool {
    h.strip_prefix("sha256:").is_some_and(|x| {
        x.len() == 64
            && x.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs_overlap_and_hold_addresses() {
        let c = |s| Cidr::parse(s).unwrap();
        assert!(c("10.96.0.0/12").overlaps(&c("10.100.0.0/16")));
        assert!(c("10.100.0.0/16").overlaps(&c("10.96.0.0/12")));
        assert!(!c("10.244.0.0/16").overlaps(&c("10.96.0.0/12")));
        assert!(c("0.0.0.0/0").overlaps(&c("192.168.0.0/24")));
        assert!(!c("10.0.0.0/8").overlaps(&c("fd00::/8")));
        assert!(c("fd00::/48").overlaps(&c("fd00:0:0:1::/64")));
        // Host bits are ignored as kubeadm ignores them.
        assert!(c("10.96.5.7/12").overlaps(&c("10.96.0.0/24")));
        assert!(c("10.0.0.0/8").contains("10.1.2.3".parse().unwrap()));
        assert!(!c("10.0.0.0/8").contains("11.0.0.1".parse().unwrap()));
        assert!(!c("10.0.0.0/8").contains("::ffff:10.0.0.1".parse().unwrap()));
        let mut r = init();
        r.pod_cidr = "10.96.0.0/16".into();
        r.service_cidr = "10.96.0.0/12".into();
        let e = r.validate().unwrap_err();
        assert_eq!(
            e,
            "pod_cidr 10.96.0.0/16 overlaps the service range 10.96.0.0/12"
        );
        let r = init();
        let e = r
            .validate_for_node(r.pod_cidr.split('/').next().unwrap().parse().unwrap())
            .unwrap_err();
        assert!(e.contains("holds the node's own address"), "{e}");
    }

    #[test]
    fn ticket_requests_are_checked_before_a_ticket_is_spent() {
        let none = TicketRequest { session: None };
        assert_eq!(TicketRequest::parse(b"{}"), Ok(none.clone()));
        assert_eq!(TicketRequest::parse(b" { } "), Ok(none));
        let id = "0123456789abcdef0123456789abcdef";
        let with = TicketRequest {
            session: Some(id.into()),
        };
        let body = serde_json::to_vec(&with).unwrap();
        assert_eq!(TicketRequest::parse(&body), Ok(with));
        for bad in [
            &b""[..],
            b"[]",
            b"{\"role\":\"admin\"}",
            b"null",
            b"{",
            b"{\"session\":\"0123456789ABCDEF0123456789abcdef\"}",
            b"{\"session\":\"0123\"}",
            b"{\"session\":7}",
            b"{\"session\":\"0123456789abcdef0123456789abcdef\",\"x\":1}",
        ] {
            assert!(TicketRequest::parse(bad).is_err(), "{bad:?}");
        }
        let big = vec![b' '; TICKET_REQUEST_CAP + 1];
        assert!(TicketRequest::parse(&big)
            .unwrap_err()
            .contains("over the 4096-byte limit"));
    }

    fn init() -> InitRequest {
        InitRequest {
            cluster_name: "demo".into(),
            kubernetes_version: "v1.31.2".into(),
            pod_cidr: "10.244.0.0/16".into(),
            service_cidr: "fd00:10:96::/108".into(),
            apiserver_sans: vec!["10.0.0.1".into(), "api.demo.example".into()],
            control_plane_endpoint: Some("api.demo.example:6443".into()),
            init_secret: "s".into(),
        }
    }

    #[test]
    fn init_requests_name_the_bad_field() {
        init().validate().unwrap();
        type Case = (fn(&mut InitRequest), &'static str);
        let cases: Vec<Case> = vec![
            (|r| r.cluster_name = "Demo".into(), "cluster_name"),
            (|r| r.cluster_name = "a.b".into(), "cluster_name"),
            (
                |r| r.kubernetes_version = "1.31.2".into(),
                "kubernetes_version",
            ),
            (
                |r| r.kubernetes_version = "v1.31".into(),
                "kubernetes_version",
            ),
            (|r| r.pod_cidr = "10.244.0.0".into(), "pod_cidr"),
            (|r| r.service_cidr = "10.96.0.0/33".into(), "service_cidr"),
            (|r| r.apiserver_sans.push("a b".into()), "apiserver_sans"),
            (
                |r| r.control_plane_endpoint = Some("api:0".into()),
                "control_plane_endpoint",
            ),
            (
                |r| r.control_plane_endpoint = Some("https://api".into()),
                "control_plane_endpoint",
            ),
        ];
        for (f, field) in cases {
            let mut r = init();
            f(&mut r);
            let e = r.validate().unwrap_err();
            assert!(e.starts_with(field), "{e}");
        }
        assert!(k8s_version("v1.32.0-rc.1"));
        for good in [
            "10.0.2.2",
            "10.0.2.2:6443",
            "[fd00::1]",
            "[fd00::1]:6443",
            "api.example",
        ] {
            assert!(endpoint(good), "{good}");
        }
        let unknown = r#"{"cluster_name":"a","kubernetes_version":"v1.2.3","pod_cidr":"1.0.0.0/8","service_cidr":"2.0.0.0/8","init_secret":"x","extra":1}"#;
        assert!(serde_json::from_str::<InitRequest>(unknown).is_err());
    }

    #[test]
    fn field_messages_become_flag_messages_with_the_value_intact() {
        let e = check_cluster_name("my_cluster").unwrap_err();
        assert_eq!(
            as_flag(&e),
            "--cluster-name \"my_cluster\": expected a DNS label (a-z, 0-9, -)"
        );
        assert_eq!(
            as_flag("apiserver_sans: more than 64 names"),
            "--apiserver-sans: more than 64 names"
        );
        let mut r = init();
        r.apiserver_sans.push("a_b".into());
        assert_eq!(
            as_flag(&r.validate().unwrap_err()),
            "--apiserver-sans \"a_b\": not an IP address or DNS name"
        );
    }

    #[test]
    fn endpoints_and_hashes() {
        for ok in ["10.0.0.1:6443", "api.example.com:443", "[fd00::1]:6443"] {
            assert!(host_port(ok), "{ok}");
        }
        for bad in ["10.0.0.1", "fd00::1:6443", "a:0", "a/b:1", ":6443", "[x]:1"] {
            assert!(!host_port(bad), "{bad}");
        }
        assert!(spki_hash(&format!("sha256:{}", "a".repeat(64))));
        assert!(!spki_hash(&format!("sha256:{}", "A".repeat(64))));
        assert!(!spki_hash("sha256:abc"));
    }

    #[test]
    fn tickets_must_match_the_pin_and_the_role() {
        let pin = format!("sha256:{}", "1".repeat(64));
        let mut t = Ticket {
            cluster_name: "demo".into(),
            api_server_endpoint: "10.0.0.1:6443".into(),
            token: "abcdef.0123456789abcdef".into(),
            discovery_token_ca_cert_hash: pin.clone(),
            role: Role::Worker,
            kubernetes_version: None,
            control_plane_files: vec![],
        };
        t.validate(&pin).unwrap();
        let e = t
            .validate(&format!("sha256:{}", "2".repeat(64)))
            .unwrap_err();
        assert!(e.contains("not the pinned cluster CA"), "{e}");
        t.token = "ABCDEF.0123456789abcdef".into();
        let e = t.validate(&pin).unwrap_err();
        assert!(e.starts_with("token") && !e.contains("ABCDEF"), "{e}");
        t.token = "abcdef.0123456789abcdef".into();
        t.control_plane_files = vec![File {
            name: "ca.key".into(),
            data: "-----BEGIN X".into(),
        }];
        assert!(t.validate(&pin).unwrap_err().contains("worker ticket"));
        t.role = Role::ControlPlane;
        assert!(t
            .validate(&pin)
            .unwrap_err()
            .contains("ca.crt given 0 times"));
        t.control_plane_files = CONTROL_PLANE_FILES
            .iter()
            .map(|n| File {
                name: n.to_string(),
                data: "-----BEGIN X".into(),
            })
            .chain([File {
                name: "../../etc/shadow".into(),
                data: "-----BEGIN X".into(),
            }])
            .collect();
        assert!(t
            .validate(&pin)
            .unwrap_err()
            .contains("unexpected file \"../../etc/shadow\""));
    }
}
