"""What every part of the QEMU harness shares: the run's constants, console and command
helpers, reading a node's disk, and the Scenario record."""
import contextlib
import dataclasses
import os
import re
import socket
import subprocess
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # qemu/
TOP = os.path.dirname(HERE)
OS_VERSION = "2345.3.0"  # qemu/guest/layout's VERSION_ID
NEXT_OS = "2401.0.0"
# The Kubernetes releases of the run (qemu/build-kubernetes): the cluster's, the previous
# minor's that the installer's fallback kubelet.env names, and an earlier patch of the cluster's
# minor (the patch stream's starting point).
CURRENT, PREVIOUS, PATCH = "current", "previous", "patch"
DOCKER = "20.10"  # qemu/build-docker's image: Debian 12's docker.io 20.10.24
GUEST_HOST = "10.0.2.2"  # the host's 127.0.0.1 as QEMU's user network shows it to the guest
RHCOS_NODE = "node-rhcos"  # qemu/rhcos/ipb-reprovision.service's NODE
IPB_LABEL = "ibm-cloud.kubernetes.io/ipb-schedule"
RENDERED = "rendered-worker-6f0c1d2e3a"
MCO_IMAGE = "quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:" + "cd" * 32
KUBELET_RE = re.compile(r"nodestrap-qemu: kubelet started (.*)")
DOCKER_RE = re.compile(r"nodestrap-qemu: docker (.*)")  # qemu/guest/files/docker-check
QUIET = os.environ.get("NODESTRAP_QEMU_QUIET") == "1"
# NODESTRAP_QEMU_DEADLINE: seconds the whole run may take (CI sets one); boots past it fail.
DEADLINE = time.time() + float(os.environ.get("NODESTRAP_QEMU_DEADLINE", "1e9"))

# One line per event worth seeing in the timeline.
TIMELINE = [
    (re.compile(r"Finished (ignition-files\.service|nodestrap-initrd\.service|k8s-node-bootstrap\.service)"), "systemd"),
    (re.compile(r"Failed to start (\S+\.service)"), "systemd"),
    (re.compile(r"Started (k8s-node-bootstrap\.service|kubelet\.service|bootkube\.service)"), "systemd"),
    (re.compile(r"nodestrap\[\d+\]: (.*)"), "nodestrap"),
    (re.compile(r"Switching root"), "initrd"),
    # torcx's generator logs only to stderr (never the journal): its seal shows as torcx.target.
    (re.compile(r"\] (.*torcx\.target.*)"), "torcx"),
    (re.compile(r"nodestrap-generator: (.*)"), "initrd"),
    (re.compile(r"nodestrap-resolv\[\d+\]: (.*)"), "initrd"),
    (re.compile(r"nodestrap-qemu: (.*)"), "guest"),
    (re.compile(r"fake_update_engine\.py\[\d+\]: (.*)"), "update"),
    (re.compile(r"reboot: (Restarting system|Power down)"), "power"),
    (re.compile(r"(A (?:stop|start) job is running for .*?) \("), "waiting"),
]
ANSI = re.compile(r"\x1b\[[0-9;:]*m")  # systemd 257 writes 256-colour codes as 38:5:N
SIG_FAIL = "signature check against keyring"
# The clock-past scenario's real-time clock at every boot: before nodestrap's build date and any
# certificate the harness makes.
RTC_PAST = "2015-01-01T00:00:00"


def say(msg):
    print(msg, flush=True)


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, text=True, **kw)


_HANDED_OUT = set()


def free_port():
    """A port free now and never handed out before in this run: the kernel may give a closed
    port back at once, and the host's etcd once got kube-controller-manager's that way."""
    while True:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port

def disk_file(raw, node_path):
    r = subprocess.run(["debugfs", "-R", "cat " + node_path, raw], capture_output=True)
    return r.stdout if r.returncode == 0 and b"File not found" not in r.stderr else None


def disk_ls(raw, node_dir):
    r = subprocess.run(["debugfs", "-R", "ls -p " + node_dir, raw], capture_output=True, text=True)
    names = []
    for line in r.stdout.splitlines():
        parts = line.strip("/").split("/")
        if len(parts) >= 5 and parts[4] not in (".", ".."):
            names.append(parts[4])
    return sorted(names)

@contextlib.contextmanager
def disk_copy(disk, wait=0):
    """The node's disk as it is now: a raw copy beside the overlay, its journal replayed on the
    copy (e2fsck, as the next mount would; 0 and 1, errors corrected, are fine). Yields (the raw
    path, a problem or None); the copy goes afterwards. `wait`: seconds to wait first for QEMU to
    let go of the image (its lock), after the guest asked for a reboot."""
    deadline = time.time() + wait
    while time.time() < deadline and subprocess.run(["qemu-img", "info", disk], capture_output=True).returncode:
        time.sleep(0.5)
    raw = disk + ".raw"
    run(["qemu-img", "convert", "-U", "-O", "raw", disk, raw])
    try:
        fsck = subprocess.run(["e2fsck", "-fy", raw], capture_output=True, text=True)
        yield raw, (None if fsck.returncode in (0, 1) else
                    "e2fsck on the node's disk: exit %d: %s" % (fsck.returncode, fsck.stdout[-500:]))
    finally:
        os.unlink(raw)

@dataclasses.dataclass
class Scenario:
    """One QEMU scenario: what the guest boots into and what the harness checks after."""
    name: str
    doc: str
    initrd: bool
    boots: int
    tag: object
    os_after: object
    api_up: bool = True
    upgrade_os: bool = False
    update_engine: object = None
    master: bool = False
    tamper: bool = False
    stores: tuple = (OS_VERSION,)
    runner: object = None
    rtc_past: bool = False
    torcx_base: str = "/var/lib/torcx"
    # Filled in by the run: the boot's timeline figures, and what the cluster reported.
    timings: dict = dataclasses.field(default_factory=dict)
    proof: object = None

KERNEL_STAMP = re.compile(r"^\[\s*(\d+\.\d+)\] ")


def note(events, now, boots, line):
    """Add the console line to the timeline if it is an event worth seeing. The kernel's start
    in each boot is its first console line's arrival less that line's printk timestamp
    (loglevel=5 hides the "Linux version" banner)."""
    m = KERNEL_STAMP.search(line)
    if m and not any(b == boots and k == "kernel" for _, b, k, _ in events):
        at = max(now - float(m.group(1)), events[-1][0] if events else 0.0)
        events.append((at, boots, "kernel", "kernel started"))
        if not QUIET:
            say("%7.1fs  boot %d  %-9s %s" % (at, boots, "kernel", "kernel started"))
    for rx, kind in TIMELINE:
        m = rx.search(line)
        if m:
            text = m.group(0) if kind == "systemd" else m.group(1) if m.groups() else m.group(0)
            if events and events[-1][1:] == (boots, kind, text):
                return  # the console repeats status lines
            events.append((now, boots, kind, text))
            if not QUIET:
                say("%7.1fs  boot %d  %-9s %s" % (now, boots, kind, text[:150]))
            return


def timings(events, kubelet_at, docker_at=None):
    """For the benchmark: seconds from the first kernel start to the kubelet (and to `docker info`
    answering, where the scenario runs docker), and nodestrap's own wall time (its first log
    line to its summary line), from the console timeline."""
    kernel = next((t for t, _, k, _ in events if k == "kernel"), None)
    start = next((t for t, _, k, _ in events if k == "nodestrap"), None)
    end = next((t for t, _, k, x in events if k == "nodestrap" and re.search(r"nodestrap: \w+ done ", x)), None)
    return {"kernel_to_kubelet": kubelet_at - kernel if kubelet_at is not None and kernel is not None else None,
            "nodestrap": end - start if start is not None and end is not None else None,
            "kernel_to_docker": docker_at - kernel if docker_at is not None and kernel is not None else None}


def joined(events, joining):
    """For the table and the benchmark: seconds from the first kernel start to the Node's
    registration and to its pod running, as the API server saw them (polled every 3 s)."""
    kernel = next((t for t, _, k, _ in events if k == "kernel"), None)
    since = lambda t: t - kernel if t is not None and kernel is not None else None
    return {"kernel_to_node": since(joining.registered), "kernel_to_pod": since(joining.running)}
