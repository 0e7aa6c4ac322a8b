"""The torcx family: firstboot, initrd, tampered, apiserver-down, os-update, clock-past. The
nodes boot the real torcx (v0.2.0) and join the run's real control plane (harness/cluster.py):
the kubelet of the release kubelet.env names talks CRI to the containerd inside the Docker torcx
image nodestrap staged. A scenario passes only when its Node registers with that kubelet version
and that containerd, its static pod runs, and the boot check (nodestrap-verify.service) verified
the profile, kubelet.env's tag and, through the kubelet's kubelet.conf, the Node's kubelet and
runtime (clock-past: or recorded the API server unreached, see expected_api) in the boot the
kubelet runs in.

torcx-verify boots one node three times and proves the boot check's torcx case: the profile the
bootstrap chose does not apply (its archive is damaged on the disk at the bootstrap's reboot),
the check records the mismatch and selects the known-good profile for the next boot; a stand-in
for the operator takes the reboot nodestrap recorded, and torcx applies the known-good profile,
which the check verifies on the node itself while the API server stays unreached (no Node: the
vendor docker has no containerd for the kubelet)."""
import hashlib
import json
import os
import re
import time

from harness.common import (
    CURRENT, DOCKER, DOCKER_RE, HERE, KUBELET_RE, NEXT_OS, OS_VERSION, PREVIOUS, SIG_FAIL, Scenario, TOP,
    disk_copy, disk_file, disk_ls, joined, run, say, timings
)
from harness.cluster import Joining
from harness.vm import boot_until
from harness.inplace import run_reprovision


SCENARIOS = [
    Scenario("firstboot", "Ignition delivers the units; bootstrap on the real root; one reboot",
             initrd=False, boots=2, tag=CURRENT, os_after=OS_VERSION),
    Scenario("initrd", "the dracut hook stages everything before switch-root, where torcx's config.json "
             "puts its stores; no reboot", initrd=True, boots=1, tag=CURRENT, os_after=OS_VERSION, master=True,
             torcx_base="/var/lib/torcx-site"),
    Scenario("tampered", "bad manifest signature: nothing staged, unit retries, converges once fixed",
             initrd=True, boots=2, tag=CURRENT, os_after=OS_VERSION, tamper=True),
    Scenario("apiserver-down", "no API server for nodestrap: the version comes from the image's installer "
             "kubelet.env (the previous release), and that kubelet joins",
             initrd=True, boots=1, tag=PREVIOUS, os_after=OS_VERSION, api_up=False),
    Scenario("os-update", "update_engine reports an update: both stores staged, one reboot",
             initrd=False, boots=2, tag=CURRENT, os_after=NEXT_OS, upgrade_os=True,
             update_engine=("UPDATE_ENGINE_ARGS=--on-attempt UPDATE_STATUS_CHECKING_FOR_UPDATE,"
                            "UPDATE_STATUS_UPDATE_AVAILABLE,UPDATE_STATUS_DOWNLOADING,UPDATE_STATUS_VERIFYING,"
                            "UPDATE_STATUS_FINALIZING,UPDATE_STATUS_UPDATED_NEED_REBOOT --new-version %s --step 1\n"
                            "NEW_VERSION=%s\n" % (NEXT_OS, NEXT_OS)),
             stores=(OS_VERSION, NEXT_OS)),
    Scenario("clock-past", "the real-time clock starts in 2015: nodestrap names the clock, not a certificate, "
             "and goes on once time is synchronised; one reboot",
             initrd=True, boots=2, tag=CURRENT, os_after=OS_VERSION, rtc_past=True),
    Scenario("torcx-verify", "the boot check on torcx: the profile the bootstrap chose does not apply (its "
             "archive damaged on the disk at the reboot); verify records it and selects the known-good profile "
             "for the next boot; the operator's stand-in reboots, and torcx applies it",
             initrd=False, boots=3, tag=CURRENT, os_after=OS_VERSION, runner=lambda *a: run_verify(*a)),
    Scenario("reprovision-rhcos", "an RHCOS-like node re-bootstraps in place through the machine-config-daemon",
             initrd=False, boots=2, tag=None, os_after=None),
]

# nodestrap verify's lines on the console (journald has taken the priority prefix off): its
# rows (the torcx ones, kubelet.env's tag, the Node's two when the API server answered), its
# verdict, and its word when the API server did not answer in time.
VERIFY_RE = re.compile(r"nodestrap\[\d+\]: (?:<\d>)?((?:check torcx |check \S+/docker --version|check kubelet |"
                       r"check Node |verified: |reboot needed: |the node does not run |expecting the known-good |"
                       r"API server not asked in time: |\S+: the bootstrap of this boot selected ).*)")
VERDICTS = ("verified: ", "the node does not run ")
# systemd's status line when the unit fails, its name and description cut at the console's width
# ("Failed to start nodestrap-…ntime nodestrap chose (nodestrap).").
VERIFY_FAILED = re.compile(r"Failed to start nodestrap-(?:verify\.s|.*nodestrap chose \(nodestrap\))")
# The local rows of a torcx check (docs/verify.md, "torcx nodes"): the three of the profile, and
# kubelet.env's tag (only when the last bootstrap completed, as every record checked here did).
CHECKS = ["torcx seal", "torcx applied docker", "/run/torcx/bin/docker --version",
          "kubelet /etc/kubernetes/kubelet.env KUBELET_IMAGE_TAG"]
# What the check expects the Node to report as its runtime: a dockershim kubelet's docker, or a
# runtime of the applied image at the version its own --version says (the kubelet here talks CRI
# to the containerd of the Docker torcx image).
RUNTIME_EXPECTED = "docker://%s, or a runtime in /run/torcx/bin at the version it says"
# verify's default --api-wait, and its note when the API server gave no usable answer in it.
API_WAIT = 60
UNREACHED_NOTE = "no answer within --api-wait %d s: " % API_WAIT
KUBELET_CONF_NOTE = "from /etc/kubernetes/kubelet.conf"

KNOWN_GOOD = "/etc/torcx/profiles/nodestrap-known-good.json"
# torcx-verify's guest: the disk fault at the bootstrap's reboot and the operator's stand-in.
GUEST = os.path.join(HERE, "guest/files")
OPERATOR_RE = re.compile(r"nodestrap-qemu: operator: (.*)")
FAULT_RE = re.compile(r"nodestrap-qemu: disk fault: (.*)")
GENERATOR_RE = re.compile(r"(/usr/lib/systemd/system-generators/torcx-generator failed .*)")


def api_rows(node):
    """The rows the API server's answer adds, for Node `node` (the host name: the scenario's)."""
    return ["Node %s nodeInfo.kubeletVersion" % node, "Node %s nodeInfo.containerRuntimeVersion" % node]


def expected_api(sc):
    """What `verification.api` may be in the boot the kubelet runs in. The kubelet joins the
    run's real control plane in every torcx scenario: its bootstrap-kubelet.conf names the real
    API server even in apiserver-down, where only nodestrap's own /etc/kubernetes/kubeconfig points
    where nothing listens (harness/world.py), and verify asks through the kubelet's kubelet.conf;
    so the Node registers within verify's 60 s and confirms (`confirmed`). clock-past is the
    exception: its second boot starts again with the clock in the past, the kubelet cannot
    TLS-bootstrap (kubelet.conf does not exist) until the timesyncd stand-in sets the time, up to
    60 s after it starts, and whether the kubelet then registers before verify's wait runs out is
    a race: `unreached` (the usual outcome, the note saying why) or `confirmed`."""
    return ("unreached", "confirmed") if sc.rtc_past else ("confirmed",)


class BootCheck:
    """What nodestrap-verify.service said on the console, boot by boot: its lines, and when
    systemd reported the unit failed."""

    def __init__(self):
        self.said = []  # (seconds, boot, text)
        self.failed = {}  # boot: seconds

    def see(self, now, boots, line):
        m = VERIFY_RE.search(line)
        if m:
            self.said.append((now, boots, m.group(1)))
        if VERIFY_FAILED.search(line):
            self.failed.setdefault(boots, now)

    def lines(self, boot):
        return [t for _, b, t in self.said if b == boot]

    def verdict(self, boot):
        """(seconds, text) of the check's verdict in that boot, or None."""
        return next(((t, x) for t, b, x in self.said if b == boot and x.startswith(VERDICTS)), None)

    def figures(self, events):
        """Seconds from each boot's kernel start to the check's verdict, where it gave one."""
        kernel = {b: t for t, b, k, _ in events if k == "kernel"}
        out = {}
        for b in sorted({b for _, b, _ in self.said}):
            v = self.verdict(b)
            if v and b in kernel:
                out["boot %d: kernel to the boot check's verdict (%s)"
                    % (b, "verified" if v[1].startswith("verified") else "mismatch")] = round(v[0] - kernel[b], 1)
        return out


def prepare(s, sc, files=(), units=()):
    """The scenario's Ignition config (ignition/render's role with the node's files, and any
    further files and units), checked by ignition-validate; its disk, a copy-on-write overlay of
    the node image; the kernel arguments of every boot."""
    args = s.node_files(sc.name, api_up=sc.api_up, upgrade_os=sc.upgrade_os,
                        update_engine=sc.update_engine, master=sc.master,
                        installer_files=sc.api_up, torcx_base=sc.torcx_base)
    args += [a for f in files for a in ("--file", f)] + [a for u in units for a in ("--unit", u)]
    config = s.path(sc.name + ".ign")
    with open(config, "w") as f:
        run([os.path.join(TOP, "ignition/render"), "master" if sc.master else "worker"] + args, stdout=f)
    run(["ignition-validate", config])
    disk = s.path(sc.name + ".qcow2")
    run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", s.images["NODE_IMAGE"], "-F", "raw", disk])
    base = ["root=LABEL=root", "rw", "console=ttyS0", "loglevel=5", "panic=-1", "rd.shell=0",
            "rd.emergency=poweroff", "systemd.show_status=1",
            # Debian's kernel enables AppArmor, and dockerd then refuses to start containers
            # without a profile (Container Linux has no AppArmor).
            "apparmor=0"]
    if not sc.initrd:
        base.append("rd.nodestrap=0")
    if os.environ.get("NODESTRAP_QEMU_DEBUG") == "1":
        base.append("systemd.journald.forward_to_console=1")
    return config, disk, base


def say_figures(figures):
    for k, v in figures.items():
        say("  %-60s %6.1f s" % (k, v))


def run_scenario(s, sc, accel, boot_timeout):
    """Returns (ok, boots, seconds to kubelet or None, problems)."""
    if sc.name == "reprovision-rhcos":
        return run_reprovision(s, sc, accel, boot_timeout)
    say("\n=== %s: %s" % (sc.name, sc.doc))
    config, disk, base = prepare(s, sc)
    events = []  # (seconds, boot, kind, text)
    joining = Joining(s.cluster, sc.name)
    bootcheck = BootCheck()
    t0 = time.time()
    kubelet = []  # (seconds, the line's details) once the kubelet started
    docker = []  # (seconds, details) once docker-check ran a container (or failed)
    tamper = {"failures": 0, "healed": False}
    if sc.tamper:
        s.tamper(True)

    def on_line(now, boots, line):
        bootcheck.see(now, boots, line)
        if sc.tamper and "nodestrap[" in line and SIG_FAIL in line:
            tamper["failures"] += 1
            # Failed in the initramfs and twice on the real root: the unit keeps
            # retrying and nothing was staged. Now serve the good signature.
            if tamper["failures"] >= 3 and not tamper["healed"]:
                s.tamper(False)
                tamper["healed"] = True
                events.append((now, boots, "harness", "signature fixed"))
                say("%7.1fs  boot %d  harness   signature fixed on the server after %d failures"
                    % (now, boots, tamper["failures"]))
        m = KUBELET_RE.search(line)
        if m and not kubelet:
            kubelet.append((now, m.group(1)))
        m = DOCKER_RE.search(line)
        if m and not docker:
            docker.append((now, m.group(1)))
        if kubelet:
            joining.poll(now)

    def done(boots):
        # Once the kubelet started: its Node registered and its pod ran, docker ran a container,
        # and the boot check gave its verdict in this boot. A master goes on until tectonic ran
        # (bootkube and tectonic come after the kubelet started).
        if kubelet:
            joining.poll(time.time() - t0)
        return bool(kubelet) and bool(docker) and joining.done() and bootcheck.verdict(boots) is not None and (
            not sc.master or any(e[3] == "tectonic ran" for e in events) or time.time() - t0 - kubelet[0][0] > 120)

    try:
        boots, problems, log = boot_until(s, sc, disk, config, accel, boot_timeout, base, t0, events,
                                          on_line, done, "a reboot or the kubelet",
                                          "no kubelet, or no verdict of the boot check")
    finally:
        if sc.tamper and not tamper["healed"]:
            s.tamper(False)
    kubelet = kubelet[0] if kubelet else None
    docker = docker[0] if docker else None
    if problems:
        for p in problems:
            say("  problem: " + p)
        tail = open(log, errors="replace").read().splitlines()[-40:]
        say("  last lines of %s:\n    %s" % (log, "\n    ".join(tail)))
        return False, boots, None, problems
    read = {}  # the record on the disk, as check() read it
    problems += check(s, sc, boots, kubelet[1], events, disk, read)
    problems += check_node(s, sc, joining)
    problems += check_docker(docker[1])
    rec = read.get("record") or {}
    problems += check_verified(s, sc, boots, bootcheck, (rec.get("verification") or {}).get("api"))
    figures = bootcheck.figures(events)
    say_figures(figures)
    own = say_check_time("boot %d" % boots, rec)
    for p in problems:
        say("  problem: " + p)
    # docker-check reports when `docker info` first answered, in seconds of that boot's uptime.
    info_at = re.search(r"info-at=([\d.]+)", docker[1])
    boot_kernel = [t for t, _, k, _ in events if k == "kernel"]
    docker_at = boot_kernel[-1] + float(info_at.group(1)) if info_at and boot_kernel else None
    sc.timings = timings(events, kubelet[0], docker_at)
    sc.timings.update(joined(events, joining))
    sc.timings.update(figures)
    sc.timings.update(own)
    sc.proof = joining.info
    return not problems, boots, kubelet[0], problems


def release(s, tag):
    return s.images["KUBE_VERSION" if tag == CURRENT else "KUBE_PREV_VERSION"]


def check_node(s, sc, joining):
    """The proof: the API server knows the Node, with the kubelet of the release nodestrap chose
    and the containerd of the torcx image it staged, and the kubelet ran the static pod."""
    p = []
    kubelet, runtime = joining.info or (None, None)
    if kubelet != release(s, sc.tag):
        p.append("the Node reports kubeletVersion %r, nodestrap chose %s" % (kubelet, release(s, sc.tag)))
    want = "containerd://" + s.images["TORCX_CONTAINERD_VERSION"]
    if runtime != want:
        p.append("the Node reports containerRuntimeVersion %r, expected %s (the torcx image's)" % (runtime, want))
    if joining.running is None:
        p.append("the static pod's mirror pod never ran")
    return p


def check_docker(line):
    """docker-check's line: the torcx image's dockerd answered `docker info` and ran a
    container from the imported busybox root."""
    fields = dict(re.findall(r"(\S+?)=(\S+)", line))
    p = []
    if line.startswith("failed"):
        return ["the torcx image's docker: " + line]
    if not fields.get("server", "").startswith(DOCKER + "."):
        p.append("docker info reports server %s, expected %s.x" % (fields.get("server"), DOCKER))
    if fields.get("container") != "container-ran-on-Linux":
        p.append("the container printed %r, expected 'container-ran-on-Linux'" % fields.get("container"))
    return p


def check(s, sc, boots, kubelet_line, events, disk, read):
    """What the scenario promises, from the markers and from the disk the node left (the status
    record it read goes into `read`)."""
    p = []
    if boots != sc.boots:
        p.append("%d boots, expected %d" % (boots, sc.boots))
    fields = dict(re.findall(r"(\S+?)=('[^']*'|\S+)", kubelet_line))
    tag = release(s, sc.tag)
    want = {"KUBELET_IMAGE_TAG": tag, "torcx-docker": DOCKER, "os": sc.os_after,
            "kubelet": "/usr/lib/kubernetes/%s/kubelet" % tag}
    for k, v in want.items():
        if fields.get(k) != v:
            p.append("kubelet started with %s=%s, expected %s" % (k, fields.get(k), v))
    if "Docker version %s." % DOCKER not in fields.get("docker", ""):
        p.append("torcx's docker binary says %s, expected %s" % (fields.get("docker"), DOCKER))
    texts = [(boot, kind, t) for _, boot, kind, t in events]
    staged_in_initrd = any(k == "nodestrap" and "bootstrap done" in t and b == 1 for b, k, t in texts)
    if sc.initrd and not sc.tamper and not sc.rtc_past and not staged_in_initrd:
        p.append("the initramfs did not report 'bootstrap done'")
    gen = [b for b, k, t in texts if k == "initrd" and "nodestrap-initrd.service enabled" in t]
    # A nodestrap.* kernel argument (clock-past's clock-wait) enables it in every boot, as it
    # would for a node configured on its kernel command line.
    want_gen = list(range(1, boots + 1)) if sc.rtc_past else [1]
    if sc.initrd and gen != want_gen:
        p.append("nodestrap-generator enabled the initramfs unit in boots %r, expected %r" % (gen, want_gen))
    if not sc.initrd and gen:
        p.append("nodestrap-generator enabled the initramfs unit despite rd.nodestrap=0 (boots %r)" % gen)
    if sc.initrd and not any(k == "initrd" and "resolv.conf from systemd-networkd: 10.0.2.3" in t for _, k, t in texts):
        p.append("the initramfs did not get /etc/resolv.conf from systemd-networkd's DHCP lease")
    # An API server that is down is unreachable, not busy: the installer kubelet.env decides
    # (--version-fallback unreachable, the default), and the log and plan line say so.
    if sc.api_up is False and not any(re.match(r"Kubernetes version \S+ from KUBELET_IMAGE_TAG in .*a fallback: "
                                               r"the API server is unreachable", t)
                                      for _, k, t in texts if k == "nodestrap"):
        p.append("no log line says the version came from the installer kubelet.env because the API server is unreachable")
    if sc.api_up is False and not any(re.match(r"nodestrap: k8s=\S+ from=fallback ", t)
                                      for _, k, t in texts if k == "nodestrap"):
        p.append("no plan line `nodestrap: k8s=... from=fallback` on stdout")
    # `nodestrap status`, run by the kubelet's stand-in: the last run is done, the version came
    # from where the scenario says, and a record made in the initramfs is read from the /run
    # that switch-root carried over (after a reboot, from the copy under /var/lib).
    want_status = {"status": "0", "status-k8s": "api-server" if sc.api_up else "fallback",
                   "status-record": "run" if sc.boots == 1 else "var-lib"}
    for k, v in want_status.items():
        if fields.get(k) != v:
            p.append("nodestrap status in the guest: %s=%s, expected %s" % (k, fields.get(k), v))
    if sc.rtc_past:
        p += check_clock(events)
    if sc.tamper:
        fails = [t for b, k, t in texts if k == "nodestrap" and SIG_FAIL in t]
        if len(fails) < 3:
            p.append("expected the signature failure in the initramfs and at least twice on the root, saw %d" % len(fails))
        # Until the server signed correctly: nothing staged, no kubelet.env, no kubelet.
        for _, boot, kind, t in events:
            if kind == "harness":
                break
            if kind == "nodestrap" and re.search(r"downloaded|now names|wrote |bootstrap done", t) or (
                    kind == "systemd" and t.startswith("Started kubelet")):
                p.append("before the signature was fixed: %s" % t)
    if sc.master:
        # bootkube waits for the kubelet to be started (systemd's "Started kubelet.service"),
        # tectonic for bootkube to have completed.
        seen = []
        for _, _, kind, t in events:
            if kind == "systemd" and t.startswith("Started kubelet.service"):
                seen.append("kubelet")
            elif kind == "guest" and t in ("bootkube ran", "tectonic ran"):
                seen.append(t.split()[0])
        for before, after in (("kubelet", "bootkube"), ("bootkube", "tectonic")):
            if after not in seen:
                p.append("%s never ran" % after)
            elif before not in seen or seen.index(before) > seen.index(after):
                p.append("%s ran before %s" % (after, before))
    # The disk: kubelet.env, profile, store, and no temp files left anywhere nodestrap wrote.
    # The VM was stopped with the root mounted: disk_copy replays the journal on a copy.
    with disk_copy(disk) as (raw, fsck):
        p += [fsck] if fsck else []
        env = (disk_file(raw, "/etc/kubernetes/kubelet.env") or b"").decode()
        if "KUBELET_IMAGE_TAG=%s" % tag not in env:
            p.append("kubelet.env on disk: %r" % env)
        nxt = (disk_file(raw, "/etc/torcx/next-profile") or b"").decode().strip()
        prof = disk_file(raw, "/etc/torcx/profiles/%s.json" % (nxt or "tectonic"))
        try:
            images = json.loads(prof)["value"]["images"] if prof else []
        except ValueError:
            images = []
        if nxt != "tectonic" or {"name": "docker", "reference": DOCKER} not in images:
            p.append("profile on disk: next-profile %r, images %r" % (nxt, images))
        for os_version in sc.stores:
            d = "%s/store/%s" % (sc.torcx_base, os_version)
            names = disk_ls(raw, d)
            if names != ["docker:%s.torcx.tgz" % DOCKER]:
                p.append("store %s holds %r" % (d, names))
                continue
            data = disk_file(raw, "%s/docker:%s.torcx.tgz" % (d, DOCKER)) or b""
            if hashlib.sha512(data).hexdigest() != s.image_sha512:
                p.append("%s/docker:%s.torcx.tgz does not match the published sha512" % (d, DOCKER))
        rec, err = read_json(raw, "/var/lib/nodestrap/status.json")
        read["record"] = rec
        p += [err] if err else check_record(s, sc, rec) + check_verification(
            s, rec, "verified", "tectonic", DOCKER, sc.name, expected_api(sc))
        # The boot check kept the profile torcx applied (tectonic's) as the known-good one.
        kept, err = read_json(raw, KNOWN_GOOD)
        if err or profile_docker(kept) != DOCKER:
            p.append("%s on disk: %s" % (KNOWN_GOOD, err or "docker %r, expected %s" % (profile_docker(kept), DOCKER)))
        p += leftovers(sc.torcx_base, raw)
    return p


def read_json(raw, node_path):
    """(the file's JSON, None) or (None, a problem naming it)."""
    data = disk_file(raw, node_path)
    if data is None:
        return None, "%s is not on the disk" % node_path
    try:
        return json.loads(data), None
    except ValueError as e:
        return None, "%s on the disk is not JSON (%s): %r" % (node_path, e, data[:200])


def profile_docker(profile):
    """The docker reference a torcx profile names, or None."""
    try:
        return next(i["reference"] for i in profile["value"]["images"] if i["name"] == "docker")
    except (KeyError, TypeError, StopIteration):
        return None


def leftovers(torcx_base, raw):
    """Nothing staged where torcx does not look, no temp file left anywhere nodestrap wrote."""
    p = []
    if torcx_base != "/var/lib/torcx" and disk_ls(raw, "/var/lib/torcx/store"):
        p.append("something was staged under /var/lib/torcx/store although torcx's config.json moves the stores")
    for d in ("/etc/kubernetes", "/etc/torcx", "/etc/torcx/profiles"):
        left = [n for n in disk_ls(raw, d) if ".nodestrap-" in n]
        if left:
            p.append("temp files left in %s: %r" % (d, left))
    return p


def check_verification(s, rec, outcome, profile, docker, node, api, label="the record"):
    """The boot check's part of the record: `verified` (phase verified, every row agreed) or
    `mismatch` (phase done: the three torcx rows disagreed, nothing of the profile ran, while
    kubelet.env still named the chosen kubelet); the torcx rows expecting `profile` and docker
    `docker`; in a done record, kubelet.env's tag row expecting the `k8s` decision (`+` spelled
    `_`); `verification.api` one of `api`, with the Node `node`'s two rows (the chosen kubelet,
    the torcx image's containerd) exactly when the API server answered, and the note saying
    where from or why not; and the check's times: `local_s` (the checks on the node itself)
    within `duration_s`, which holds verify's whole wait when the API server was unreached."""
    p = []
    v = rec.get("verification") or {}
    phase = "verified" if outcome == "verified" else "done"
    if (rec.get("state"), rec.get("phase"), rec.get("exit_code"), v.get("outcome")) != ("done", phase, 0, outcome) \
            or v.get("api") not in api:
        p.append("%s: state %s phase %s exit %s, verification %s (api %s); expected done, %s, 0, %s (api %s)"
                 % (label, rec.get("state"), rec.get("phase"), rec.get("exit_code"), v.get("outcome"), v.get("api"),
                    phase, outcome, " or ".join(api)))
    k8s = next((d.get("value") for d in rec.get("decisions", []) if d.get("what") == "k8s"), None)
    done = rec.get("state") == "done"
    what = CHECKS[:3] + CHECKS[3:] * done
    want = ["sealed with profile %s" % profile, "docker:%s" % docker, "version %s" % docker]
    want += [(k8s or "").replace("+", "_")] * done
    agree = [outcome == "verified"] * 3 + [True] * done
    answered = v.get("api") in ("confirmed", "mismatch")
    if answered:
        what += api_rows(node)
        want += [k8s, RUNTIME_EXPECTED % docker]
        agree += [v.get("api") == "confirmed"] * 2
    rows = v.get("checks") or []
    if [c.get("what") for c in rows] != what:
        p.append("%s's checks are %r, expected %r" % (label, [c.get("what") for c in rows], what))
    if [c.get("expected") for c in rows] != want:
        p.append("%s's checks expected %r, not %r" % (label, [c.get("expected") for c in rows], want))
    if [c.get("ok") for c in rows] != agree:
        p.append("%s's checks: %r, expected ok %r" % (label, [(c.get("what"), c.get("running"), c.get("ok"))
                                                             for c in rows], agree))
    # What kubelet.env and the Node said: the chosen kubelet, the torcx image's containerd.
    running = {c.get("what"): c.get("running") for c in rows}
    found = {CHECKS[3]: want[3] if done else None}
    if answered:
        found.update(zip(api_rows(node), [k8s, "containerd://" + s.images["TORCX_CONTAINERD_VERSION"]]))
    for w, r in found.items():
        if r is not None and w in running and (running[w] or "").lstrip("v") != r.lstrip("v"):
            p.append("%s: row %r found %r, expected %r" % (label, w, running[w], r))
    note = v.get("api_note") or ""
    want_note = {"confirmed": KUBELET_CONF_NOTE, "mismatch": KUBELET_CONF_NOTE,
                 "skipped": "not asked: the node itself does not run the chosen set"}.get(v.get("api"))
    if not (note == want_note if want_note else note.startswith(UNREACHED_NOTE)):
        p.append("%s: api_note %r, expected %r" % (label, note, want_note or UNREACHED_NOTE + "(why)"))
    dur, loc = v.get("duration_s"), v.get("local_s")
    if not isinstance(dur, (int, float)) or not isinstance(loc, (int, float)) or not 0 <= loc <= dur:
        p.append("%s: duration_s %r, local_s %r: expected both, local_s within duration_s" % (label, dur, loc))
    elif v.get("api") == "unreached" and dur - loc < API_WAIT - 5:
        p.append("%s: unreached after %.1f s of %.1f s beside the local checks, expected the whole --api-wait %d s"
                 % (label, dur - loc, dur, API_WAIT))
    return p


def say_check_time(label, rec):
    """The boot check's own time, as its record holds it: the whole, and of it the checks on the
    node itself (the rest waits for the Node); returns them as timings."""
    v = (rec or {}).get("verification") or {}
    f = lambda x: "%.3f s" % x if isinstance(x, (int, float)) else "-"
    say("  %s: the boot check took %s (duration_s), of which %s on the node itself (local_s); api %s (%s)"
        % (label, f(v.get("duration_s")), f(v.get("local_s")), v.get("api"), v.get("api_note")))
    return {"verify_duration_s": v.get("duration_s"), "verify_local_s": v.get("local_s")}


def check_verified(s, sc, boots, bootcheck, api):
    """The boot check in the boot the kubelet runs in: the local rows agreed (the three torcx ones,
    tectonic with docker 20.10, and kubelet.env's tag) and it verified the profile; the Node's two
    rows on the console exactly when its record says the API server answered (`api`); it failed
    in no boot, and gave no verdict before (a boot the bootstrap ends with its reboot has nothing
    to verify yet)."""
    p = []
    said = bootcheck.lines(boots)
    tag = release(s, sc.tag)
    # The record read: the one kept under /var/lib after a reboot, this boot's in /run when the
    # initramfs bootstrapped.
    verified = re.compile(r"verified: torcx applied profile tectonic with docker %s as /(var/lib|run)/nodestrap/"
                          r"status\.json records; kept as the known-good profile %s;" % (re.escape(DOCKER), KNOWN_GOOD))
    if not any(verified.match(t) for t in said):
        p.append("boot %d: no `%s` from nodestrap verify: %r" % (boots, verified.pattern, said))
    rows = ["check torcx seal: expected sealed with profile tectonic, found sealed with profile tectonic",
            "check torcx applied docker: expected docker:%s, found docker:%s" % (DOCKER, DOCKER),
            "check /run/torcx/bin/docker --version: expected version %s, found version %s" % (DOCKER, DOCKER),
            "check %s: expected %s, found %s" % (CHECKS[3], tag.replace("+", "_"), tag.replace("+", "_"))]
    node_rows = ["check %s: expected %s, found %s" % (w, e, f) for w, e, f in zip(
        api_rows(sc.name), [tag, RUNTIME_EXPECTED % DOCKER], [tag, "containerd://" + s.images["TORCX_CONTAINERD_VERSION"]])]
    if api == "confirmed":
        rows += node_rows
    elif any(t.startswith("check Node ") for t in said):
        p.append("boot %d: verify logged the Node's rows although its record says api %s: %r"
                 % (boots, api, [t for t in said if t.startswith("check Node ")]))
    for row in rows:
        if row not in said:
            p.append("boot %d: verify did not log %r" % (boots, row))
    if bootcheck.failed:
        p.append("nodestrap-verify.service failed in boots %r" % sorted(bootcheck.failed))
    early = [(b, bootcheck.verdict(b)[1]) for b in range(1, boots) if bootcheck.verdict(b)]
    if early:
        p.append("the boot check gave a verdict before the boot the kubelet runs in: %r" % early)
    return p


def check_record(s, sc, rec):
    """The status record kept under /var/lib: the version and its source are the scenario's, and
    every store holds the file it lists with the published digest."""
    p = []
    k8s = [d for d in rec.get("decisions", []) if d.get("what") == "k8s"]
    want_from = "api-server" if sc.api_up else "fallback"
    tag = release(s, sc.tag)
    if not k8s or k8s[0]["value"] != tag or not k8s[0]["source"].startswith(want_from + " "):
        p.append("status record's k8s decision: %r, expected %s from %s" % (k8s, tag, want_from))
    files = {f.get("path"): f.get("digest") for f in rec.get("files", [])}
    for os_version in sc.stores:
        path = "%s/store/%s/docker:%s.torcx.tgz" % (sc.torcx_base, os_version, DOCKER)
        if files.get(path) != "sha512-" + s.image_sha512:
            p.append("status record lists %s as %r, expected the published sha512" % (path, files.get(path)))
    return p


def check_clock(events):
    """clock-past: the initramfs names the clock as wrong (never a certificate) and gives up
    after --clock-wait; on the real root nodestrap waits, the timesyncd stand-in sets the time,
    and the run goes on."""
    p = []
    lines = [(b, t) for _, b, k, t in events if k == "nodestrap"]
    wrong = [t for b, t in lines if b == 1 and re.search(r"the clock is wrong: it says \S+, before \S+ \(", t)]
    gave_up = [t for b, t in lines if b == 1 and "not synchronised within 25 s" in t]
    went_on = [t for b, t in lines if b == 1 and re.search(r"(past \S+ \(.*\): going on|vouches for it .*going on)", t)]
    if len(wrong) < 2:
        p.append("expected the clock named as wrong in the initramfs and on the root, saw %d lines" % len(wrong))
    if not gave_up:
        p.append("the initramfs did not give up on the clock after --clock-wait 25")
    if not went_on:
        p.append("no nodestrap line says the clock is now right and it goes on")
    if not any(k == "guest" and "by the timesyncd stand-in" in t for _, _, k, t in events):
        p.append("the timesyncd stand-in never set the time")
    blamed = [t for _, t in lines if "clock" not in t and re.search(r"certificate|NotValidYet|not valid", t, re.I)]
    if blamed:
        p.append("a certificate was blamed instead of the clock: %s" % blamed[0])
    return p


# torcx-verify: seconds the harness watches boot 3 after the check's verdict (what the kubelet
# makes of the known-good profile's docker), unless the Node's pod runs first.
OBSERVE = 60


def run_verify(s, sc, accel, boot_timeout):
    """torcx-verify. Boot 1: the vendor docker runs; the bootstrap keeps that applied profile as
    nodestrap-known-good, stages docker 20.10 in profile tectonic and reboots; at that shutdown,
    once the bootstrap has stopped, torcx-verify-corrupt.service zeroes 1 MiB of the staged
    archive (a disk fault). Boot 2: torcx's generator cannot unpack it and seals nothing; the boot
    check records the mismatch, makes nodestrap-known-good the next profile, records the reboot
    and fails; the harness reads the disk the boot left; torcx-verify-operator.service, standing in
    for the operator (nodestrap never takes that reboot), reboots once. Boot 3: torcx applies the
    known-good profile and the check verifies it locally; it waits out its --api-wait for a Node
    that never registers (the vendor stand-in docker has no containerd) and records the API server
    unreached. Returns (ok, boots, seconds to kubelet or None, problems)."""
    say("\n=== %s: %s" % (sc.name, sc.doc))
    files = ["/opt/nodestrap-qemu/%s=%s:0755" % (n, os.path.join(GUEST, n))
             for n in ("torcx-verify-corrupt", "torcx-verify-operator")]
    units = [os.path.join(GUEST, n) for n in ("torcx-verify-corrupt.service", "torcx-verify-operator.service")]
    config, disk, base = prepare(s, sc, files, units)
    events, bootcheck, guest, kubelet, st = [], BootCheck(), [], {}, {}
    joining = Joining(s.cluster, sc.name)
    t0 = time.time()

    def on_line(now, boots, line):
        bootcheck.see(now, boots, line)
        m = KUBELET_RE.search(line)
        if m:
            kubelet.setdefault(boots, (now, m.group(1)))
        for kind, rx in (("fault", FAULT_RE), ("operator", OPERATOR_RE), ("generator", GENERATOR_RE)):
            m = rx.search(line)
            if m:
                guest.append((now, boots, kind, m.group(1)))
        if boots == 2 and "reboot: Restarting system" in line and "boot 2" not in st:
            # The disk as boot 2 left it: the guest synced and unmounted before this line; wait
            # for QEMU to let go of the image.
            st["boot 2"] = disk_state(disk, wait=30)

    def done(boots):
        if boots < 3:
            return False
        now = time.time() - t0
        joining.poll(now)
        v = bootcheck.verdict(3)
        return v is not None and (joining.done() or now - v[0] > OBSERVE)

    boots, problems, log = boot_until(s, sc, disk, config, accel, boot_timeout, base, t0, events, on_line, done,
                                      "a reboot (the bootstrap's, then the operator's)",
                                      "the reboot, or in boot 3 the boot check's verdict")
    figures = bootcheck.figures(events)
    sc.timings = dict(figures)
    sc.timings.update(joined(events, joining))
    sc.proof = joining.info
    at_kubelet = kubelet.get(3, (None,))[0]
    say_figures(figures)
    if not problems:
        final = disk_state(disk)
        say_check_time("boot 2", (st.get("boot 2") or {}).get("record"))
        sc.timings.update(say_check_time("boot 3", final["record"]))
        problems = check_torcx_verify(s, sc, boots, events, bootcheck, guest, st.get("boot 2"), final)
        observe(events, kubelet, joining, final)
    for p in problems:
        say("  problem: " + p)
    if problems and log:
        tail = open(log, errors="replace").read().splitlines()[-40:]
        say("  last lines of %s:\n    %s" % (log, "\n    ".join(tail)))
    return not problems, boots, at_kubelet, problems


def disk_state(disk, wait=0):
    """What torcx-verify reads from the node's disk: next-profile, the status record, the
    known-good profile (and its bytes), the staged archive's sha512, kubelet.env."""
    with disk_copy(disk, wait) as (raw, fsck):
        rec, rec_err = read_json(raw, "/var/lib/nodestrap/status.json")
        kept, kept_err = read_json(raw, KNOWN_GOOD)
        archive = disk_file(raw, "/var/lib/torcx/store/%s/docker:%s.torcx.tgz" % (OS_VERSION, DOCKER))
        return {"fsck": fsck, "next": (disk_file(raw, "/etc/torcx/next-profile") or b"").decode().strip(),
                "record": rec, "record_err": rec_err, "kept": kept, "kept_err": kept_err,
                "kept_bytes": disk_file(raw, KNOWN_GOOD) or b"",
                "archive": hashlib.sha512(archive).hexdigest() if archive is not None else None,
                "env": (disk_file(raw, "/etc/kubernetes/kubelet.env") or b"").decode(),
                "leftovers": leftovers("/var/lib/torcx", raw)}


def check_torcx_verify(s, sc, boots, events, bootcheck, guest, second, final):
    """What torcx-verify promises, boot by boot, from the console and from the disk as boot 2 and
    boot 3 left it."""
    p = []
    tag = release(s, sc.tag)
    vendor = "1.12"  # the image's vendor docker (qemu/guest/layout), com.coreos.cl in its profile
    archive = "/var/lib/torcx/store/%s/docker:%s.torcx.tgz" % (OS_VERSION, DOCKER)
    said = lambda b, kind: [t for _, bb, k, t in events if bb == b and k == kind]
    of_guest = lambda b, kind: [t for _, bb, k, t in guest if bb == b and k == kind]
    if boots != sc.boots:
        p.append("%d boots, expected %d" % (boots, sc.boots))
    # Boot 1: the bootstrap keeps the vendor profile torcx applied, stages 20.10, reboots; the
    # disk fault hits the staged archive at that shutdown.
    if not any(t.startswith("/run/torcx/profile.json kept as %s" % KNOWN_GOOD) for t in said(1, "nodestrap")):
        p.append("boot 1: the bootstrap did not keep the applied profile as %s" % KNOWN_GOOD)
    if not any("bootstrap done k8s=%s docker=%s " % (tag, DOCKER) in t and "reboot=needed" in t
               for t in said(1, "nodestrap")):
        p.append("boot 1: no `bootstrap done k8s=%s docker=%s ... reboot=needed`" % (tag, DOCKER))
    if not any(t.startswith("1 MiB of zeros at MiB ") and t.split(" of ", 2)[-1].startswith(archive)
               for t in of_guest(1, "fault")):
        p.append("boot 1: the disk fault did not hit %s: %r" % (archive, of_guest(1, "fault")))
    if bootcheck.verdict(1):
        p.append("boot 1: the boot check gave a verdict before the reboot: %r" % (bootcheck.verdict(1),))
    # Boot 2: torcx seals nothing; the check says what it expected and found, selects the
    # known-good profile, records the reboot and fails; only the operator's stand-in reboots.
    reached = lambda b: any("Reached target torcx.target" in t for t in said(b, "torcx"))
    if reached(2) or not of_guest(2, "generator"):
        p.append("boot 2: torcx's generator did not fail on the damaged archive (torcx.target %s, generator %r)"
                 % ("reached" if reached(2) else "not reached", of_guest(2, "generator")))
    rows = ["check torcx seal: expected sealed with profile tectonic, found not sealed (/run/metadata/torcx "
            "missing): torcx did not complete",
            "check torcx applied docker: expected docker:%s, found torcx applied no profile (/run/torcx/profile.json "
            "missing)" % DOCKER,
            "check /run/torcx/bin/docker --version: expected version %s, found " % DOCKER,
            # kubelet.env still names the chosen kubelet: that row agrees.
            "check %s: expected %s, found %s" % (CHECKS[3], tag.replace("+", "_"), tag.replace("+", "_"))]
    # The local rows failed: the API server is not asked (api skipped), no Node rows.
    for b in (2, 3):
        if any(t.startswith("check Node ") for t in bootcheck.lines(b)):
            p.append("boot %d: verify logged Node rows: %r" % (b, [t for t in bootcheck.lines(b)
                                                                   if t.startswith("check Node ")]))
    for row in rows:
        if not any(t.startswith(row) for t in bootcheck.lines(2)):
            p.append("boot 2: verify did not log %r: %r" % (row, bootcheck.lines(2)))
    if not any(t.startswith("reboot needed: the boot check selected the known-good profile nodestrap-known-good")
               for t in bootcheck.lines(2)):
        p.append("boot 2: no `reboot needed: the boot check selected the known-good profile nodestrap-known-good`")
    v2 = bootcheck.verdict(2)
    if not v2 or not v2[1].startswith("the node does not run what /var/lib/nodestrap/status.json chose: torcx seal: ") \
            or "/etc/torcx/next-profile now selects the known-good profile nodestrap-known-good" not in v2[1] \
            or "the reboot is recorded, not taken" not in v2[1]:
        p.append("boot 2: verify's error does not name the mismatch, the known-good profile and the reboot left "
                 "to the operator: %r" % (v2,))
    if 2 not in bootcheck.failed:
        p.append("boot 2: systemd did not report nodestrap-verify.service failed")
    if not any(t.startswith("the boot check failed and the record asks for a reboot") for t in of_guest(2, "operator")):
        p.append("boot 2: the operator's stand-in did not reboot: %r" % of_guest(2, "operator"))
    if any(t.startswith("rebooting now") or "bootstrap done" in t for t in said(2, "nodestrap") + said(3, "nodestrap")):
        p.append("a bootstrap ran after boot 1, or nodestrap rebooted by itself")
    # The known-good docker boot 3 expects, as the return named it: the vendor's reference in
    # the kept profile, or the version the vendor store resolves it to.
    known = vendor
    if second is None:
        p.append("boot 2 ended without the guest's reboot: its disk was not read")
    else:
        p += check_second(s, sc, second)
        to = (((second["record"] or {}).get("verification") or {}).get("returned") or {}).get("to") or [{}]
        known = to[0].get("version") if to[0].get("version") in (vendor, "com.coreos.cl") else vendor
    # Boot 3: torcx applies the known-good profile; the check verifies it, docker answers as
    # the vendor's, and no one reboots. The local rows agree (kubelet.env's tag too: the record is
    # still the done bootstrap's), so verify asks the API server, which cannot confirm: the
    # vendor docker is a stand-in without containerd, so the kubelet of this boot (and of boot 1,
    # which ran the same profile) fails its CRI check and never registers a Node. verify waits out
    # its --api-wait (60 s) and records `unreached` with the reason (kubelet.conf not written, or
    # no Node) and no Node rows; unreached is never a failure: it verifies, exit 0.
    rows3 = ["check torcx seal: expected sealed with profile nodestrap-known-good, found sealed with profile "
             "nodestrap-known-good",
             "check torcx applied docker: expected docker:%s, found docker:%s" % (known, known),
             "check /run/torcx/bin/docker --version: expected version %s, found version %s" % (known, known),
             "check %s: expected %s, found %s" % (CHECKS[3], tag.replace("+", "_"), tag.replace("+", "_"))]
    for row in rows3:
        if row not in bootcheck.lines(3):
            p.append("boot 3: verify did not log %r: %r" % (row, bootcheck.lines(3)))
    if not any(t.startswith("API server not asked in time: ") for t in bootcheck.lines(3)):
        p.append("boot 3: verify did not say the API server was not asked in time: %r" % bootcheck.lines(3))
    if not reached(3):
        p.append("boot 3: torcx.target was not reached: the known-good profile did not apply")
    v3 = bootcheck.verdict(3)
    verified = "verified: torcx applied profile nodestrap-known-good with docker %s as /var/lib/nodestrap/status.json " \
               "records; kept as the known-good profile %s" % (known, KNOWN_GOOD)
    if not v3 or not v3[1].startswith(verified):
        p.append("boot 3: the boot check did not verify the known-good profile: %r, expected %r (docker as boot 2's "
                 "return named it)" % (v3 and v3[1], verified))
    if any("expected docker:com.coreos.cl, found docker:%s" % vendor in x for x in bootcheck.lines(3)):
        p.append("boot 3: the check compared the known-good profile's vendor reference com.coreos.cl, unresolved, "
                 "with the version torcx applied, which it resolves through the vendor store (%s)" % vendor)
    if 3 in bootcheck.failed:
        p.append("boot 3: nodestrap-verify.service failed")
    if any(t.startswith("the boot check failed") for t in of_guest(3, "operator")):
        p.append("boot 3: the operator's stand-in rebooted again")
    p += ["boot 3: " + x for x in [final["fsck"], final["record_err"], final["kept_err"]] if x]
    if final["record"]:
        p += check_verification(s, final["record"], "verified", "nodestrap-known-good", known, sc.name,
                                ("unreached",), "boot 3's record")
        v = final["record"].get("verification") or {}
        answered = [c.get("running") for c in v.get("checks") or [] if c.get("what") == CHECKS[2]]
        if not answered or vendor not in answered[0]:
            p.append("boot 3: the known-good profile's docker did not answer as %s: %r" % (vendor, answered))
        r = v.get("returned") or {}
        if r.get("result") != "next-profile for the next boot":
            p.append("boot 3's record no longer names the return of boot 2: %r" % r)
    if final["next"] != "nodestrap-known-good":
        p.append("boot 3: next-profile on the disk is %r, expected nodestrap-known-good" % final["next"])
    if profile_docker(final["kept"]) != "com.coreos.cl":
        p.append("boot 3: the known-good profile names docker %r, expected the vendor's com.coreos.cl"
                 % profile_docker(final["kept"]))
    if "KUBELET_IMAGE_TAG=%s" % tag not in final["env"]:
        p.append("kubelet.env on disk: %r" % final["env"])
    p += final["leftovers"]
    return p


def check_second(s, sc, d):
    """The disk as boot 2 left it: the fault is in the archive, next-profile names the
    known-good profile, and the record holds the mismatch, the return and the reboot needed."""
    p = ["boot 2: " + x for x in [d["fsck"], d["record_err"], d["kept_err"]] if x]
    if d["archive"] in (None, s.image_sha512):
        p.append("boot 2: the staged archive is %s" % ("missing" if d["archive"] is None else "intact: no fault"))
    if d["next"] != "nodestrap-known-good":
        p.append("boot 2: next-profile on the disk is %r, expected nodestrap-known-good" % d["next"])
    # The vendor profile torcx applied in boot 1, as torcx wrote it.
    if profile_docker(d["kept"]) != "com.coreos.cl":
        p.append("boot 2: the known-good profile names docker %r, expected com.coreos.cl" % profile_docker(d["kept"]))
    rec = d["record"]
    if not rec:
        return p
    p += check_record(s, sc, rec)
    p += check_verification(s, rec, "mismatch", "tectonic", DOCKER, sc.name, ("skipped",), "boot 2's record")
    v = rec.get("verification") or {}
    reboot = rec.get("reboot") or {}
    if reboot.get("decision") != "needed" or "nodestrap-known-good" not in (reboot.get("reason") or ""):
        p.append("boot 2's record: reboot %r, expected needed for nodestrap-known-good" % reboot)
    r = v.get("returned") or {}
    want = {"name": "docker", "image": KNOWN_GOOD, "digest": "sha256-" + hashlib.sha256(d["kept_bytes"]).hexdigest()}
    to = r.get("to") or [{}]
    if r.get("result") != "next-profile for the next boot" or len(to) != 1 or \
            {k: to[0].get(k) for k in want} != want or to[0].get("version") not in ("1.12", "com.coreos.cl"):
        p.append("boot 2's record: returned %r, expected to %r (docker 1.12, the vendor's) with result "
                 "'next-profile for the next boot'" % (r, want))
    process = (rec.get("process") or {}).get("boot_id")
    if not v.get("boot_id") or r.get("boot_id") != v.get("boot_id") or v.get("boot_id") == process:
        p.append("boot 2's record: boot IDs: check %r, return %r, bootstrap %r (expected the check and the return "
                 "in one boot after the bootstrap's)" % (v.get("boot_id"), r.get("boot_id"), process))
    return p


def observe(events, kubelet, joining, final):
    """What the kubelet made of the known-good profile's docker in boot 3: reported, not
    required (the vendor image's docker is a stand-in that only says its version: no
    containerd for the kubelet's CRI)."""
    k = kubelet.get(3)
    kernel = {b: t for t, b, kd, _ in events if kd == "kernel"}
    if k:
        fields = dict(re.findall(r"(\S+?)=('[^']*'|\S+)", k[1]))
        say("  observed: boot 3: the kubelet started %.1f s after the kernel (torcx-docker=%s docker=%s status=%s)"
            % (k[0] - kernel.get(3, 0), fields.get("torcx-docker"), fields.get("docker"), fields.get("status")))
    else:
        say("  observed: boot 3: the kubelet-wrapper never said it started the kubelet")
    say("  observed: boot 3: the Node %s" % (
        "registered (%s, %s)" % tuple(joining.info) if joining.registered is not None and joining.info
        else "never registered within %d s of the verdict" % OBSERVE))
    if final["record"]:
        v = final["record"].get("verification") or {}
        say("  observed: the record after boot 3: phase %s, verification %s in %s s (local_s %s s), api %s, reboot %r"
            % (final["record"].get("phase"), v.get("outcome"), v.get("duration_s"), v.get("local_s"), v.get("api"),
               final["record"].get("reboot")))
