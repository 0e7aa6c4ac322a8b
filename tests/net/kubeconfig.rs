//! A kubeconfig means what kubectl says it means: a table of kubeconfigs, each read by the real
//! kubectl (Debian 13's, which .ci/setup unpacks to /usr/local/lib/nodestrap-ci/kubectl) and by
//! `nodestrap bootstrap`, against one stand-in API server (real TLS, a client CA made at test
//! time; no API server package exists here). For each: do both reach the server, and with the
//! same credential? Where nodestrap differs on purpose (docs/bootstrap.md), the test says so.

#[path = "../support/mod.rs"]
mod support;

use std::path::{Path, PathBuf};

use base64::Engine as _;
use support::*;

const VERSION: &str = "v1.10.2+coreos.0";

fn kubectl() -> String {
    let k = support::vars::kubectl();
    assert!(
        Path::new(&k).exists(),
        "kubectl oracle {k} is missing: .ci/setup installs it"
    );
    k
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

struct World {
    root: PathBuf,
    ca: Ca,
    client_ca: Ca,
    api: Server,
}

/// What a client did: reached the server (and what it presented), or failed.
#[derive(Debug, PartialEq)]
enum Outcome {
    Reached { bearer: Option<String>, cert: bool },
    Failed,
}

impl World {
    fn new() -> World {
        let root = unique_dir("kcroot");
        let ca = Ca::new("kubeconfig test CA");
        let client_ca = Ca::new("kube client CA");
        let api = Server::start(&ca.server(), None);
        api.set(
            "/version",
            Reply::ok(format!(
                r#"{{"major":"1","minor":"10","gitVersion":"{VERSION}","platform":"linux/amd64"}}"#
            )),
        );
        write_under(
            &root,
            "/usr/lib/os-release",
            "ID=flatcar\nVERSION_ID=2345.3.0\nCOREOS_BOARD=amd64-usr\n",
        );
        write_under(
            &root,
            "/etc/kubernetes/installer/kubelet.env",
            "KUBELET_IMAGE_TAG=v1.9.6_coreos.0\n",
        );
        World {
            root,
            ca,
            client_ca,
            api,
        }
    }

    fn dir(&self) -> PathBuf {
        under(&self.root, "/etc/kubernetes")
    }

    /// The kubeconfig, with `{server}`, `{ca}` (base64 PEM), `{dir}` filled in.
    fn write(&self, text: &str) {
        let t = text
            .replace("{server}", &self.api.url(""))
            .replace("{ca}", &b64(&self.ca.pem))
            .replace("{dir}", &self.dir().display().to_string());
        write_under(&self.root, "/etc/kubernetes/kubeconfig", &t);
    }

    /// A file next to the kubeconfig; its name, relative, as both readers resolve it (the
    /// kubeconfig's own folder; nodestrap: under --root).
    fn file(&self, name: &str, content: &str) -> String {
        let p = self.dir().join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, content).unwrap();
        name.to_string()
    }

    fn last_request(&self, before: usize) -> Outcome {
        let seen = self.api.seen();
        match seen.get(before..).and_then(|s| s.last()) {
            Some(s) => Outcome::Reached {
                bearer: s
                    .header("authorization")
                    .and_then(|a| a.strip_prefix("Bearer "))
                    .map(str::to_string),
                cert: s.client_cert,
            },
            None => Outcome::Failed,
        }
    }

    fn kubectl(&self) -> (Outcome, String) {
        let before = self.api.seen().len();
        let out = std::process::Command::new(kubectl())
            .arg("--kubeconfig")
            .arg(self.dir().join("kubeconfig"))
            // No --request-timeout: it would add `?timeout=` to the path the stand-in routes on.
            .args(["get", "--raw", "/version"])
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", &self.root)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        match out.status.success() {
            true => (self.last_request(before), err),
            false => (Outcome::Failed, err),
        }
    }

    fn nodestrap(&self) -> (Outcome, Run) {
        let before = self.api.seen().len();
        let r = nodestrap(
            &[
                "bootstrap".into(),
                format!("--root={}", self.root.display()),
                "--torcx-skip-setup".into(),
                "--upgrade-os=false".into(),
                "--dry-run".into(),
                "--api-tries=1".into(),
            ],
            None,
            &[],
        );
        let used_api = r.stderr.contains(&format!("Kubernetes version {VERSION}"));
        match r.code == 0 && used_api {
            true => (self.last_request(before), r),
            false => (Outcome::Failed, r),
        }
    }

    /// kubectl and nodestrap agree; the outcome.
    fn agree(&self, case: &str) -> Outcome {
        let (k, kerr) = self.kubectl();
        let (n, r) = self.nodestrap();
        assert_eq!(
            n, k,
            "{case}: nodestrap and kubectl disagree\nkubectl:\n{kerr}\nnodestrap:\n{}",
            r.stderr
        );
        n
    }
}

fn reached(bearer: Option<&str>, cert: bool) -> Outcome {
    Outcome::Reached {
        bearer: bearer.map(str::to_string),
        cert,
    }
}

const HEAD: &str = "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\n";

fn with_user(user: &str) -> String {
    format!("{HEAD}users:\n- name: u\n  user:\n{user}contexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n")
}

#[test]
fn tokens_token_files_and_conflicting_files_as_kubectl() {
    let w = World::new();
    w.write(&with_user("    token: from-the-kubeconfig\n"));
    assert_eq!(
        w.agree("token"),
        reached(Some("from-the-kubeconfig"), false)
    );

    // tokenFile wins over token.
    let f = w.file("token", "from-the-file\n");
    w.write(&with_user(&format!(
        "    token: from-the-kubeconfig\n    tokenFile: {f}\n"
    )));
    assert_eq!(w.agree("tokenFile"), reached(Some("from-the-file"), false));

    // A CA both as data and as file: kubectl refuses, nodestrap too, by name.
    let ca = w.file("ca.pem", &w.ca.pem);
    w.write(&format!("{HEAD}    certificate-authority: {ca}\nusers:\n- name: u\n  user: {{token: t}}\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n"));
    assert_eq!(w.agree("CA data and file"), Outcome::Failed);
    w.nodestrap().1.assert_fails(
        1,
        "certificate-authority-data and certificate-authority are both set",
    );

    // A client certificate both ways: the same.
    let leaf = w.client_ca.client("system:node:x");
    let cert = w.file("c.crt", &leaf.cert_pem);
    w.write(&with_user(&format!(
        "    client-certificate: {cert}\n    client-certificate-data: {}\n    client-key-data: {}\n",
        b64(&leaf.cert_pem),
        b64(&leaf.key_pem)
    )));
    assert_eq!(w.agree("cert data and file"), Outcome::Failed);
}

#[test]
fn contexts_as_client_go_chooses_them() {
    let w = World::new();
    let other = Server::start(&w.ca.server(), None);
    other.set("/version", Reply::status(500));
    // current-context names the second context.
    let two = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: a\n  cluster: {{server: '{}', certificate-authority-data: {ca}}}\n- name: b\n  cluster: {{server: '{}', certificate-authority-data: {ca}}}\nusers:\n- name: u\n  user: {{token: t}}\ncontexts:\n- name: ctx-a\n  context: {{cluster: a, user: u}}\n- name: ctx-b\n  context: {{cluster: b, user: u}}\n",
        other.url(""),
        w.api.url(""),
        ca = b64(&w.ca.pem),
    );
    // (Not `y`: YAML 1.1, which kubectl reads, takes an unquoted y for a boolean.)
    w.write(&format!("{two}current-context: ctx-b\n"));
    assert_eq!(w.agree("current-context ctx-b"), reached(Some("t"), false));
    assert!(other.seen().is_empty(), "context ctx-a's server was asked");
    // Without current-context client-go uses no context at all: both fail.
    w.write(&two);
    assert_eq!(w.agree("no current-context"), Outcome::Failed);
    // One named context without current-context: still none for kubectl, and for nodestrap.
    w.write(&format!(
        "{HEAD}users:\n- name: u\n  user: {{token: t}}\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\n"
    ));
    assert_eq!(w.agree("one named context"), Outcome::Failed);

    // Tectonic's single unnamed context: the empty current-context names it, for kubectl too.
    w.write(&format!(
        "{HEAD}users:\n- name: u\n  user: {{token: t}}\ncontexts:\n- context: {{cluster: c, user: u}}\n"
    ));
    assert_eq!(
        w.agree("Tectonic's unnamed context"),
        reached(Some("t"), false)
    );
}

#[test]
fn proxies_and_verification_as_kubectl_or_refused_by_name() {
    let w = World::new();
    let proxy = Proxy::start();
    w.write(&format!(
        "{HEAD}    proxy-url: http://127.0.0.1:{}\nusers:\n- name: u\n  user: {{token: t}}\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n",
        proxy.port
    ));
    assert_eq!(w.agree("proxy-url http"), reached(Some("t"), false));
    let target = format!("127.0.0.1:{}", w.api.port);
    assert_eq!(
        proxy.targets.lock().unwrap().clone(),
        vec![target.clone(), target],
        "both went through the proxy"
    );

    // socks: refused by name (kubectl tries it and finds no SOCKS server: both fail).
    w.write(&format!(
        "{HEAD}    proxy-url: socks5://127.0.0.1:{}\nusers:\n- name: u\n  user: {{token: t}}\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n",
        dead_port()
    ));
    assert_eq!(w.agree("proxy-url socks5"), Outcome::Failed);
    w.nodestrap()
        .1
        .assert_fails(1, "only http and https proxies are supported (not socks)");

    // The difference on purpose: kubectl skips verification, nodestrap refuses by name.
    w.write(&format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n    insecure-skip-tls-verify: true\nusers:\n- name: u\n  user: {{token: t}}\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n",
        w.api.url("")
    ));
    assert_eq!(w.kubectl().0, reached(Some("t"), false));
    w.nodestrap()
        .1
        .assert_fails(1, "insecure-skip-tls-verify is refused");

    // Fields nodestrap does not implement are refused by name, never ignored.
    for (field, yaml) in [
        (
            "auth-provider",
            "    auth-provider: {name: oidc, config: {id-token: x}}\n",
        ),
        ("username", "    username: admin\n    password: secret\n"),
        ("as", "    as: someone-else\n"),
    ] {
        w.write(&with_user(yaml));
        w.nodestrap().1.assert_fails(
            1,
            &format!("field \"{field}\" is not supported by nodestrap"),
        );
    }
}

/// An exec plugin that checks what kubectl documents it gets, then answers `answer`.
fn plugin(w: &World, name: &str, api_version: &str, answer: &str) -> String {
    w.file(
        name,
        &format!(
            "#!/bin/sh\n\
             case \"$KUBERNETES_EXEC_INFO\" in *'\"apiVersion\":\"{api_version}\"'*) ;; *) echo \"bad KUBERNETES_EXEC_INFO: $KUBERNETES_EXEC_INFO\" >&2; exit 3;; esac\n\
             [ \"$PLUGIN_ENV\" = from-kubeconfig ] || {{ echo 'env missing' >&2; exit 4; }}\n\
             [ \"$1\" = --flag ] || {{ echo 'args missing' >&2; exit 5; }}\n\
             cat <<'EOF'\n{answer}\nEOF\n"
        ),
    );
    let p = w.dir().join(name);
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    // Relative with a slash: both resolve it against the kubeconfig's folder.
    format!("./{name}")
}

fn exec_user(cmd: &str, api_version: &str) -> String {
    with_user(&format!(
        "    exec:\n      apiVersion: {api_version}\n      command: {cmd}\n      args: [--flag]\n      env: [{{name: PLUGIN_ENV, value: from-kubeconfig}}]\n      installHint: install the plugin from your admin\n      interactiveMode: Never\n"
    ))
}

#[test]
fn exec_plugins_as_kubectl_runs_them() {
    let w = World::new();
    for v in [
        "client.authentication.k8s.io/v1",
        "client.authentication.k8s.io/v1beta1",
    ] {
        let p = plugin(
            &w,
            "token-plugin",
            v,
            &format!(
                r#"{{"apiVersion":"{v}","kind":"ExecCredential","status":{{"token":"from-the-plugin","expirationTimestamp":"2999-01-01T00:00:00Z"}}}}"#
            ),
        );
        w.write(&exec_user(&p, v));
        assert_eq!(w.agree(v), reached(Some("from-the-plugin"), false));
    }

    // A client certificate from the plugin, presented to a server that requires one.
    let api = Server::start(&w.ca.server(), Some(&w.client_ca));
    api.set(
        "/version",
        Reply::ok(format!(r#"{{"gitVersion":"{VERSION}"}}"#)),
    );
    let leaf = w.client_ca.client("system:node:x");
    let v = "client.authentication.k8s.io/v1";
    let answer = serde_json::json!({"apiVersion": v, "kind": "ExecCredential",
        "status": {"clientCertificateData": leaf.cert_pem, "clientKeyData": leaf.key_pem}});
    let p = plugin(&w, "cert-plugin", v, &answer.to_string());
    w.write(&exec_user(&p, v).replace("{server}", &api.url("")));
    let (k, kerr) = w.kubectl();
    // `Failed` here only says that w.api was not asked: the other server was, with the cert.
    assert_eq!(k, Outcome::Failed, "{kerr}");
    assert!(api.seen().iter().any(|s| s.client_cert), "kubectl: {kerr}");
    let before = api.seen().len();
    let (_, r) = w.nodestrap();
    r.assert_ok();
    assert!(api.seen()[before..].iter().any(|s| s.client_cert));

    // A missing plugin and a failing one: both fail; nodestrap names the command and the hint.
    w.write(&exec_user("/nonexistent/plugin", v));
    assert_eq!(w.agree("missing plugin"), Outcome::Failed);
    w.nodestrap()
        .1
        .assert_fails(1, "exec plugin \"/nonexistent/plugin\": cannot run it");
    w.file(
        "failing",
        "#!/bin/sh\necho 'no credentials for you' >&2\nexit 1\n",
    );
    {
        use std::os::unix::fs::PermissionsExt;
        let p = w.dir().join("failing");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    w.write(&exec_user("./failing", v));
    assert_eq!(w.agree("failing plugin"), Outcome::Failed);
    w.nodestrap()
        .1
        .assert_fails(1, "/etc/kubernetes/./failing\": exit status 1");

    // An expired credential is refused, never sent.
    let p = plugin(
        &w,
        "expired",
        v,
        &format!(
            r#"{{"apiVersion":"{v}","kind":"ExecCredential","status":{{"token":"old","expirationTimestamp":"2001-01-01T00:00:00Z"}}}}"#
        ),
    );
    w.write(&exec_user(&p, v));
    let (n, r) = w.nodestrap();
    assert_eq!(n, Outcome::Failed);
    r.assert_fails(1, "its credential expired at 2001-01-01T00:00:00Z");
    assert!(!w
        .api
        .seen()
        .iter()
        .any(|s| s.header("authorization") == Some("Bearer old")));
}

#[test]
fn tls_server_name_is_the_name_checked_as_kubectl_checks_it() {
    let w = World::new();
    // A server whose certificate names only api.cluster.internal, reached at 127.0.0.1.
    let mut p = rcgen::CertificateParams::new(vec!["api.cluster.internal".to_string()]).unwrap();
    p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let api = Server::start(&w.ca.issue(p), None);
    api.set(
        "/version",
        Reply::ok(format!(r#"{{"gitVersion":"{VERSION}"}}"#)),
    );
    let kc = |extra: &str| {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n    certificate-authority-data: {}\n{extra}users:\n- name: u\n  user: {{token: t}}\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n",
            api.url(""),
            b64(&w.ca.pem)
        )
    };
    // Without it, the certificate does not name 127.0.0.1: both refuse the server.
    w.write(&kc(""));
    let (k, kerr) = w.kubectl();
    assert!(api.seen().is_empty(), "{kerr}");
    assert_eq!(k, Outcome::Failed);
    let (n, r) = w.nodestrap();
    assert_eq!(n, Outcome::Failed);
    assert!(
        r.stderr
            .contains("certificate not valid for name \"127.0.0.1\""),
        "{}",
        r.stderr
    );
    assert!(api.seen().is_empty());
    // With it, both reach the server, with the server's own Host header.
    w.write(&kc("    tls-server-name: api.cluster.internal\n"));
    let (_, kerr) = w.kubectl();
    let k_seen = api.seen();
    assert_eq!(k_seen.len(), 1, "kubectl: {kerr}");
    let (_, r) = w.nodestrap();
    r.assert_ok();
    let n_seen = api.seen();
    assert_eq!(n_seen.len(), 2, "{}", r.stderr);
    for s in [&k_seen[0], &n_seen[1]] {
        assert_eq!(s.header("authorization"), Some("Bearer t"));
    }
    assert_eq!(
        n_seen[1].header("host"),
        k_seen[0].header("host"),
        "the Host header as kubectl sends it"
    );
}
