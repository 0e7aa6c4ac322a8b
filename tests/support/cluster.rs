//! A real API server for the tests whose commands talk to a cluster: etcd (Debian 13's
//! etcd-server, NODESTRAP_ETCD) and kube-apiserver (built from the k8s.io/kubernetes module by
//! qemu/build-kubernetes, NODESTRAP_KUBE_BIN) on 127.0.0.1, one per test binary, with a PKI
//! made at test time (rcgen), Node and RBAC authorization. Objects and RBAC are set with the
//! real kubectl as the admin. The servers die with the test binary (PR_SET_PDEATHSIG from a
//! thread that lives as long as it), their logs in the cluster's folder.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::{unique_dir, Ca};

pub struct Cluster {
    pub url: String,
    /// kube-apiserver's process, for tests that stop it for a while (SIGSTOP, SIGCONT).
    pub api_pid: u32,
    pub ca: Ca,
    pub ca_file: PathBuf,
    pub dir: PathBuf,
    kube_bin: PathBuf,
    admin: PathBuf,
}

pub fn kube_bin() -> PathBuf {
    super::vars::kube_bin()
}

/// The binary's one cluster, started on first use.
pub fn cluster() -> &'static Cluster {
    static C: OnceLock<Cluster> = OnceLock::new();
    C.get_or_init(|| {
        // The servers are children of a thread that never ends before the process does: with
        // PR_SET_PDEATHSIG they die with the test binary, never with a test's thread.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            tx.send(Cluster::start()).unwrap();
            loop {
                std::thread::park();
            }
        });
        rx.recv().unwrap()
    })
}

/// A cluster of the calling test's own, for a test that changes what every node of a cluster
/// reads (a cluster-wide setting): its servers are children of the test's thread and end with it.
pub fn own_cluster() -> Cluster {
    Cluster::start()
}

/// A port free now and never handed out before by this test program: the kernel may give a
/// closed port back at once (in qemu/run, etcd's peer port once came back as
/// kube-controller-manager's).
pub fn free_port() -> u16 {
    static HANDED_OUT: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if HANDED_OUT.lock().unwrap().insert(port) {
            return port;
        }
    }
}

fn spawn(dir: &Path, name: &str, program: &Path, args: &[String]) -> std::process::Child {
    let log = std::fs::File::create(dir.join(format!("{name}.log"))).unwrap();
    let mut c = Command::new(program);
    c.args(args)
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .stdin(Stdio::null());
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        c.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    c.spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", program.display()))
}

fn wait_for(
    what: &str,
    child: &mut std::process::Child,
    dir: &Path,
    secs: u64,
    ready: impl Fn() -> bool,
) {
    let end = Instant::now() + Duration::from_secs(secs);
    while !ready() {
        if let Ok(Some(st)) = child.try_wait() {
            panic!(
                "{what} exited ({st}); its log: {}",
                dir.join(format!("{what}.log")).display()
            );
        }
        assert!(
            Instant::now() < end,
            "{what} not ready within {secs} s; its log: {}",
            dir.join(format!("{what}.log")).display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

impl Cluster {
    fn start() -> Cluster {
        let dir = unique_dir("cluster");
        let ca = Ca::new("kubernetes");
        let w = |name: &str, text: &str| {
            let p = dir.join(name);
            std::fs::write(&p, text).unwrap();
            p.display().to_string()
        };
        let ca_file = PathBuf::from(w("ca.crt", &ca.pem));
        let mut sp = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
        sp.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let serving = ca.issue(sp);
        let sa = rcgen::KeyPair::generate().unwrap();
        let (etcd_port, peer_port, api_port) = (free_port(), free_port(), free_port());
        let etcd = super::vars::etcd();
        let client = format!("http://127.0.0.1:{etcd_port}");
        let peer = format!("http://127.0.0.1:{peer_port}");
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        // Never waited on: it lives as long as the test process (PDEATHSIG ends it with us).
        #[allow(clippy::zombie_processes)]
        let _etcd = spawn(
            &dir,
            "etcd",
            Path::new(&etcd),
            &s(&[
                "--name",
                "test",
                "--data-dir",
                &dir.join("etcd").display().to_string(),
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
                "--initial-cluster",
                &format!("test={peer}"),
                "--unsafe-no-fsync",
                "--heartbeat-interval=10",
                "--election-timeout=100",
            ]),
        );
        let url = format!("https://127.0.0.1:{api_port}");
        let mut api = spawn(
            &dir,
            "kube-apiserver",
            &kube_bin().join("kube-apiserver"),
            &[
                format!("--etcd-servers={client}"),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={api_port}"),
                "--advertise-address=10.0.2.2".into(),
                "--service-cluster-ip-range=10.96.0.0/12".into(),
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
                format!(
                    "--service-account-key-file={}",
                    w("sa.pub", &sa.public_key_pem())
                ),
                format!(
                    "--service-account-signing-key-file={}",
                    w("sa.key", &sa.serialize_pem())
                ),
                "--authorization-mode=Node,RBAC".into(),
                // kubeadm's: what a node's own credentials may change of its Node.
                "--enable-admission-plugins=NodeRestriction".into(),
                // kubeadm's default: a joining kubelet's bootstrap token authenticates.
                "--enable-bootstrap-token-auth".into(),
                format!("--client-ca-file={}", ca_file.display()),
                format!("--tls-cert-file={}", w("apiserver.crt", &serving.cert_pem)),
                format!(
                    "--tls-private-key-file={}",
                    w("apiserver.key", &serving.key_pem)
                ),
                format!("--cert-dir={}", dir.join("certs").display()),
            ],
        );
        let mut admin_p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        admin_p
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "system:masters");
        admin_p
            .distinguished_name
            .push(rcgen::DnType::CommonName, "kubernetes-admin");
        admin_p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let admin_leaf = ca.issue(admin_p);
        let c = Cluster {
            admin: dir.join("admin.kubeconfig"),
            api_pid: api.id(),
            url,
            ca,
            ca_file,
            dir,
            kube_bin: kube_bin(),
        };
        c.write_kubeconfig(&c.admin, &admin_leaf);
        wait_for("kube-apiserver", &mut api, &c.dir, 180, || {
            c.kubectl_status(&["get", "--raw", "/readyz"], None).0
        });
        c
    }

    fn write_kubeconfig(&self, path: &Path, leaf: &super::Leaf) {
        use base64::Engine as _;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        std::fs::write(
            path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {}\n    certificate-authority-data: {}\nusers:\n- name: u\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\ncontexts:\n- name: test\n  context:\n    cluster: test\n    user: u\ncurrent-context: test\n",
                self.url,
                b64(&self.ca.pem),
                b64(&leaf.cert_pem),
                b64(&leaf.key_pem)
            ),
        )
        .unwrap();
    }

    /// Node `node`'s status as its kubelet reports it: its versions, and its Ready heartbeat at
    /// `at` (RFC 3339, the node's clock).
    pub fn report_node(&self, node: &str, kubelet: &str, runtime: &str, at: &str) {
        self.kubectl(&[
            "patch",
            "node",
            node,
            "--subresource=status",
            "--type=merge",
            "-p",
            &format!(
                "{{\"status\":{{\"nodeInfo\":{{\"kubeletVersion\":\"{kubelet}\",\"containerRuntimeVersion\":\"{runtime}\"}},\"conditions\":[{{\"type\":\"Ready\",\"status\":\"True\",\"reason\":\"KubeletReady\",\"message\":\"test\",\"lastHeartbeatTime\":\"{at}\",\"lastTransitionTime\":\"{at}\"}}]}}}}"
            ),
        ]);
    }

    /// A kubeconfig at `path` for a new user `cn` who may only read Nodes (a cluster role and
    /// its binding of that name): what a boot check asks the API server with.
    pub fn node_reader(&self, cn: &str, path: &Path) {
        self.kubectl(&[
            "create",
            "clusterrole",
            cn,
            "--verb=get",
            "--resource=nodes",
        ]);
        self.kubectl(&[
            "create",
            "clusterrolebinding",
            cn,
            &format!("--clusterrole={cn}"),
            &format!("--user={cn}"),
        ]);
        self.kubeconfig(cn, path);
    }

    /// A kubeconfig at `path` with Node `node`'s own identity, as its kubelet has it
    /// (`system:node:<node>` in `system:nodes`): what the Node authorizer and NodeRestriction
    /// judge, nothing granted beside.
    pub fn node_identity(&self, node: &str, path: &Path) {
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name
            .push(rcgen::DnType::OrganizationName, "system:nodes");
        p.distinguished_name
            .push(rcgen::DnType::CommonName, format!("system:node:{node}"));
        p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        self.write_kubeconfig(path, &self.ca.issue(p));
    }

    /// A kubeconfig at `path` for the user `cn` (a client certificate of the cluster's CA, in no
    /// group).
    pub fn kubeconfig(&self, cn: &str, path: &Path) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        self.write_kubeconfig(path, &self.ca.client(cn));
    }

    fn kubectl_status(&self, args: &[&str], stdin: Option<&str>) -> (bool, String) {
        let mut c = Command::new(self.kube_bin.join("kubectl"));
        c.arg("--kubeconfig")
            .arg(&self.admin)
            .arg("--request-timeout=10s")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().unwrap();
        let mut pipe = child.stdin.take().unwrap();
        if let Some(text) = stdin {
            std::io::Write::write_all(&mut pipe, text.as_bytes()).unwrap();
        }
        drop(pipe);
        let out = child.wait_with_output().unwrap();
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    }

    /// kubectl as the admin; its output, or a panic with it.
    pub fn kubectl(&self, args: &[&str]) -> String {
        let (ok, out) = self.kubectl_status(args, None);
        assert!(ok, "kubectl {}: {out}", args.join(" "));
        out
    }

    /// The real kubeadm as the admin (`--kubeconfig`); its output, or a panic with it.
    pub fn kubeadm(&self, args: &[&str]) -> String {
        let out = Command::new(self.kube_bin.join("kubeadm"))
            .args(args)
            .arg("--kubeconfig")
            .arg(&self.admin)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "kubeadm {}: {text}", args.join(" "));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `kubectl apply -f -` of `objects` (JSON or YAML).
    pub fn apply(&self, objects: &str) {
        let (ok, out) = self.kubectl_status(&["apply", "-f", "-"], Some(objects));
        assert!(ok, "kubectl apply: {out}\n{objects}");
    }
}
