"""A real Kubernetes control plane beside the guests, started and stopped here: etcd (Debian
13's etcd-server), kube-apiserver and kube-controller-manager (built by qemu/build-kubernetes)
on 127.0.0.1, with a PKI made by openssl at start. The guests reach it at 10.0.2.2 (QEMU's user
network turns that into the host's 127.0.0.1). What `/version` answers is the real API server's.

It holds what a kubeadm cluster holds for joining nodes (a bootstrap token and its RBAC: the
kubelet's CSR is approved and signed by the controller manager), the identities nodestrap's
commands use, each allowed exactly what it needs (bootstrap: /version and the runtime-mappings
ConfigMap; hook: get and patch its Node; reprovision: get and patch Nodes), and reads Nodes and
Pods with kubectl for the proofs. Waits are bounded; the processes' logs stay in the run's work
dir (kept when a scenario fails)."""
import base64
import json
import os
import secrets
import string
import subprocess
import time

from harness.common import GUEST_HOST, free_port, run, say

ETCD = os.environ.get("NODESTRAP_ETCD", "/usr/local/lib/nodestrap-ci/etcd")
# The runtime mappings the torcx family's ConfigMap holds (tectonic-system).
MAPPINGS_NS, MAPPINGS_CM, MAPPINGS_KEY = "tectonic-system", "tectonic-torcx-runtime-mappings", "runtime-mappings.yaml"
BOOTSTRAP_GROUP = "system:bootstrappers:kubeadm:default-node-token"


class ControlPlane:
    def __init__(self, work, kube_bin, version):
        self.d = os.path.join(work, "cluster")
        self.pki = os.path.join(self.d, "pki")
        os.makedirs(self.pki)
        self.kube_bin = kube_bin
        self.version = version
        self.procs = []
        self.timings = {}
        t0 = time.time()
        self.make_pki()
        self.api_port = free_port()
        etcd_port, peer_port, kcm_port = free_port(), free_port(), free_port()
        self.start("etcd", [
            ETCD, "--name", "nodestrap-test", "--data-dir", os.path.join(self.d, "etcd"),
            "--listen-client-urls", "http://127.0.0.1:%d" % etcd_port,
            "--advertise-client-urls", "http://127.0.0.1:%d" % etcd_port,
            "--listen-peer-urls", "http://127.0.0.1:%d" % peer_port,
            "--initial-advertise-peer-urls", "http://127.0.0.1:%d" % peer_port,
            "--initial-cluster", "nodestrap-test=http://127.0.0.1:%d" % peer_port,
            "--initial-cluster-state", "new",
            # Throwaway data on loopback: no fsync, and a one-member election in milliseconds.
            "--unsafe-no-fsync", "--heartbeat-interval=10", "--election-timeout=100", "--log-level", "warn"])
        self.wait("etcd", 30, lambda: self.get("http://127.0.0.1:%d/health" % etcd_port) is not None)
        self.timings["etcd"] = time.time() - t0
        p = lambda n: os.path.join(self.pki, n)
        self.start("kube-apiserver", [
            os.path.join(kube_bin, "kube-apiserver"),
            "--etcd-servers=http://127.0.0.1:%d" % etcd_port,
            "--bind-address=127.0.0.1", "--secure-port=%d" % self.api_port,
            # The address the guests reach it at (a loopback one is refused for the endpoints).
            "--advertise-address=" + GUEST_HOST,
            "--service-cluster-ip-range=10.96.0.0/12",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            "--service-account-key-file=" + p("sa.pub"), "--service-account-signing-key-file=" + p("sa.key"),
            "--authorization-mode=Node,RBAC", "--enable-bootstrap-token-auth=true",
            "--enable-admission-plugins=NodeRestriction",
            "--client-ca-file=" + p("ca.crt"),
            "--tls-cert-file=" + p("apiserver.crt"), "--tls-private-key-file=" + p("apiserver.key"),
            "--kubelet-client-certificate=" + p("apiserver-kubelet-client.crt"),
            "--kubelet-client-key=" + p("apiserver-kubelet-client.key"),
            "--allow-privileged=true", "--cert-dir=" + os.path.join(self.d, "apiserver-certs")])
        self.wait("kube-apiserver", 180, lambda: self.get("https://127.0.0.1:%d/readyz" % self.api_port) == b"ok")
        self.timings["kube-apiserver"] = time.time() - t0
        for user in ("admin", "kcm", "nodestrap-bootstrap", "nodestrap-hook", "nodestrap-reprovision"):
            self.write_kubeconfig(user)
        self.start("kube-controller-manager", [
            os.path.join(kube_bin, "kube-controller-manager"),
            "--kubeconfig=" + self.kubeconfig_path("kcm"),
            "--authentication-kubeconfig=" + self.kubeconfig_path("kcm"),
            "--authorization-kubeconfig=" + self.kubeconfig_path("kcm"),
            "--bind-address=127.0.0.1", "--secure-port=%d" % kcm_port,
            "--cert-dir=" + os.path.join(self.d, "kcm-certs"), "--leader-elect=false",
            # What joining nodes need (CSR approval and signing, bootstrap tokens, service
            # accounts, namespaces), not the whole set: it starts in under a second.
            "--controllers=csrapproving,csrsigning,csrcleaner,bootstrapsigner,tokencleaner,serviceaccount,"
            "serviceaccount-token,root-ca-cert-publisher,namespace",
            # Its own certificate's user has no rights of its own: each controller acts as its
            # service account.
            "--use-service-account-credentials=true",
            "--cluster-signing-cert-file=" + p("ca.crt"), "--cluster-signing-key-file=" + p("ca.key"),
            "--root-ca-file=" + p("ca.crt"), "--service-account-private-key-file=" + p("sa.key")])
        # /healthz answers before any controller runs; the root CA's ConfigMap says they do.
        self.wait("kube-controller-manager", 120,
                  lambda: self.kubectl("get", "-n", "kube-system", "configmap", "kube-root-ca.crt",
                                       check=False).returncode == 0)
        self.timings["kube-controller-manager"] = time.time() - t0
        self.join_objects()
        self.identities()
        say("control plane %s up in %.1f s at https://127.0.0.1:%d (guests: https://%s:%d)"
            % (self.server_version(), time.time() - t0, self.api_port, GUEST_HOST, self.api_port))

    # -----------------------------------------------------------------------------------------
    # Processes

    def start(self, name, cmd):
        log = open(os.path.join(self.d, name + ".log"), "w")
        self.procs.append((name, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)))

    def wait(self, name, secs, ready):
        end = time.time() + secs
        proc = dict(self.procs)[name]
        while time.time() < end:
            if proc.poll() is not None:
                self.stop()  # what started before it: nothing outlives a failed start
                raise SystemExit("qemu/run: %s exited with %d; its log: %s"
                                 % (name, proc.returncode, os.path.join(self.d, name + ".log")))
            try:
                if ready():
                    return
            except (OSError, subprocess.SubprocessError):
                pass
            time.sleep(0.1)
        self.stop()
        raise SystemExit("qemu/run: %s not ready within %d s; its log: %s" % (name, secs, os.path.join(self.d, name + ".log")))

    def stop(self):
        for name, proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()

    def get(self, url):
        """GET with the cluster CA (anonymous): the body, or None."""
        r = subprocess.run(["curl", "-sf", "--max-time", "5", "--cacert", os.path.join(self.pki, "ca.crt"), url],
                           capture_output=True)
        return r.stdout.strip() if r.returncode == 0 else None

    # -----------------------------------------------------------------------------------------
    # PKI, made at start (EC P-256)

    def make_pki(self):
        q = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        p = lambda n: os.path.join(self.pki, n)
        key = lambda n: run(["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
                             "-out", p(n)], **q)
        key("ca.key")
        run(["openssl", "req", "-x509", "-new", "-key", p("ca.key"), "-sha256", "-days", "2", "-subj", "/CN=kubernetes",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,digitalSignature,keyCertSign,cRLSign",
             "-addext", "subjectKeyIdentifier=hash", "-out", p("ca.crt")], **q)
        leaves = [
            ("apiserver", "/CN=kube-apiserver", ["extendedKeyUsage=serverAuth",
             "subjectAltName=IP:127.0.0.1,IP:%s,IP:10.96.0.1,DNS:kubernetes,DNS:kubernetes.default,"
             "DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost" % GUEST_HOST]),
            ("admin", "/O=system:masters/CN=kubernetes-admin", ["extendedKeyUsage=clientAuth"]),
            ("kcm", "/CN=system:kube-controller-manager", ["extendedKeyUsage=clientAuth"]),
            ("apiserver-kubelet-client", "/O=system:masters/CN=kube-apiserver-kubelet-client",
             ["extendedKeyUsage=clientAuth"]),
            # nodestrap's identities: users RBAC names, in no group.
            ("nodestrap-bootstrap", "/CN=nodestrap-bootstrap", ["extendedKeyUsage=clientAuth"]),
            ("nodestrap-hook", "/CN=nodestrap-hook", ["extendedKeyUsage=clientAuth"]),
            ("nodestrap-reprovision", "/CN=nodestrap-reprovision", ["extendedKeyUsage=clientAuth"]),
        ]
        for n, subj, ext in leaves:
            key(n + ".key")
            run(["openssl", "req", "-new", "-key", p(n + ".key"), "-subj", subj, "-out", p(n + ".csr")], **q)
            with open(p(n + ".ext"), "w") as f:
                f.write("\n".join(["basicConstraints=critical,CA:FALSE", "keyUsage=critical,digitalSignature",
                                   "authorityKeyIdentifier=keyid"] + ext) + "\n")
            run(["openssl", "x509", "-req", "-in", p(n + ".csr"), "-CA", p("ca.crt"), "-CAkey", p("ca.key"),
                 "-set_serial", "0x" + secrets.token_hex(16), "-days", "2", "-sha256", "-extfile", p(n + ".ext"),
                 "-out", p(n + ".crt")], **q)
        key("sa.key")
        run(["openssl", "pkey", "-in", p("sa.key"), "-pubout", "-out", p("sa.pub")], **q)

    def ca_pem(self):
        return open(os.path.join(self.pki, "ca.crt")).read()

    def kubeconfig_path(self, user):
        return os.path.join(self.d, user + ".kubeconfig")

    def kubeconfig(self, user=None, token=None, server=None):
        """A kubeconfig with everything embedded: a client certificate of `user`, or a bearer
        `token`; the server as the guests reach it unless said otherwise."""
        b64 = lambda s: base64.b64encode(s if isinstance(s, bytes) else s.encode()).decode()
        server = server or "https://%s:%d" % (GUEST_HOST, self.api_port)
        if token:
            cred = "    token: %s\n" % token
        else:
            cred = ("    client-certificate-data: %s\n    client-key-data: %s\n"
                    % (b64(open(os.path.join(self.pki, user + ".crt"), "rb").read()),
                       b64(open(os.path.join(self.pki, user + ".key"), "rb").read())))
        return ("apiVersion: v1\nkind: Config\nclusters:\n- name: nodestrap-test\n  cluster:\n"
                "    server: %s\n    certificate-authority-data: %s\nusers:\n- name: %s\n  user:\n%s"
                "contexts:\n- name: default\n  context:\n    cluster: nodestrap-test\n    user: %s\n"
                "current-context: default\n" % (server, b64(self.ca_pem()), user or "bootstrap", cred, user or "bootstrap"))

    def write_kubeconfig(self, user):
        with open(self.kubeconfig_path(user), "w") as f:
            f.write(self.kubeconfig(user, server="https://127.0.0.1:%d" % self.api_port))

    # -----------------------------------------------------------------------------------------
    # kubectl (the one qemu/build-kubernetes built), as the admin

    def kubectl(self, *args, check=True, stdin=None, user="admin"):
        return subprocess.run([os.path.join(self.kube_bin, "kubectl"), "--kubeconfig", self.kubeconfig_path(user),
                               "--request-timeout=10s"] + list(args),
                              input=stdin, capture_output=True, text=True, check=check)

    def apply(self, objects):
        self.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))

    def server_version(self):
        return json.loads(self.kubectl("version", "-o", "json").stdout)["serverVersion"]["gitVersion"]

    # -----------------------------------------------------------------------------------------
    # What a kubeadm cluster holds for joining nodes

    def join_objects(self):
        """A bootstrap token (kube-system Secret) and kubeadm's bindings: its group may create
        CSRs, which are approved for new nodes (nodeclient) and for renewals (selfnodeclient)."""
        alphabet = string.ascii_lowercase + string.digits
        tid = "".join(secrets.choice(alphabet) for _ in range(6))
        tsecret = "".join(secrets.choice(alphabet) for _ in range(16))
        self.bootstrap_token = "%s.%s" % (tid, tsecret)
        expires = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 86400))
        group = {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": BOOTSTRAP_GROUP}
        crb = lambda name, role, subject: {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [subject]}
        self.apply([
            {"apiVersion": "v1", "kind": "Secret", "type": "bootstrap.kubernetes.io/token",
             "metadata": {"name": "bootstrap-token-" + tid, "namespace": "kube-system"},
             "stringData": {"token-id": tid, "token-secret": tsecret, "expiration": expires,
                            "usage-bootstrap-authentication": "true", "usage-bootstrap-signing": "true",
                            "auth-extra-groups": BOOTSTRAP_GROUP}},
            crb("kubeadm:kubelet-bootstrap", "system:node-bootstrapper", group),
            crb("kubeadm:node-autoapprove-bootstrap",
                "system:certificates.k8s.io:certificatesigningrequests:nodeclient", group),
            crb("kubeadm:node-autoapprove-certificate-rotation",
                "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
                {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:nodes"}),
        ])

    def short_token(self, ttl):
        """A bootstrap token of its own for one node, expiring in `ttl` seconds (kubeadm's
        default is a day): (token, the name of its Secret), for a scenario that deletes it."""
        alphabet = string.ascii_lowercase + string.digits
        tid = "".join(secrets.choice(alphabet) for _ in range(6))
        tsecret = "".join(secrets.choice(alphabet) for _ in range(16))
        expires = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + ttl))
        self.apply([{"apiVersion": "v1", "kind": "Secret", "type": "bootstrap.kubernetes.io/token",
                     "metadata": {"name": "bootstrap-token-" + tid, "namespace": "kube-system"},
                     "stringData": {"token-id": tid, "token-secret": tsecret, "expiration": expires,
                                    "usage-bootstrap-authentication": "true", "usage-bootstrap-signing": "true",
                                    "auth-extra-groups": BOOTSTRAP_GROUP}}])
        return "%s.%s" % (tid, tsecret), "bootstrap-token-" + tid

    def refuses(self, token):
        """Whether the API server answers a request with `token` 401 (GET /version, which any
        authenticated or anonymous user may read: only a token it rejects is refused)."""
        path = os.path.join(self.d, "token-check.conf")
        with open(path, "w") as f:
            f.write(self.kubeconfig(token=token, server="https://127.0.0.1:%d" % self.api_port))
        # The API server caches a token it authenticated for a few seconds (and learns of the
        # Secret's deletion through its watch): asked again for up to 30 s.
        for _ in range(30):
            r = subprocess.run([os.path.join(self.kube_bin, "kubectl"), "--kubeconfig", path, "--request-timeout=10s",
                                "get", "--raw", "/version"], capture_output=True, text=True)
            if r.returncode != 0 and "Unauthorized" in r.stderr:
                return True
            time.sleep(1)
        return False

    def identities(self):
        """nodestrap's users, each allowed exactly what its command needs. /version needs no
        rule: every user may read it (system:public-info-viewer)."""
        user = lambda n: [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": n}]
        self.apply([
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": MAPPINGS_NS}},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
             "metadata": {"name": "nodestrap-bootstrap", "namespace": MAPPINGS_NS},
             "rules": [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [MAPPINGS_CM],
                        "verbs": ["get"]}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
             "metadata": {"name": "nodestrap-bootstrap", "namespace": MAPPINGS_NS},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "nodestrap-bootstrap"},
             "subjects": user("nodestrap-bootstrap")},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
             "metadata": {"name": "nodestrap-reprovision"},
             "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
             "metadata": {"name": "nodestrap-reprovision"},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "nodestrap-reprovision"},
             "subjects": user("nodestrap-reprovision")},
        ])

    def allow_hook(self, node):
        """The hook may get and patch one Node: its own."""
        self.apply([
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
             "metadata": {"name": "nodestrap-hook:" + node},
             "rules": [{"apiGroups": [""], "resources": ["nodes"], "resourceNames": [node], "verbs": ["get", "patch"]}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
             "metadata": {"name": "nodestrap-hook:" + node},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "nodestrap-hook:" + node},
             "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "nodestrap-hook"}]}])

    def set_mappings(self, text):
        """The torcx family's runtime mappings ConfigMap."""
        self.apply([{"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": {"name": MAPPINGS_CM, "namespace": MAPPINGS_NS},
                     "data": {MAPPINGS_KEY: text}}])

    # -----------------------------------------------------------------------------------------
    # The proofs, read with kubectl

    def forget_node(self, name):
        self.kubectl("delete", "node", name, "--ignore-not-found", "--wait=false")
        self.kubectl("delete", "pods", "--all-namespaces", "--field-selector", "spec.nodeName=" + name,
                     "--wait=false", check=False)

    def node_info(self, name):
        """The registered Node's (kubeletVersion, containerRuntimeVersion), or None."""
        r = self.kubectl("get", "node", name, "-o", "jsonpath={.status.nodeInfo.kubeletVersion} "
                         "{.status.nodeInfo.containerRuntimeVersion}", check=False)
        if r.returncode != 0 or not r.stdout.strip():
            return None
        kubelet, _, runtime = r.stdout.strip().partition(" ")
        return kubelet, runtime

    def pod_phase(self, namespace, name):
        r = self.kubectl("get", "pod", "-n", namespace, name, "-o", "jsonpath={.status.phase}", check=False)
        return r.stdout.strip() if r.returncode == 0 else None


# ---------------------------------------------------------------------------------------------
# What a joining node gets (through Ignition), and watching it join

def kubelet_config(runtime_endpoint="unix:///run/containerd/containerd.sock"):
    """The KubeletConfiguration (/var/lib/kubelet/config.yaml, where kubeadm writes it): the
    systemd cgroup driver (containerd 1.7 and older cannot tell the kubelet theirs), the
    runtime's CRI socket, static pods from /etc/kubernetes/manifests, client certificates from
    TLS bootstrapping and rotated, requests to the kubelet authenticated and authorized by the
    API server; no evictions or image GC on a small test disk."""
    return ("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
            "cgroupDriver: systemd\ncontainerRuntimeEndpoint: %s\nfailSwapOn: false\n"
            "staticPodPath: /etc/kubernetes/manifests\nrotateCertificates: true\nserverTLSBootstrap: false\n"
            "authentication:\n  anonymous: {enabled: false}\n  webhook: {enabled: true}\n"
            "  x509: {clientCAFile: /etc/kubernetes/pki/ca.crt}\nauthorization: {mode: Webhook}\n"
            "clusterDomain: cluster.local\nclusterDNS: [10.96.0.10]\nresolvConf: /etc/resolv.conf\n"
            "evictionHard: {memory.available: 50Mi, nodefs.available: 1%%, imagefs.available: 1%%}\n"
            "imageGCHighThresholdPercent: 100\nimageGCLowThresholdPercent: 99\n" % runtime_endpoint)


PROBE_POD = "probe"
POD_LINE = "pod-ran-on-Linux"


def static_pod(image):
    """A static pod with host networking (no CNI is needed for it) from the workload image the
    payload carries, never pulled; its mirror pod is `probe-<node>` in `default`. Its shell, the
    container's PID 1, ends on SIGTERM (a PID 1 without a handler ignores it, and a node's
    shutdown then waits 90 s for it)."""
    return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": PROBE_POD, "namespace": "default"},
                       "spec": {"hostNetwork": True, "containers": [{
                           "name": "probe", "image": image, "imagePullPolicy": "Never",
                           "command": ["sh", "-c", "echo %s; trap 'exit 0' TERM; sleep 86400 & wait"
                                   % POD_LINE.replace("Linux", "$(uname -s)")]}]}},
                      indent=1) + "\n"


class Joining:
    """One node's way into the cluster as the API server sees it, polled (at most every 3 s)
    while its VM runs: when its Node first had a nodeInfo, and when its mirror pod ran."""

    def __init__(self, cp, node):
        self.cp, self.node = cp, node
        self.last = 0.0
        self.registered = self.running = None  # seconds of the scenario's clock
        self.info = None
        cp.forget_node(node)

    def poll(self, now):
        if self.running is not None or time.time() - self.last < 3:
            return
        self.last = time.time()
        if self.registered is None:
            self.info = self.cp.node_info(self.node)
            if self.info and self.info[0]:
                self.registered = now
        if self.registered is not None and self.cp.pod_phase("default", "%s-%s" % (PROBE_POD, self.node)) == "Running":
            self.running = now
            # What the API server says now, the record of the scenario.
            self.info = self.cp.node_info(self.node)

    def done(self):
        return self.running is not None
