"""The run's world on the host: CA, certificates, OpenPGP key, signed manifests and images,
the release server and the stand-in API server (qemu/server.py), and each node's files."""
import base64
import hashlib
import json
import os
import secrets
import shutil
import subprocess
import sys

from harness.common import (
    DOCKER, GUEST_HOST, HERE, IPB_LABEL, MCO_IMAGE, NEXT_OS, OS_VERSION, RENDERED, RHCOS_NODE,
    free_port, run,
)
from harness.cluster import kubelet_config, static_pod


class Run:
    """Everything made for this run: keys, certificates, published files, the servers."""

    def __init__(self, work, images):
        self.work = work
        self.images = images
        self.on_stop = []  # more servers a scenario family started
        self.make_pki()
        self.token = secrets.token_hex(24)
        with open(self.path("token"), "w") as f:
            f.write(self.token)
        os.makedirs(self.path("www/pkgs"))
        cms = {"tectonic-system/tectonic-torcx-runtime-mappings": {"runtime-mappings.yaml": (
            "kind: VersionManifestV1\nversions:\n  k8s:\n    1.9:\n      docker: [\"%s\", \"1.12\"]\n"
            "    1.10:\n      docker: [\"%s\", \"1.12\"]\n" % (DOCKER, DOCKER))}}
        with open(self.path("configmaps.json"), "w") as f:
            json.dump(cms, f)
        self.server_log = self.path("server.log")
        self.publish_rhcos()
        self.server = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "server.py"), "--www", self.path("www"),
             "--cert", self.path("srv.pem"), "--key", self.path("srv.key"), "--token", self.path("token"),
             "--git-version", images["KUBE_VERSION"], "--configmaps", self.path("configmaps.json"),
             "--log", self.server_log, "--ignition", self.path("served.ign"), "--ign-token", self.path("ign-token"),
             "--progress-token", self.path("progress-token"), "--progress-log", self.path("progress.jsonl"),
             "--nodes", self.path("nodes.json")], stdout=subprocess.PIPE, text=True)
        ready = self.server.stdout.readline().split()
        if not ready or ready[0] != "ready":
            raise SystemExit("qemu/run: the host-side servers did not start")
        self.release_port, self.api_port = int(ready[1]), int(ready[2])
        self.publish()

    def path(self, *p):
        return os.path.join(self.work, *p)

    def make_pki(self):
        w = self.work
        with open(self.path("san.ext"), "w") as f:
            f.write("subjectAltName=IP:%s,IP:127.0.0.1\n" % GUEST_HOST)
        quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-days", "2", "-subj", "/CN=nodestrap-qemu-ca", "-keyout", w + "/ca.key", "-out", w + "/ca.pem"], **quiet)
        run(["openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-subj", "/CN=%s" % GUEST_HOST, "-keyout", w + "/srv.key", "-out", w + "/srv.csr"], **quiet)
        run(["openssl", "x509", "-req", "-in", w + "/srv.csr", "-CA", w + "/ca.pem", "-CAkey", w + "/ca.key",
             "-CAcreateserial", "-days", "2", "-extfile", w + "/san.ext", "-out", w + "/srv.pem"], **quiet)
        os.environ["GNUPGHOME"] = self.path("gnupg")
        os.mkdir(os.environ["GNUPGHOME"], 0o700)
        run(["gpg", "--batch", "--quiet", "--pinentry-mode", "loopback", "--passphrase", "",
             "--quick-gen-key", "release <release@nodestrap.invalid>", "ed25519", "sign", "never"], **quiet)
        with open(self.path("keyring.asc"), "w") as f:
            run(["gpg", "--batch", "--armor", "--export"], stdout=f)

    def publish(self):
        """Signed manifests for this OS and the next one: docker 20.10 from the server (the real
        image qemu/build-docker made from Debian's packages), 1.12 vendored in the node image
        (a small stand-in that only reports its version)."""
        img = self.path("www/pkgs/docker-%s.torcx.tgz" % DOCKER)
        os.makedirs(os.path.dirname(img), exist_ok=True)
        shutil.copyfile(self.images["DOCKER_IMAGE"], img)
        self.image_sha512 = hashlib.sha512(open(img, "rb").read()).hexdigest()
        vendor = self.path("vendor-docker-1.12.tgz")
        run([os.path.join(HERE, "guest/files/make-torcx-image"), "1.12", vendor])
        vendor_sha512 = hashlib.sha512(open(vendor, "rb").read()).hexdigest()
        for os_version in (OS_VERSION, NEXT_OS):
            d = self.path("www/manifests/amd64-usr", os_version)
            os.makedirs(d)
            manifest = {"kind": "torcx-package-list-v0", "value": {"packages": [{
                "name": "docker", "defaultVersion": DOCKER, "versions": [
                    {"version": DOCKER, "hash": "sha512-" + self.image_sha512, "locations": [
                        {"url": "https://%s:%d/pkgs/docker-%s.torcx.tgz" % (GUEST_HOST, self.release_port, DOCKER)}]},
                    {"version": "1.12", "hash": "sha512-" + vendor_sha512,
                     "locations": [{"path": "/usr/share/torcx/store/docker:1.12.torcx.tgz"}]}]}]}}
            with open(os.path.join(d, "torcx_manifest.json"), "w") as f:
                json.dump(manifest, f, indent=1)
            run(["gpg", "--batch", "--yes", "--armor", "--detach-sign", os.path.join(d, "torcx_manifest.json")])

    def publish_rhcos(self):
        """What a machine-config-server serves an RHCOS worker (the files and units the MCO's templates give a node: docs/reprovision.md): the
        encapsulated MachineConfig naming the rendered config, a file and a unit of its own,
        and the firstboot unit that names the machine-config-operator image."""
        for name in ("ign-token", "progress-token"):
            with open(self.path(name), "w") as f:
                f.write(secrets.token_hex(16))
        with open(self.path("nodes.json"), "w") as f:
            json.dump({RHCOS_NODE: {"kubernetes.io/os": "linux", IPB_LABEL: "true"}}, f)
        mc = {"apiVersion": "machineconfiguration.openshift.io/v1", "kind": "MachineConfig",
              "metadata": {"name": RENDERED}, "spec": {"osImageURL": "quay.io/openshift-release-dev/rhcos@sha256:" + "ab" * 32,
                                                        "config": {"ignition": {"version": "3.2.0"}}}}
        b64 = lambda b: "data:;base64," + base64.b64encode(b).decode()
        served = {"ignition": {"version": "3.2.0"},
                  "storage": {"files": [
                      {"path": "/etc/ignition-machine-config-encapsulated.json", "mode": 420, "overwrite": True,
                       "contents": {"source": b64(json.dumps(mc).encode())}},
                      {"path": "/etc/kubernetes/kubeconfig", "mode": 384, "contents": {"source": "data:,served-placeholder"}},
                      {"path": "/etc/rhcos-reprovisioned", "mode": 420, "contents": {"source": b64(RENDERED.encode() + b"\n")}}]},
                  "systemd": {"units": [
                      {"name": "rhcos-marker.service", "enabled": True,
                       "contents": open(os.path.join(HERE, "rhcos/rhcos-marker.service")).read()},
                      {"name": "machine-config-daemon-firstboot.service", "enabled": False,
                       "contents": "[Service]\nType=oneshot\nExecStart=/usr/bin/podman run --rm --privileged --net=host "
                                   "-v /:/rootfs --entrypoint machine-config-daemon '%s' firstboot-complete-machineconfig\n"
                                   % MCO_IMAGE}]}}
        with open(self.path("served.ign"), "w") as f:
            json.dump(served, f)

    def rhcos_files(self):
        """The node side of reprovision-rhcos: os-release ID=rhcos, the Secret as a folder, a
        kubeconfig for the API server, the stand-in machine-config-daemon and the unit that
        plays the DaemonSet's pod."""
        ca = open(self.path("ca.pem")).read()
        ca_b64 = base64.b64encode(ca.encode()).decode()
        kubeconfig = ("apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n"
                      "    server: https://%s:%d\n    certificate-authority-data: %s\n"
                      "users:\n- name: ipb\n  user:\n    token: %s\n"
                      "contexts:\n- context:\n    cluster: local\n    user: ipb\n"
                      % (GUEST_HOST, self.api_port, ca_b64, self.token))
        self.node_kubeconfig = kubeconfig.replace("user: ipb", "user: kubelet").replace("- name: ipb", "- name: kubelet")
        rel = "https://%s:%d" % (GUEST_HOST, self.release_port)
        files = {
            "/etc/os-release": 'NAME="Red Hat Enterprise Linux CoreOS"\nID="rhcos"\nID_LIKE="rhel fedora"\n'
                               'VERSION_ID="4.14"\nOPENSHIFT_VERSION="4.14"\n',
            "/etc/ipb/kubeconfig": kubeconfig,
            "/etc/ipb-secret/ignition-url": rel + "/ignition",
            "/etc/ipb-secret/ignition-token": open(self.path("ign-token")).read(),
            "/etc/ipb-secret/ca.crt": ca,
            "/etc/ipb-secret/kubeconfig": self.node_kubeconfig,
            "/etc/ipb-secret/progress-url": rel + "/progress/events",
            "/etc/ipb-secret/progress-token": open(self.path("progress-token")).read(),
            "/etc/ipb-secret/registry-url": "%s:%d" % (GUEST_HOST, self.release_port),
        }
        entries = [{"path": p, "mode": 0o600 if "secret" in p or "kubeconfig" in p else 0o644, "overwrite": True,
                    "contents": {"source": "data:;base64," + base64.b64encode(t.encode()).decode()}}
                   for p, t in files.items()]
        mcd = open(os.path.join(HERE, "rhcos/machine-config-daemon"), "rb").read()
        entries.append({"path": "/usr/local/bin/machine-config-daemon", "mode": 0o755, "overwrite": True,
                        "contents": {"source": "data:;base64," + base64.b64encode(mcd).decode()}})
        unit = open(os.path.join(HERE, "rhcos/ipb-reprovision.service")).read()
        return {"ignition": {"version": "3.3.0"}, "storage": {"files": entries},
                "systemd": {"units": [{"name": "ipb-reprovision.service", "enabled": True, "contents": unit}]}}

    def tamper(self, on):
        """Serve a signature that does not verify (a valid signature over other bytes) or the
        good one again."""
        for os_version in (OS_VERSION, NEXT_OS):
            asc = self.path("www/manifests/amd64-usr", os_version, "torcx_manifest.json.asc")
            if on:
                shutil.copy(asc, asc + ".good")
                other = self.path("other.json")
                with open(other, "w") as f:
                    f.write('{"kind":"torcx-package-list-v0","value":{"packages":[]}}\n')
                run(["gpg", "--batch", "--yes", "--armor", "--detach-sign", "-o", asc + ".tmp", other])
                os.replace(asc + ".tmp", asc)
            else:
                os.replace(asc + ".good", asc)

    def node_files(self, name, api_up=True, upgrade_os=False, update_engine=None, master=False,
                   installer_files=True, torcx_base="/var/lib/torcx"):
        """The files Ignition puts on the node: nodestrap's configuration, trust anchors and
        keyring, its kubeconfig (the nodestrap-bootstrap identity of the run's real cluster,
        or a port where nothing listens), the installer fallback files (unless the image's own
        should be used), and what the kubelet needs to join and run its static pod."""
        cp = self.cluster
        d = self.path(name + "-files")
        os.makedirs(d)
        kubeconfig = cp.kubeconfig("nodestrap-bootstrap")
        if not api_up:
            kubeconfig = kubeconfig.replace(":%d\n" % cp.api_port, ":%d\n" % free_port())  # nothing listens there
        prev = self.images["KUBE_PREV_VERSION"]
        files = {
            "/etc/nodestrap/bootstrap.conf": (
                "# nodestrap bootstrap settings (same keys as its options)\n"
                "torcx-manifest-url=https://%s:%d/manifests/{{.Board}}/{{.OSVersion}}/torcx_manifest.json\n"
                "keyring=/etc/nodestrap/keyring.asc\n"
                "ca-file=/etc/nodestrap/ca.pem\n"
                "upgrade-os=%s\n"
                "api-tries=2\n"
                "api-retry-delay=2\n"
                "fetch-attempts=3\n"
                "update-timeout=120\n" % (GUEST_HOST, self.release_port, "true" if upgrade_os else "false")),
            "/etc/nodestrap/keyring.asc": open(self.path("keyring.asc")).read(),
            "/etc/nodestrap/ca.pem": open(self.path("ca.pem")).read(),
            "/etc/kubernetes/kubeconfig": kubeconfig,
            "/etc/kubernetes/installer/kubelet.env": 'KUBELET_IMAGE_TAG="%s"\n' % prev,
            "/etc/kubernetes/installer/runtime-mappings.yaml": self.mappings(),
            "/etc/hostname": name + "\n",
            "/etc/kubernetes/bootstrap-kubelet.conf": cp.kubeconfig(token=cp.bootstrap_token),
            "/etc/kubernetes/pki/ca.crt": cp.ca_pem(),
            "/var/lib/kubelet/config.yaml": kubelet_config(),
            "/etc/kubernetes/manifests/probe.yaml": static_pod(self.images["BUSYBOX_REF"]),
        }
        if not installer_files:
            del files["/etc/kubernetes/installer/kubelet.env"]
            del files["/etc/kubernetes/installer/runtime-mappings.yaml"]
        if torcx_base != "/var/lib/torcx":
            # torcx's own configuration moves its stores: nodestrap must stage where torcx looks.
            files["/etc/torcx/config.json"] = json.dumps(
                {"kind": "torcx-config-v0", "value": {"base_dir": torcx_base}}) + "\n"
        if update_engine:
            files["/etc/nodestrap-test/update-engine.args"] = update_engine
        if master:
            files["/opt/tectonic/bootkube.sh"] = (
                "echo 'nodestrap-qemu: bootkube ran' >/dev/console\n")
            files["/opt/tectonic/tectonic-wrapper.sh"] = (
                "echo 'nodestrap-qemu: tectonic ran' >/dev/console\n")
        args = []
        for node_path, text in files.items():
            local = os.path.join(d, node_path.strip("/").replace("/", "_"))
            with open(local, "w") as f:
                f.write(text)
            args += ["--file", "%s=%s" % (node_path, local)]
        return args

    def mappings(self):
        """The runtime mappings of the run's two Kubernetes releases: docker 20.10 (this run's
        torcx image), else the vendored 1.12."""
        minor = lambda v: ".".join(v.lstrip("v").split(".")[:2])
        return "kind: VersionManifestV1\nversions:\n  k8s:\n" + "".join(
            '    "%s":\n      docker: ["%s", "1.12"]\n' % (minor(self.images[k]), DOCKER)
            for k in ("KUBE_PREV_VERSION", "KUBE_VERSION"))

    def stop(self):
        for f in self.on_stop:
            f()
        self.server.terminate()
        self.server.wait()
        subprocess.run(["gpgconf", "--kill", "gpg-agent"], stderr=subprocess.DEVNULL)
