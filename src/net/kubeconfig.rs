//! Kubeconfig as kubectl reads it: the current context (or Tectonic's one unnamed context),
//! its cluster and user, files relative to the kubeconfig, `*-data` fields, credential plugins
//! (`users[].user.exec`), and every field nodestrap does not implement refused by name.
//! Credentials never reach a log line.

use std::time::Duration;

use base64::Engine as _;
use ureq::tls::{ClientCert, PemItem};

use crate::error::{Error, Result};
use crate::net::names::dns_subdomain;
use crate::node::exec::{self, Command, Env};
use crate::yaml;

pub(crate) fn b64(s: &str, name: &str, field: &str) -> Result<Vec<u8>> {
    let clean: String = s.split_whitespace().collect();
    base64::engine::general_purpose::STANDARD
        .decode(clean)
        .map_err(|e| Error::failed(format!("{name}: {field}: invalid base64: {e}")))
}

pub(crate) fn client_cert(cert_pem: &[u8], key_pem: &[u8], name: &str) -> Result<ClientCert> {
    let mut certs = Vec::new();
    for item in ureq::tls::parse_pem(cert_pem) {
        if let Ok(PemItem::Certificate(c)) = item {
            certs.push(c);
        }
    }
    if certs.is_empty() {
        return Err(Error::failed(format!(
            "{name}: client certificate holds no PEM certificate"
        )));
    }
    let key = ureq::tls::parse_pem(key_pem)
        .find_map(|i| match i {
            Ok(PemItem::PrivateKey(k)) => Some(k),
            _ => None,
        })
        .ok_or_else(|| Error::failed(format!("{name}: client key holds no PEM private key")))?;
    Ok(ClientCert::new_with_certs(&certs, key))
}

/// The fields of a kubeconfig that matter for one connection. Not `Debug`: it holds secrets.
#[derive(Default, PartialEq)]
pub struct Kubeconfig {
    pub server: String,
    pub(crate) ca_data: Option<String>,
    pub(crate) ca_file: Option<String>,
    pub(crate) cert_data: Option<String>,
    pub(crate) cert_file: Option<String>,
    pub(crate) key_data: Option<String>,
    pub(crate) key_file: Option<String>,
    pub(crate) token: Option<String>,
    pub(crate) token_file: Option<String>,
    /// `proxy-url` of the cluster: http or https.
    pub(crate) proxy: Option<String>,
    /// `tls-server-name`: the name TLS sends and checks instead of the server URL's host.
    pub(crate) tls_server_name: Option<String>,
    pub(crate) exec: Option<Exec>,
}

/// A `client.authentication.k8s.io` credential plugin (`users[].user.exec`).
#[derive(Debug, Default, PartialEq, Clone)]
pub(crate) struct Exec {
    pub(crate) api_version: String,
    pub(crate) command: String,
    pub(crate) args: Vec<String>,
    pub(crate) env: Vec<(String, String)>,
    pub(crate) install_hint: Option<String>,
    pub(crate) provide_cluster_info: bool,
}

/// Fields of the chosen cluster, user and context that nodestrap implements; any other one is
/// refused by name (a request without the credential kubectl would send is no answer).
const CLUSTER_FIELDS: &[&str] = &[
    "server",
    "certificate-authority",
    "certificate-authority-data",
    "proxy-url",
    "tls-server-name",
    "insecure-skip-tls-verify",
    "disable-compression",
    "extensions",
];
const USER_FIELDS: &[&str] = &[
    "client-certificate",
    "client-certificate-data",
    "client-key",
    "client-key-data",
    "token",
    "tokenFile",
    "exec",
    "extensions",
];
const CONTEXT_FIELDS: &[&str] = &["cluster", "user", "namespace", "extensions"];
const EXEC_FIELDS: &[&str] = &[
    "apiVersion",
    "command",
    "args",
    "env",
    "installHint",
    "provideClusterInfo",
    "interactiveMode",
];
/// The exec credential API versions kubectl 1.32 speaks (v1alpha1 is gone from it).
pub(crate) const EXEC_VERSIONS: &[&str] = &[
    "client.authentication.k8s.io/v1",
    "client.authentication.k8s.io/v1beta1",
];

/// Refuse any key of `y` outside `known`, naming it and where it is.
fn only_known(y: &yaml_rust2::Yaml, known: &[&str], name: &str, what: &str) -> Result<()> {
    let yaml_rust2::Yaml::Hash(h) = y else {
        return Ok(());
    };
    for k in h.keys() {
        let k = yaml::scalar(k).unwrap_or_default();
        if !known.contains(&k.as_str()) {
            return Err(Error::failed(format!(
                "{name}: {what}: field {:?} is not supported by nodestrap; refused rather than ignored",
                crate::error::excerpt(&k, 64)
            )));
        }
    }
    Ok(())
}

/// Both `FIELD` and `FIELD-data`: kubectl refuses such an entry, and so does nodestrap.
fn not_both(
    data: &Option<String>,
    file: &Option<String>,
    field: &str,
    name: &str,
    what: &str,
) -> Result<()> {
    if data.is_some() && file.is_some() {
        return Err(Error::failed(format!(
            "{name}: {what}: {field}-data and {field} are both set (kubectl refuses this too)"
        )));
    }
    Ok(())
}

impl std::fmt::Debug for Kubeconfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let redacted = |o: &Option<String>| o.as_ref().map(|_| "<redacted>");
        f.debug_struct("Kubeconfig")
            .field("server", &self.server)
            .field("ca_file", &self.ca_file)
            .field("cert_file", &self.cert_file)
            .field("key_data", &redacted(&self.key_data))
            .field("token", &redacted(&self.token))
            .finish_non_exhaustive()
    }
}

impl Kubeconfig {
    pub fn parse(text: &str, name: &str) -> Result<Kubeconfig> {
        let doc = yaml::parse(text, name)?;
        let named = |list: &str| -> Result<Vec<(String, &yaml_rust2::Yaml)>> {
            yaml::items(&doc[list], name, list)?
                .iter()
                .map(|e| Ok((yaml::opt_str(e, "name", name)?.unwrap_or_default(), e)))
                .collect()
        };
        let contexts = named("contexts")?;
        let clusters = named("clusters")?;
        let users = named("users")?;
        let current = yaml::opt_str(&doc, "current-context", name)?.filter(|c| !c.is_empty());
        let ctx = current_context(&contexts, current.as_deref(), name)?;
        let what_ctx = format!("context {:?}", ctx.0);
        only_known(&ctx.1["context"], CONTEXT_FIELDS, name, &what_ctx)?;
        let (cluster_name, user_name) = context_refs(ctx.1, name)?;
        let cluster = clusters
            .iter()
            .find(|(n, _)| *n == cluster_name)
            .ok_or_else(|| Error::failed(format!("{name}: cluster {cluster_name:?} not found")))?
            .1;
        let mut kc = Kubeconfig::cluster(&cluster["cluster"], &cluster_name, name)?;
        if !user_name.is_empty() {
            let user = users
                .iter()
                .find(|(n, _)| *n == user_name)
                .ok_or_else(|| Error::failed(format!("{name}: user {user_name:?} not found")))?
                .1;
            kc.user(&user["user"], &user_name, name)?;
        }
        Ok(kc)
    }

    /// A kubeconfig with the server and trust of cluster entry `c`, named `cluster_name`.
    fn cluster(c: &yaml_rust2::Yaml, cluster_name: &str, name: &str) -> Result<Kubeconfig> {
        let what_cluster = format!("cluster {cluster_name:?}");
        only_known(c, CLUSTER_FIELDS, name, &what_cluster)?;
        let server = yaml::opt_str(c, "server", name)?
            .filter(|s| !s.is_empty())
            .ok_or_else(|| {
                Error::failed(format!("{name}: cluster {cluster_name:?} has no server"))
            })?;
        if matches!(
            yaml::opt_str(c, "insecure-skip-tls-verify", name)?.as_deref(),
            Some("true")
        ) {
            return Err(Error::failed(format!(
                "{name}: {what_cluster}: insecure-skip-tls-verify is refused: name a certificate-authority"
            )));
        }
        let proxy = yaml::opt_str(c, "proxy-url", name)?.filter(|p| !p.is_empty());
        if let Some(p) = &proxy {
            if !(p.starts_with("http://") || p.starts_with("https://")) {
                return Err(Error::failed(format!(
                    "{name}: {what_cluster}: proxy-url {:?}: only http and https proxies are supported (not socks)",
                    crate::error::excerpt(p, 80)
                )));
            }
        }
        let tls_server_name = yaml::opt_str(c, "tls-server-name", name)?.filter(|t| !t.is_empty());
        if let Some(t) = &tls_server_name {
            if !dns_subdomain(t) {
                return Err(Error::failed(format!(
                    "{name}: {what_cluster}: tls-server-name {:?} is not a DNS name",
                    crate::error::excerpt(t, 80)
                )));
            }
            if proxy.is_some() {
                return Err(Error::failed(format!(
                    "{name}: {what_cluster}: tls-server-name together with proxy-url is not supported by nodestrap"
                )));
            }
        }
        let kc = Kubeconfig {
            server,
            ca_data: yaml::opt_str(c, "certificate-authority-data", name)?,
            ca_file: yaml::opt_str(c, "certificate-authority", name)?,
            proxy,
            tls_server_name,
            ..Default::default()
        };
        not_both(
            &kc.ca_data,
            &kc.ca_file,
            "certificate-authority",
            name,
            &what_cluster,
        )?;
        Ok(kc)
    }

    /// The credentials of user entry `u`, named `user_name`.
    fn user(&mut self, u: &yaml_rust2::Yaml, user_name: &str, name: &str) -> Result<()> {
        let what_user = format!("user {user_name:?}");
        only_known(u, USER_FIELDS, name, &what_user)?;
        self.cert_data = yaml::opt_str(u, "client-certificate-data", name)?;
        self.cert_file = yaml::opt_str(u, "client-certificate", name)?;
        self.key_data = yaml::opt_str(u, "client-key-data", name)?;
        self.key_file = yaml::opt_str(u, "client-key", name)?;
        self.token = yaml::opt_str(u, "token", name)?.filter(|t| !t.is_empty());
        self.token_file = yaml::opt_str(u, "tokenFile", name)?.filter(|t| !t.is_empty());
        not_both(
            &self.cert_data,
            &self.cert_file,
            "client-certificate",
            name,
            &what_user,
        )?;
        not_both(
            &self.key_data,
            &self.key_file,
            "client-key",
            name,
            &what_user,
        )?;
        self.exec = match &u["exec"] {
            yaml_rust2::Yaml::BadValue | yaml_rust2::Yaml::Null => None,
            e => Some(Exec::parse(e, name, &what_user)?),
        };
        Ok(())
    }
}

/// The context the kubeconfig's reader uses. client-go uses the context `current-context` names
/// and, without one, none at all. The one difference on purpose: Tectonic's kubeconfig has a
/// single context without a name and no current-context, and nodestrap takes that one.
fn current_context<'c, 'y>(
    contexts: &'c [(String, &'y yaml_rust2::Yaml)],
    current: Option<&str>,
    name: &str,
) -> Result<&'c (String, &'y yaml_rust2::Yaml)> {
    match (current, contexts) {
        (Some(c), _) => contexts.iter().find(|(n, _)| n == c).ok_or_else(|| {
            Error::failed(format!(
                "{name}: current-context {c:?} is not among the contexts"
            ))
        }),
        (None, [only]) if only.0.is_empty() => Ok(only),
        (None, _) => Err(Error::failed(format!(
            "{name}: no current-context, so kubectl would use no context (and no server); set current-context ({} contexts)",
            contexts.len()
        ))),
    }
}

impl Exec {
    fn parse(e: &yaml_rust2::Yaml, name: &str, what: &str) -> Result<Exec> {
        let what = format!("{what}: exec");
        only_known(e, EXEC_FIELDS, name, &what)?;
        let err = |m: String| Error::failed(format!("{name}: {what}: {m}"));
        let api_version = yaml::opt_str(e, "apiVersion", name)?.unwrap_or_default();
        if !EXEC_VERSIONS.contains(&api_version.as_str()) {
            return Err(err(format!(
                "apiVersion {:?}: expected one of {}",
                crate::error::excerpt(&api_version, 64),
                EXEC_VERSIONS.join(", ")
            )));
        }
        let command = yaml::opt_str(e, "command", name)?
            .filter(|c| !c.is_empty())
            .ok_or_else(|| err("no command".into()))?;
        let args = yaml::items(&e["args"], name, "exec.args")?
            .iter()
            .map(|a| yaml::scalar(a).ok_or_else(|| err("args must be strings".into())))
            .collect::<Result<Vec<_>>>()?;
        let mut env = Vec::new();
        for v in yaml::items(&e["env"], name, "exec.env")? {
            let k = yaml::opt_str(v, "name", name)?
                .ok_or_else(|| err("env entry without name".into()))?;
            let val = yaml::opt_str(v, "value", name)?.unwrap_or_default();
            env.push((k, val));
        }
        Ok(Exec {
            api_version,
            command,
            args,
            env,
            install_hint: yaml::opt_str(e, "installHint", name)?,
            provide_cluster_info: yaml::opt_str(e, "provideClusterInfo", name)?.as_deref()
                == Some("true"),
        })
    }
}

/// What an exec plugin answered.
pub(crate) enum ExecCredential {
    Token(String),
    /// Client certificate and key, PEM.
    Cert(Vec<u8>, Vec<u8>),
}

/// How long a plugin may take, and how much it may print.
const EXEC_TIMEOUT: Duration = Duration::from_secs(60);
const EXEC_OUTPUT_CAP: usize = 1 << 20;

/// Run the plugin as kubectl does: no shell, our environment plus its `env` and
/// `KUBERNETES_EXEC_INFO`, stdin closed (never interactive), stderr passed through; its stdout
/// is an `ExecCredential` of the same apiVersion. Any failure names the command.
pub(crate) fn run_exec(e: &Exec, kc: &Kubeconfig, name: &str) -> Result<ExecCredential> {
    let what = format!("{name}: exec plugin {:?}", e.command);
    let mut spec = serde_json::json!({"interactive": false});
    if e.provide_cluster_info {
        let mut cluster = serde_json::json!({"server": kc.server});
        if let Some(ca) = &kc.ca_data {
            cluster["certificate-authority-data"] = ca.clone().into();
        }
        if let Some(p) = &kc.proxy {
            cluster["proxy-url"] = p.clone().into();
        }
        spec["cluster"] = cluster;
    }
    let info =
        serde_json::json!({"apiVersion": e.api_version, "kind": "ExecCredential", "spec": spec});
    let mut env = e.env.clone();
    env.push(("KUBERNETES_EXEC_INFO".into(), info.to_string()));
    let c = Command {
        program: e.command.clone().into(),
        args: e.args.clone(),
        // Where kubectl runs it: in our working directory.
        cwd: std::env::current_dir().unwrap_or_else(|_| "/".into()),
        env: Env::Inherit(env),
        timeout: EXEC_TIMEOUT,
        grace: Duration::from_secs(1),
    };
    let ran = exec::capture(&c, &what, EXEC_OUTPUT_CAP).map_err(|err| {
        let hint = e
            .install_hint
            .as_deref()
            .map(|h| format!(" ({})", crate::error::excerpt(h.trim(), 200)))
            .unwrap_or_default();
        Error::failed(format!("{err}{hint}"))
    })?;
    if !ran.exit.success() {
        let said = crate::error::excerpt(ran.tail.trim(), 200);
        return Err(Error::failed(format!("{what}: {}: {said}", ran.exit)));
    }
    let out = ran.stdout;
    parse_exec_output(&out, &e.api_version, now_unix())
        .map_err(|m| Error::failed(format!("{what}: {m}")))
}

fn now_unix() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// An `ExecCredential` answer: its apiVersion must be the one asked for; a token, or a client
/// certificate and key; an `expirationTimestamp` in the past is refused.
pub(crate) fn parse_exec_output(
    out: &[u8],
    api_version: &str,
    now: i64,
) -> std::result::Result<ExecCredential, String> {
    let v: serde_json::Value = serde_json::from_slice(out).map_err(|e| {
        format!(
            "output is not JSON ({e}): \"{}\"",
            crate::error::excerpt(&String::from_utf8_lossy(out), 80)
        )
    })?;
    if v["apiVersion"] != api_version || v["kind"] != "ExecCredential" {
        return Err(format!(
            "answered {:?}/{:?}, expected {api_version}/ExecCredential",
            v["apiVersion"].as_str().unwrap_or(""),
            v["kind"].as_str().unwrap_or("")
        ));
    }
    let st = &v["status"];
    if let Some(t) = st["expirationTimestamp"].as_str() {
        let at = rfc3339(t).ok_or_else(|| {
            format!(
                "expirationTimestamp {:?} is not RFC 3339",
                crate::error::excerpt(t, 64)
            )
        })?;
        if at <= now {
            return Err(format!("its credential expired at {t}"));
        }
    }
    let s = |k: &str| st[k].as_str().filter(|x| !x.is_empty());
    match (s("token"), s("clientCertificateData"), s("clientKeyData")) {
        (Some(t), _, _) => Ok(ExecCredential::Token(t.to_string())),
        (None, Some(c), Some(k)) => Ok(ExecCredential::Cert(
            c.as_bytes().to_vec(),
            k.as_bytes().to_vec(),
        )),
        _ => Err("status has neither a token nor a client certificate and key".into()),
    }
}

/// Seconds since the epoch of an RFC 3339 time (`2026-11-24T01:02:03Z`, fractions and offsets
/// allowed).
pub fn rfc3339(t: &str) -> Option<i64> {
    let b = t.as_bytes();
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't' | b' ')
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let num = |r: std::ops::Range<usize>| t.get(r)?.parse::<i64>().ok();
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, se) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || se > 60 {
        return None;
    }
    let mut rest = &t[19..];
    if let Some(r) = rest.strip_prefix('.') {
        let n = r.bytes().take_while(u8::is_ascii_digit).count();
        if n == 0 {
            return None;
        }
        rest = &r[n..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        // ASCII first: a byte index inside a multi-byte character would panic.
        o if o.len() == 6
            && o.is_ascii()
            && (o.starts_with('+') || o.starts_with('-'))
            && &o[3..4] == ":" =>
        {
            let m = o[1..3].parse::<i64>().ok()? * 3600 + o[4..6].parse::<i64>().ok()? * 60;
            if o.starts_with('-') {
                -m
            } else {
                m
            }
        }
        _ => return None,
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let (y2, m2) = if mo <= 2 {
        (y - 1, mo + 9)
    } else {
        (y, mo - 3)
    };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let doy = (153 * m2 + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + h * 3600 + mi * 60 + se - offset)
}

fn context_refs(ctx: &yaml_rust2::Yaml, name: &str) -> Result<(String, String)> {
    let c = &ctx["context"];
    let cluster = yaml::opt_str(c, "cluster", name)?.unwrap_or_default();
    let user = yaml::opt_str(c, "user", name)?.unwrap_or_default();
    Ok((cluster, user))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_output_and_rfc3339() {
        assert_eq!(rfc3339("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(rfc3339("2026-11-24T01:02:03Z"), Some(1_795_482_123));
        assert_eq!(rfc3339("2026-11-24T02:02:03.5+01:00"), Some(1_795_482_123));
        for bad in [
            "2026-11-24",
            "2026-13-01T00:00:00Z",
            "2026-11-24T01:02:03",
            "x",
        ] {
            assert_eq!(rfc3339(bad), None, "{bad}");
        }
        let v = "client.authentication.k8s.io/v1";
        let ok = format!(
            r#"{{"apiVersion":"{v}","kind":"ExecCredential","status":{{"token":"t","expirationTimestamp":"2026-11-24T01:02:03Z"}}}}"#
        );
        assert!(
            matches!(parse_exec_output(ok.as_bytes(), v, 0), Ok(ExecCredential::Token(t)) if t == "t")
        );
        let e = parse_exec_output(ok.as_bytes(), v, 1_795_482_123)
            .err()
            .unwrap();
        assert!(e.contains("expired at 2026-11-24T01:02:03Z"), "{e}");
        let e = parse_exec_output(ok.as_bytes(), "client.authentication.k8s.io/v1beta1", 0)
            .err()
            .unwrap();
        assert!(
            e.contains("expected client.authentication.k8s.io/v1beta1/ExecCredential"),
            "{e}"
        );
        let e = parse_exec_output(b"token please", v, 0).err().unwrap();
        assert!(e.contains("output is not JSON"), "{e}");
    }

    #[test]
    fn tectonic_unnamed_context() {
        let t = "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    server: https://10.0.0.1:443\n    certificate-authority-data: Zm9v\nusers:\n- name: kubelet\n  user:\n    client-certificate-data: YQ==\n    client-key-data: Yg==\ncontexts:\n- context:\n    cluster: local\n    user: kubelet\n";
        let kc = Kubeconfig::parse(t, "kc").unwrap();
        assert_eq!(kc.server, "https://10.0.0.1:443");
        assert_eq!(kc.ca_data.as_deref(), Some("Zm9v"));
        assert_eq!(kc.key_data.as_deref(), Some("Yg=="));
    }

    #[test]
    fn current_context_and_errors() {
        let t = "clusters:\n- name: a\n  cluster: {server: 'https://a'}\n- name: b\n  cluster: {server: 'https://b', certificate-authority: ca.pem}\nusers:\n- name: u\n  user: {token: s3cret}\ncontexts:\n- name: x\n  context: {cluster: a, user: u}\n- name: y\n  context: {cluster: b, user: u}\ncurrent-context: y\n";
        let kc = Kubeconfig::parse(t, "kc").unwrap();
        assert_eq!(kc.server, "https://b");
        assert_eq!(kc.ca_file.as_deref(), Some("ca.pem"));
        assert_eq!(kc.token.as_deref(), Some("s3cret"));
        let no_current = t.replace("current-context: y\n", "");
        assert!(Kubeconfig::parse(&no_current, "kc")
            .unwrap_err()
            .to_string()
            .contains("no current-context, so kubectl would use no context"));
        assert!(Kubeconfig::parse("clusters: 5\n", "kc").is_err());
        assert!(Kubeconfig::parse("{", "kc")
            .unwrap_err()
            .to_string()
            .contains("kc: invalid YAML"));
    }
}
