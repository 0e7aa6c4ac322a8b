//! join-service's ticket ledger in the cluster (docs/join-service.md, "The ledger"), against the
//! real API server of tests/support/cluster.rs: deploy/join-service.yaml applied as it ships,
//! join-service instances that authenticate as its ServiceAccount (a token from the
//! TokenRequest API) with its RBAC, the real `kubeadm token create` as their token command, a
//! herd of real `activate` nodes, and raw clients that ask every instance at once. The tests
//! run one at a time: they share the ledger's namespace, and one stops the API server.

#[path = "../support/mod.rs"]
mod support;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::{Arc, Barrier, Mutex, OnceLock};
use std::time::{Duration, Instant};

use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose};
use support::cluster::{cluster, free_port, Cluster};
use support::*;

const NS: &str = "nodestrap-join";
const SELECTOR: &str = "app.kubernetes.io/managed-by=nodestrap-join-service";
const TOKEN_TYPE: &str = "type=bootstrap.kubernetes.io/token";
/// What the join services tell a node to wait when the ledger cannot be asked.
const TRY_LATER: f64 = 10.0;
/// --token-timeout of the instances: a claim whose instance died is free again after it plus
/// 40 s (the answer's 10 s, the margin's 30).
const TOKEN_TIMEOUT: u64 = 5;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Activate nodes per herd: 500, or NODESTRAP_LEDGER_NODES.
fn herd_size() -> usize {
    support::vars::ledger_nodes()
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn executable(path: &Path, text: &str) {
    write(path, text);
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

fn kube_bin() -> PathBuf {
    support::vars::kube_bin()
}

/// A certificate for both ends of TLS, as node identities are.
fn identity(ca: &Ca, cn: &str) -> Leaf {
    let mut p =
        CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
    p.distinguished_name.push(DnType::CommonName, cn);
    p.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    ca.issue(p)
}

/// kubeadm's discovery-hash form of a certificate's key, computed by openssl.
fn spki_hash(pem: &str) -> String {
    let dir = unique_dir("spki");
    let f = dir.join("c.pem");
    write(&f, pem);
    let h = openssl_spki_hash(&f);
    let _ = std::fs::remove_dir_all(&dir);
    h
}

// ---------------------------------------------------------------------------------------------
// The cluster side: the manifest, the service account, the token command

struct Env {
    cluster: &'static Cluster,
    /// The ServiceAccount's token and the cluster CA, where a pod has them.
    sa_dir: PathBuf,
    /// kubeadm's kubeconfig: the API server with the ServiceAccount's token.
    kubeconfig: PathBuf,
    /// The node-provisioning CA (node identities).
    nodes: Ca,
    admin: Ca,
}

/// deploy/join-service.yaml applied, once per test binary.
fn env() -> &'static Env {
    static E: OnceLock<Env> = OnceLock::new();
    E.get_or_init(|| {
        let c = cluster();
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/join-service.yaml");
        c.apply(&std::fs::read_to_string(manifest).unwrap());
        let token = c
            .kubectl(&[
                "-n",
                "kube-system",
                "create",
                "token",
                "nodestrap-join-service",
                "--duration",
                "4h",
            ])
            .trim()
            .to_string();
        let dir = unique_dir("ledger-env");
        let sa_dir = dir.join("serviceaccount");
        write(&sa_dir.join("token"), &token);
        write(&sa_dir.join("ca.crt"), &c.ca.pem);
        let kubeconfig = dir.join("kubeadm.kubeconfig");
        write(
            &kubeconfig,
            &format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n    certificate-authority: {}\nusers:\n- name: u\n  user:\n    tokenFile: {}\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n",
                c.url,
                sa_dir.join("ca.crt").display(),
                sa_dir.join("token").display()
            ),
        );
        Env {
            cluster: c,
            sa_dir,
            kubeconfig,
            nodes: Ca::new("ledger node-provisioning CA"),
            admin: Ca::new("ledger admin CA"),
        }
    })
}

impl Env {
    /// No ticket records and no bootstrap tokens: each test counts its own.
    fn clean(&self) {
        let c = self.cluster;
        c.kubectl(&[
            "-n",
            NS,
            "delete",
            "configmaps",
            "-l",
            SELECTOR,
            "--wait=false",
        ]);
        c.kubectl(&[
            "-n",
            "kube-system",
            "delete",
            "secrets",
            "--field-selector",
            TOKEN_TYPE,
            "--wait=false",
        ]);
    }

    /// The ticket records, by identity.
    fn records(&self) -> BTreeMap<String, serde_json::Value> {
        let out =
            self.cluster
                .kubectl(&["-n", NS, "get", "configmaps", "-l", SELECTOR, "-o", "json"]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|cm| {
                let id = cm["data"]["identity"].as_str().unwrap().to_string();
                assert_eq!(
                    cm["metadata"]["name"].as_str().unwrap(),
                    format!("ticket-{}", id.strip_prefix("sha256:").unwrap())
                );
                (id, cm["data"].clone())
            })
            .collect()
    }

    /// The bootstrap tokens in the cluster: their IDs.
    fn token_ids(&self) -> BTreeSet<String> {
        let out = self.cluster.kubectl(&[
            "-n",
            "kube-system",
            "get",
            "secrets",
            "--field-selector",
            TOKEN_TYPE,
            "-o",
            "json",
        ]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                let id = s["data"]["token-id"].as_str().unwrap();
                String::from_utf8(
                    std::process::Command::new("base64")
                        .arg("-d")
                        .stdin(Stdio::piped())
                        .stdout(Stdio::piped())
                        .spawn()
                        .and_then(|mut ch| {
                            ch.stdin.take().unwrap().write_all(id.as_bytes())?;
                            ch.wait_with_output()
                        })
                        .unwrap()
                        .stdout,
                )
                .unwrap()
            })
            .collect()
    }
}

// ---------------------------------------------------------------------------------------------
// Join-service instances

/// One join-service instance (a control-plane node's), its log lines with their arrival times.
struct Instance {
    name: String,
    port: u16,
    root: PathBuf,
    args: Vec<String>,
    child: Option<Child>,
    lines: Arc<Mutex<Vec<(Instant, String)>>>,
}

/// An instance's root: its serving certificate (from the cluster CA nodes pin), the
/// node-provisioning CA, the cluster CA.
fn instance_root(e: &Env, name: &str) -> PathBuf {
    let root = unique_dir(&format!("ledger-{name}")).join("root");
    let tls = e.cluster.ca.server();
    let js = root.join("etc/nodestrap/join-service");
    write(&js.join("tls.crt"), &tls.cert_pem);
    write(&js.join("tls.key"), &tls.key_pem);
    write(&js.join("node-ca.crt"), &e.nodes.pem);
    write(&root.join("etc/kubernetes/pki/ca.crt"), &e.cluster.ca.pem);
    root
}

impl Instance {
    fn new(e: &Env, name: &str, token_command: &str, extra: &[&str]) -> Instance {
        let root = instance_root(e, name);
        let port = free_port();
        let mut args = s(&[
            "join-service",
            "--api-server-endpoint",
            "127.0.0.1:6443",
            "--cluster-name",
            "ledger",
            "--kubernetes-version",
            "v1.37.2",
            "--token-timeout",
            &TOKEN_TIMEOUT.to_string(),
            "--instance",
            name,
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--root",
            &root.display().to_string(),
            "--token-command",
            token_command,
        ]);
        args.extend(extra.iter().map(|x| x.to_string()));
        let mut i = Instance {
            name: name.to_string(),
            port,
            root,
            args,
            child: None,
            lines: Default::default(),
        };
        i.start(e);
        i
    }

    /// Start (again), and wait until it listens.
    fn start(&mut self, e: &Env) {
        // (A restart's lines follow the earlier run's.)
        let seen = self.lines.lock().unwrap().len();
        let url = e.cluster.url.strip_prefix("https://").unwrap();
        let (host, port) = url.rsplit_once(':').unwrap();
        let mut child = command(&self.args, None)
            .env("KUBERNETES_SERVICE_HOST", host)
            .env("KUBERNETES_SERVICE_PORT", port)
            .env("NODESTRAP_SA_DIR", &e.sa_dir)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let err = child.stderr.take().unwrap();
        let lines = self.lines.clone();
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines() {
                let Ok(l) = l else { break };
                lines.lock().unwrap().push((Instant::now(), l));
            }
        });
        self.child = Some(child);
        let end = Instant::now() + Duration::from_secs(150);
        let mark = format!("listening on 127.0.0.1:{}", self.port);
        let listening = |lines: &[(Instant, String)]| {
            lines[seen.min(lines.len())..]
                .iter()
                .any(|(_, l)| l.contains(&mark))
        };
        while !listening(&self.lines.lock().unwrap()) {
            if let Some(st) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("{} exited ({st}):\n{}", self.name, self.log());
            }
            assert!(
                Instant::now() < end,
                "{} not listening:\n{}",
                self.name,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn log(&self) -> String {
        let l = self.lines.lock().unwrap();
        l.iter()
            .map(|(_, x)| x.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, and the exit status within 30 s.
    fn stop(&mut self) -> std::process::ExitStatus {
        let mut c = self.child.take().unwrap();
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        exit_within(&mut c, 30, || {
            format!("{}, SIGTERM'd:\n{}", self.name, self.log())
        })
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        self.kill9();
    }
}

fn kubeadm_token_command(e: &Env) -> String {
    format!(
        "{} token create --kubeconfig {} --ttl 15m0s",
        kube_bin().join("kubeadm").display(),
        e.kubeconfig.display()
    )
}

fn three(e: &Env) -> Vec<Instance> {
    let cmd = kubeadm_token_command(e);
    (1..=3)
        .map(|n| Instance::new(e, &format!("cp-{n}"), &cmd, &[]))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Clients

/// POST /v1/ticket as `leaf`, trusting `ca`: (status, JSON body with the answer's Retry-After
/// as `retry_after`).
fn ask(port: u16, ca: &Ca, leaf: &Leaf) -> Result<(u16, serde_json::Value), String> {
    let (status, head, mut v) = mtls_post(port, ca, leaf, "/v1/ticket", "{}", &|| {})?;
    let header = |name: &str| {
        head.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
    };
    if let Some(ra) = header("Retry-After: ") {
        // Delay-seconds, or an appointment: a date, measured from the answer's Date.
        v["retry_after"] = match ra.parse::<u64>() {
            Ok(secs) => secs.into(),
            Err(_) => {
                let at = httpdate::parse_http_date(ra).unwrap();
                let date = httpdate::parse_http_date(header("Date: ").unwrap()).unwrap();
                v["appointment"] = true.into();
                at.duration_since(date).unwrap_or_default().as_secs().into()
            }
        };
    }
    Ok((status, v))
}

/// A raw client that asks all instances at once, again (all at once) until one answers with a
/// ticket, every 2 s or at the earliest slot an instance gave it: (each round's statuses, the
/// token it got).
fn ask_everyone(ports: &[u16], e: &Env, leaf: &Leaf) -> (Vec<Vec<u16>>, String) {
    let mut rounds = Vec::new();
    for _ in 0..100 {
        let barrier = Arc::new(Barrier::new(ports.len()));
        let answers: Vec<_> = std::thread::scope(|sc| {
            let hs: Vec<_> = ports
                .iter()
                .map(|p| {
                    let b = barrier.clone();
                    sc.spawn(move || {
                        b.wait();
                        ask(*p, &e.cluster.ca, leaf)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let statuses: Vec<u16> = answers
            .iter()
            .map(|a| a.as_ref().map(|x| x.0).unwrap_or(0))
            .collect();
        rounds.push(statuses);
        let slot = answers
            .iter()
            .flatten()
            .filter(|(_, v)| v["appointment"] == true)
            .filter_map(|(_, v)| v["retry_after"].as_u64())
            .min();
        let tickets: Vec<_> = answers
            .into_iter()
            .flatten()
            .filter(|(st, _)| *st == 200)
            .collect();
        if let Some((_, t)) = tickets.first() {
            return (rounds, t["token"].as_str().unwrap().to_string());
        }
        let pause = slot.map(|s| Duration::from_secs(s) + Duration::from_millis(500));
        std::thread::sleep(pause.unwrap_or(Duration::from_secs(2)));
    }
    panic!("no ticket after 100 rounds: {rounds:?}");
}

/// A fresh node running `activate` against `endpoints`; its stand-in `kubeadm join` copies
/// the join configuration (the token in it) to `joined.yaml` beside the node's root.
struct Node {
    cn: String,
    dir: PathBuf,
    leaf: Leaf,
    child: Child,
}

fn stand_ins(dir: &Path) -> (PathBuf, PathBuf) {
    let kubeadm = dir.join("kubeadm");
    executable(
        &kubeadm,
        "#!/bin/sh\n# Stand-in kubeadm join: keep the join configuration beside the node's root.\n\
         [ \"$1\" = join ] || exit 1\ncp \"$3\" \"${3%/root/run/nodestrap/kubeadm-join.yaml}/joined.yaml\"\n",
    );
    let kubelet = dir.join("kubelet-start");
    executable(&kubelet, "#!/bin/sh\nexit 0\n");
    (kubeadm, kubelet)
}

fn secret_hash() -> &'static str {
    static H: OnceLock<String> = OnceLock::new();
    H.get_or_init(|| {
        let out = std::process::Command::new("python3")
            .args([
                "-c",
                "import hashlib,base64; print('pbkdf2_sha256$1000$salt-x$' + base64.b64encode(hashlib.pbkdf2_hmac('sha256', b'unused-init-secret-0123456789', b'salt-x', 1000)).decode())",
            ])
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap()
    })
}

impl Node {
    fn start(
        e: &Env,
        base: &Path,
        i: usize,
        endpoints: &[String],
        bin: &(PathBuf, PathBuf),
    ) -> Node {
        let cn = format!("herd-{i}");
        let dir = base.join(&cn);
        let root = dir.join("root");
        let leaf = identity(&e.nodes, &cn);
        let a = root.join("etc/nodestrap/activate");
        write(&a.join("node.crt"), &leaf.cert_pem);
        write(&a.join("node.key"), &leaf.key_pem);
        write(&a.join("admin-ca.crt"), &e.admin.pem);
        write(&a.join("cluster-ca.crt"), &e.cluster.ca.pem);
        write(&a.join("init-secret.hash"), secret_hash());
        // Each node starts its round at another instance: the herd spreads over the three.
        let mut eps = endpoints.to_vec();
        eps.rotate_left(i % endpoints.len());
        let args = vec![
            "activate".to_string(),
            "--root".into(),
            root.display().to_string(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--join-endpoints".into(),
            eps.join(","),
            "--join-interval".into(),
            "2".into(),
            "--join-timeout".into(),
            "60".into(),
            "--kubeadm".into(),
            bin.0.display().to_string(),
            "--kubelet-command".into(),
            bin.1.display().to_string(),
        ];
        let log = std::fs::File::create(dir.join("activate.log")).unwrap();
        let child = command(&args, None)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        Node {
            cn,
            dir,
            leaf,
            child,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("activate.log")).unwrap_or_default()
    }

    /// The token of the ticket it joined with.
    fn token(&self) -> Option<String> {
        let y = std::fs::read_to_string(self.dir.join("joined.yaml")).ok()?;
        let l = y.lines().find(|l| l.trim_start().starts_with("token:"))?;
        Some(l.split('"').nth(1)?.to_string())
    }

    /// The join service that gave it its ticket.
    fn ticket_from(&self) -> Option<String> {
        let log = self.log();
        let l = log
            .lines()
            .find(|l| l.contains("join client: ticket from ") && l.contains(" of cluster "))?;
        let rest = &l[l.find("ticket from ").unwrap() + 12..];
        Some(rest.split(':').take(3).collect::<Vec<_>>().join(":"))
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------------------
// The herd

/// What happens to the herd while it runs.
#[derive(Clone, Copy, PartialEq)]
enum Fault {
    None,
    /// One instance killed (SIGKILL) while tickets are being issued, restarted 3 s later.
    KillOne,
    /// The API server stopped (SIGSTOP) for 20 s while tickets are being issued.
    StopApiServer,
}

struct Outcome {
    /// Records left `issuing` by the kill, tokens that never reached a node.
    unsettled: usize,
    orphans: usize,
    nodes: usize,
    raw: usize,
    tokens_created: usize,
    secs_to_ticket: Vec<f64>,
    api_requests: Option<u64>,
}

/// The API server's count of requests it served (apiserver_request_total), for requests per
/// ticket.
fn api_requests(c: &Cluster) -> u64 {
    let out = c.kubectl(&["get", "--raw", "/metrics"]);
    out.lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
        .filter(|l| l.contains("resource=\"configmaps\"") || l.contains("resource=\"secrets\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

fn herd(tag: &str, fault: Fault) -> Outcome {
    let e = env();
    e.clean();
    let before = api_requests(e.cluster);
    let mut inst = three(e);
    let endpoints: Vec<String> = inst.iter().map(Instance::url).collect();
    let ports: Vec<u16> = inst.iter().map(|i| i.port).collect();
    let by_url: HashMap<String, String> = inst.iter().map(|i| (i.url(), i.name.clone())).collect();
    let base = unique_dir(&format!("ledger-herd-{tag}"));
    let bin = stand_ins(&base);
    let n = herd_size();
    let start = Instant::now();
    let mut nodes: Vec<Node> = (0..n)
        .map(|i| Node::start(e, &base, i, &endpoints, &bin))
        .collect();
    // The raw clients: 50 identities, each asking all three at once, while the herd runs.
    let raw_leaves: Vec<Leaf> = (0..50)
        .map(|i| identity(&e.nodes, &format!("raw-{i}")))
        .collect();
    let raw = std::thread::scope(|sc| {
        let h = sc.spawn(|| {
            raw_leaves
                .iter()
                .map(|l| ask_everyone(&ports, e, l))
                .collect::<Vec<_>>()
        });
        // The fault, once tickets are flowing.
        let issued = |inst: &[Instance]| -> usize {
            inst.iter()
                .map(|i| i.log().matches(": ticket issued as ").count())
                .sum()
        };
        let flowing = Instant::now() + Duration::from_secs(120);
        while issued(&inst) < n / 5 && Instant::now() < flowing {
            std::thread::sleep(Duration::from_millis(50));
        }
        match fault {
            Fault::None => {}
            Fault::KillOne => {
                inst[1].kill9();
                std::thread::sleep(Duration::from_secs(3));
                inst[1].start(e);
            }
            Fault::StopApiServer => {
                let pid = e.cluster.api_pid as i32;
                unsafe { libc::kill(pid, libc::SIGSTOP) };
                std::thread::sleep(Duration::from_secs(20));
                unsafe { libc::kill(pid, libc::SIGCONT) };
            }
        }
        h.join().unwrap()
    });
    // Every node joins, within a bound that leaves room for a claim whose instance died.
    let end = Instant::now() + Duration::from_secs(420);
    let mut secs = Vec::new();
    for node in nodes.iter_mut() {
        let st = loop {
            if let Some(st) = node.child.try_wait().unwrap() {
                break st;
            }
            assert!(
                Instant::now() < end,
                "{} has not joined:\n{}",
                node.cn,
                node.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(st.success(), "{}: {st}\n{}", node.cn, node.log());
        let joined = node.dir.join("joined.yaml");
        let at = std::fs::metadata(&joined)
            .and_then(|m| m.modified())
            .unwrap_or_else(|_| panic!("{}: no join config:\n{}", node.cn, node.log()));
        let since = at
            .duration_since(std::time::SystemTime::now() - start.elapsed())
            .unwrap_or_default();
        secs.push(since.as_secs_f64());
    }
    let after = api_requests(e.cluster);
    let told = retry_after_kept(&inst);
    if fault == Fault::StopApiServer {
        assert!(told > 0, "no node was told to ask again later");
        eprintln!("ledger herd {tag}: {told} answers said try later; every node waited it out");
    }
    let mut logs = String::new();
    for i in inst.iter_mut() {
        assert!(i.stop().success(), "{}:\n{}", i.name, i.log());
        logs.push_str(&i.log());
        logs.push('\n');
    }

    // One ticket per identity: every node and raw client got exactly one (distinct tokens),
    // each raw client's rounds had exactly one 200, and the ledger holds one issued record per
    // identity, from the instance that answered.
    let records = e.records();
    let tokens_created = e.token_ids();
    let mut delivered = BTreeSet::new();
    for node in &nodes {
        let t = node.token().unwrap();
        assert!(
            delivered.insert(t.clone()),
            "{}: token given twice",
            node.cn
        );
        let id = t.split('.').next().unwrap();
        assert!(
            tokens_created.contains(id),
            "{}: token not in the cluster",
            node.cn
        );
    }
    let spot = spki_hash(&nodes[0].leaf.cert_pem);
    assert_eq!(
        records[&spot]["node"], nodes[0].cn,
        "identity is the key's hash"
    );
    let by_cn: HashMap<&str, &serde_json::Value> = records
        .values()
        .map(|r| (r["node"].as_str().unwrap(), r))
        .collect();
    assert_eq!(records.len(), n + 50, "one record per identity");
    assert_eq!(by_cn.len(), n + 50, "one record per identity");
    let mut unsettled = 0;
    for node in &nodes {
        let r = by_cn[node.cn.as_str()];
        // Killed between writing a ticket and settling its record: the claim (recorded before
        // the ticket left) stays; its node has its ticket and does not ask again.
        if fault == Fault::KillOne && r["state"] == "issuing" && r["instance"] == "cp-2" {
            unsettled += 1;
        } else if fault == Fault::None || r["state"] != "issued" {
            // A node says it keeps its ticket once its lock is durable; a fault may keep that
            // word from the service (the node logs it and joins).
            assert_eq!(r["state"], "kept", "{}: {r}", node.cn);
        } else {
            assert!(
                node.log().contains("could not tell"),
                "{}: {r}\n{}",
                node.cn,
                node.log()
            );
        }
        let from = node.ticket_from().unwrap();
        assert_eq!(
            r["instance"], by_url[&from],
            "{}: recorded by another instance",
            node.cn
        );
    }
    for (i, (rounds, t)) in raw.iter().enumerate() {
        let oks: usize = rounds.iter().flatten().filter(|s| **s == 200).count();
        assert_eq!(oks, 1, "raw-{i}: {rounds:?}");
        if fault == Fault::None {
            // Before its ticket, every answer said "later" (a slot, the herd being larger than
            // the instances serve at once), never "no": one instance issued, the others then
            // refused (409) or still held a slot for it (503).
            let (last, before) = rounds.split_last().unwrap();
            assert!(
                before.iter().flatten().all(|s| *s == 503),
                "raw-{i}: {rounds:?}"
            );
            assert!(
                last.iter().all(|s| matches!(s, 200 | 409 | 503)),
                "raw-{i}: {rounds:?}"
            );
        }
        assert!(delivered.insert(t.clone()), "raw-{i}: token given twice");
        let r = by_cn[format!("raw-{i}").as_str()];
        if fault == Fault::KillOne && r["state"] == "issuing" && r["instance"] == "cp-2" {
            unsettled += 1;
        } else {
            assert_eq!(r["state"], "issued", "raw-{i}: {r}");
        }
    }
    assert!(
        unsettled <= 1,
        "{unsettled} records left issuing by the kill"
    );
    // Every token created went into a ticket, but for those a fault cut off on their way.
    let orphans = tokens_created.len() - delivered.len();
    match fault {
        Fault::None => assert_eq!(
            orphans,
            0,
            "tokens created without a ticket:\n{}",
            logs.lines()
                .filter(|l| l.starts_with("warn") || l.starts_with("error"))
                .collect::<Vec<_>>()
                .join("\n")
        ),
        _ => assert!(orphans <= 3, "{orphans} tokens without a ticket"),
    }
    assert!(
        !logs.contains("was changed by another instance"),
        "a claim was taken over while held:\n{logs}"
    );
    let _ = std::fs::remove_dir_all(&base);
    drop(nodes);
    Outcome {
        unsettled,
        orphans,
        nodes: n,
        raw: 50,
        tokens_created: tokens_created.len(),
        secs_to_ticket: secs,
        api_requests: after.checked_sub(before),
    }
}

/// Every activate node told "try later" by an instance (503, Retry-After), for a ticket or when
/// it said it keeps one, asked that instance again no sooner: its next request there is logged
/// at least TRY_LATER s after the answer.
/// The number of such answers.
fn retry_after_kept(inst: &[Instance]) -> usize {
    let mut told = 0;
    for i in inst {
        let lines = i.lines.lock().unwrap();
        // "node CN (IDENTITY) at ADDR": the node, and its connection (one per request).
        let who = |l: &str| -> Option<(String, String)> {
            let start = l.find("node herd-")?;
            let rest = &l[start..];
            let node = rest[..rest.find(" (")?].to_string();
            let at = rest[rest.find(") at ")? + 5..]
                .split(':')
                .take(2)
                .collect::<Vec<_>>();
            Some((node, at.join(":")))
        };
        for (k, (t, l)) in lines.iter().enumerate() {
            if !l.contains("told to ask again in 10 s")
                && !l.contains("told to say it again in 10 s")
            {
                continue;
            }
            let Some((w, conn)) = who(l) else { continue };
            told += 1;
            let next = lines[k + 1..]
                .iter()
                .find(|(_, x)| who(x).is_some_and(|(w2, c2)| w2 == w && c2 != conn));
            if let Some((t2, l2)) = next {
                let gap = t2.duration_since(*t).as_secs_f64();
                assert!(
                    gap >= TRY_LATER - 0.3,
                    "{} asked {} again after {gap:.1} s:\n{l}\n{l2}",
                    w,
                    i.name
                );
            }
        }
    }
    told
}

fn report(tag: &str, o: &mut Outcome) {
    o.secs_to_ticket.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let q = |p: f64| o.secs_to_ticket[((o.secs_to_ticket.len() - 1) as f64 * p) as usize];
    let tickets = o.nodes + o.raw;
    eprintln!(
        "ledger herd {tag}: {} nodes joined + {} raw identities; {tickets} tickets, {} tokens \
         created ({} reached no node), {} records left issuing; seconds to joined p50 {:.1} \
         p99 {:.1} max {:.1}; API requests (configmaps, secrets) per ticket {}",
        o.nodes,
        o.raw,
        o.tokens_created,
        o.orphans,
        o.unsettled,
        q(0.5),
        q(0.99),
        q(1.0),
        o.api_requests
            .map(|r| format!("{:.2}", r as f64 / tickets as f64))
            .unwrap_or_else(|| "?".into())
    );
}

#[test]
fn three_instances_issue_one_ticket_per_identity() {
    let _g = serial();
    let mut o = herd("plain", Fault::None);
    report("plain", &mut o);
}

#[test]
fn an_instance_killed_mid_herd_loses_no_identity_and_issues_none_twice() {
    let _g = serial();
    let mut o = herd("kill-9", Fault::KillOne);
    report("kill-9", &mut o);
}

#[test]
fn the_api_server_stopped_for_20_s_gets_try_later_and_no_ticket_leaves_unrecorded() {
    let _g = serial();
    let mut o = herd("api-stopped", Fault::StopApiServer);
    report("api-stopped", &mut o);
}

// ---------------------------------------------------------------------------------------------
// Start-up, failures, the file record

/// join-service run until it exits (a start-up failure), with `kubeconfig` as its credentials.
fn start_fails(e: &Env, kubeconfig: &Path, extra: &[&str]) -> Run {
    let root = instance_root(e, "startfail");
    let mut args = s(&[
        "join-service",
        "--api-server-endpoint",
        "127.0.0.1:6443",
        "--cluster-name",
        "ledger",
        "--listen",
        "127.0.0.1:0",
        "--instance",
        "cp-x",
        "--root",
        &root.display().to_string(),
        "--kubeconfig",
        &kubeconfig.display().to_string(),
    ]);
    args.extend(extra.iter().map(|x| x.to_string()));
    let out = command(&args, None).output().unwrap();
    Run::from(out)
}

#[test]
fn a_missing_permission_or_namespace_is_an_error_at_start() {
    let _g = serial();
    let e = env();
    let dir = unique_dir("ledger-rbac");
    // A user the API server knows, with no role: refused at start, naming what is missing.
    let nobody = dir.join("nobody.kubeconfig");
    e.cluster.kubeconfig("ledger-nobody", &nobody);
    start_fails(e, &nobody, &[])
        .assert_fails(2, "may not create ConfigMaps in namespace nodestrap-join");
    // May create but not update: the update is checked too (a dry run, authorized as the real
    // one), before any node is served.
    let half = dir.join("half.kubeconfig");
    e.cluster.kubeconfig("ledger-half", &half);
    e.cluster.apply(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {name: ledger-half, namespace: nodestrap-join}\n\
         rules: [{apiGroups: [\"\"], resources: [configmaps], verbs: [get, create]}]\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {name: ledger-half, namespace: nodestrap-join}\n\
         roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: ledger-half}\n\
         subjects: [{kind: User, name: ledger-half}]\n",
    );
    start_fails(e, &half, &[])
        .assert_fails(2, "may not update ConfigMaps in namespace nodestrap-join");
    // Every right, but the namespace is not there.
    let admin = dir.join("admin.kubeconfig");
    e.cluster.kubeconfig("ledger-admin", &admin);
    e.cluster.apply(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {name: ledger-admin}\n\
         roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}\n\
         subjects: [{kind: User, name: ledger-admin}]\n",
    );
    start_fails(e, &admin, &["--ledger-namespace", "no-such-ledger"]).assert_fails(
        2,
        "namespace no-such-ledger of the ticket records does not exist",
    );
    // Unreachable at start: tried for a while, then a failure naming the API server (exit 1,
    // and the DaemonSet's restart tries again). (Not waited out here: --help says the bound.)
}

/// The string values of `keys` in a record ("" for a missing one).
fn fields<'a>(r: &'a serde_json::Value, keys: &[&str]) -> Vec<&'a str> {
    keys.iter().map(|k| r[*k].as_str().unwrap_or("")).collect()
}

/// A token command that fails while `fail` exists beside it (removing it), else kubeadm's.
fn flaky_token_command(e: &Env, dir: &Path) -> (String, PathBuf) {
    let script = dir.join("token");
    let flag = dir.join("fail");
    executable(
        &script,
        &format!(
            "#!/bin/sh\nif [ -f '{f}' ]; then rm -f '{f}'; echo 'stand-in: token creation failed' >&2; exit 1; fi\nexec {}\n",
            kubeadm_token_command(e),
            f = flag.display()
        ),
    );
    (script.display().to_string(), flag)
}

#[test]
fn a_failed_issuance_is_retried_by_the_same_identity_within_the_window_only() {
    let _g = serial();
    let e = env();
    e.clean();
    let dir = unique_dir("ledger-retry");
    let (cmd, fail) = flaky_token_command(e, &dir);
    let svc = Instance::new(e, "cp-r", &cmd, &[]);
    let node = identity(&e.nodes, "retry-node");
    let id = spki_hash(&node.cert_pem);

    write(&fail, "");
    let (status, body) = ask(svc.port, &e.cluster.ca, &node).unwrap();
    assert_eq!(status, 500, "{body}");
    let r = &e.records()[&id];
    assert_eq!(
        fields(r, &["state", "attempt", "instance"]),
        ["failed", "1", "cp-r"],
        "{r}"
    );
    assert!(
        r["reason"].as_str().unwrap().contains("--token-command"),
        "{r}"
    );
    assert!(r["failed-at"].as_str().unwrap().ends_with('Z'), "{r}");
    // The same identity asks again: claimed again, issued.
    let (status, body) = ask(svc.port, &e.cluster.ca, &node).unwrap();
    assert_eq!(status, 200, "{body}");
    let r = &e.records()[&id];
    assert_eq!(
        (r["state"].as_str(), r["attempt"].as_str()),
        (Some("issued"), Some("2")),
        "{r}"
    );
    let (status, body) = ask(svc.port, &e.cluster.ca, &node).unwrap();
    assert_eq!(
        (status, body["code"].as_str()),
        (409, Some("already_issued")),
        "{body}"
    );
    drop(svc);

    // With a window of 2 s: a failure, then a node that comes back too late.
    let (cmd, fail) = flaky_token_command(e, &dir);
    let svc = Instance::new(e, "cp-w", &cmd, &["--retry-window", "2"]);
    let late = identity(&e.nodes, "late-node");
    write(&fail, "");
    assert_eq!(ask(svc.port, &e.cluster.ca, &late).unwrap().0, 500);
    std::thread::sleep(Duration::from_secs(3));
    let (status, body) = ask(svc.port, &e.cluster.ca, &late).unwrap();
    assert_eq!(
        (status, body["code"].as_str()),
        (409, Some("retry_window_closed")),
        "{body}"
    );
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("deletes its record"),
        "{body}"
    );
    // The administrator's fix: delete the record; the node gets its ticket.
    let late_id = spki_hash(&late.cert_pem);
    e.cluster.kubectl(&[
        "-n",
        NS,
        "delete",
        "configmap",
        &format!("ticket-{}", late_id.strip_prefix("sha256:").unwrap()),
    ]);
    assert_eq!(ask(svc.port, &e.cluster.ca, &late).unwrap().0, 200);
    assert_eq!(e.token_ids().len(), 2, "one token per ticket issued");
}

/// POST `path` as `leaf` with the run `session` (one letter, repeated): (status, body).
fn ask_as(port: u16, e: &Env, leaf: &Leaf, path: &str, session: char) -> (u16, serde_json::Value) {
    let body = session_body(session);
    let (status, _, v) = mtls_post(port, &e.cluster.ca, leaf, path, &body, &|| {}).unwrap();
    (status, v)
}

#[test]
fn a_ticket_never_kept_goes_to_a_new_run_and_a_kept_one_is_final() {
    let _g = serial();
    let e = env();
    e.clean();
    let svc = Instance::new(e, "cp-k", &kubeadm_token_command(e), &[]);
    let other = Instance::new(e, "cp-l", &kubeadm_token_command(e), &[]);
    let node = identity(&e.nodes, "lost-node");
    let id = spki_hash(&node.cert_pem);
    let state = |e: &Env| {
        let r = &e.records()[&id];
        (
            r["state"].as_str().unwrap().to_string(),
            r["attempt"].as_str().unwrap().to_string(),
            r["session"].as_str().unwrap_or("").chars().next(),
        )
    };
    let (status, body) = ask_as(svc.port, e, &node, "/v1/ticket", 'a');
    assert_eq!(status, 200, "{body}");
    assert_eq!(state(e), ("issued".into(), "1".into(), Some('a')));
    // The same run, at another instance: refused (a node asking two at once gets one ticket).
    let (status, body) = ask_as(other.port, e, &node, "/v1/ticket", 'a');
    assert_eq!(
        (status, body["code"].as_str()),
        (409, Some("already_issued")),
        "{body}"
    );
    // A new run (the node was killed before its lock): a new ticket, from any instance.
    let (status, body) = ask_as(other.port, e, &node, "/v1/ticket", 'b');
    assert_eq!(status, 200, "{body}");
    assert_eq!(state(e), ("issued".into(), "2".into(), Some('b')));
    assert_eq!(e.token_ids().len(), 2, "one token per ticket issued");
    // Kept, told to the first instance: final for every instance, however it asks.
    for _ in 0..2 {
        let (status, body) = ask_as(svc.port, e, &node, "/v1/ticket/kept", 'b');
        assert_eq!((status, body), (200, serde_json::json!({})));
    }
    let r = &e.records()[&id];
    assert_eq!(fields(r, &["state", "attempt"]), ["kept", "2"], "{r}");
    assert!(r["kept-at"].as_str().unwrap().ends_with('Z'), "{r}");
    for (port, run) in [(svc.port, 'c'), (other.port, 'd'), (other.port, 'b')] {
        let (status, body) = ask_as(port, e, &node, "/v1/ticket", run);
        assert_eq!(
            (status, body["code"].as_str()),
            (409, Some("already_issued")),
            "{body}"
        );
    }
    // No record: nothing to keep.
    let stranger = identity(&e.nodes, "stranger");
    let (status, body) = ask_as(other.port, e, &stranger, "/v1/ticket/kept", 'a');
    assert_eq!(
        (status, body["code"].as_str()),
        (409, Some("not_issued")),
        "{body}"
    );
    assert_eq!(e.token_ids().len(), 2);
}

#[test]
fn a_file_record_is_carried_into_the_cluster_once() {
    let _g = serial();
    let e = env();
    e.clean();
    let old = identity(&e.nodes, "old-node");
    let old_id = spki_hash(&old.cert_pem);
    let cmd = kubeadm_token_command(e);
    // An instance that ran with the file record before: its root has one.
    let mut svc = Instance::new(e, "cp-c", &cmd, &["--ledger", "file"]);
    let state = svc.root.join("var/lib/nodestrap/join-service/issued.json");
    assert_eq!(ask(svc.port, &e.cluster.ca, &old).unwrap().0, 200);
    assert!(std::fs::read_to_string(&state).unwrap().contains(&old_id));
    assert!(svc.stop().success());
    assert!(
        e.records().is_empty(),
        "the file ledger wrote nothing to the cluster"
    );

    // Now with the cluster ledger: carried, renamed, and the identity is refused.
    svc.args.retain(|a| a != "--ledger" && a != "file");
    svc.start(e);
    assert!(
        svc.log().contains("1 identities of the file record"),
        "{}",
        svc.log()
    );
    assert!(!state.exists());
    assert!(state.with_extension("json.carried").exists());
    let r = &e.records()[&old_id];
    assert_eq!(
        fields(r, &["state", "node", "instance"]),
        ["kept", "old-node", "cp-c"],
        "{r}"
    );
    assert!(
        r["carried-from"].as_str().unwrap().ends_with("issued.json"),
        "{r}"
    );
    let (status, body) = ask(svc.port, &e.cluster.ca, &old).unwrap();
    assert_eq!(
        (status, body["code"].as_str()),
        (409, Some("already_issued")),
        "{body}"
    );
    // Once: a restart finds no file and carries nothing.
    assert!(svc.stop().success());
    let before = svc.log().matches("identities of the file record").count();
    svc.start(e);
    assert_eq!(
        svc.log().matches("identities of the file record").count(),
        before
    );
}
