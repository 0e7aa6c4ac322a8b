"""The torcx family: firstboot, initrd, tampered, apiserver-down, os-update, clock-past. The
nodes boot the real torcx (v0.2.0) and join the run's real control plane (harness/cluster.py):
the kubelet of the release kubelet.env names talks CRI to the containerd inside the Docker torcx
image nodestrap staged. A scenario passes only when its Node registers with that kubelet version
and that containerd, and its static pod runs."""
import hashlib
import json
import os
import re
import subprocess
import time

from harness.common import (
    CURRENT, DOCKER, DOCKER_RE, KUBELET_RE, NEXT_OS, OS_VERSION, PREVIOUS, SIG_FAIL, Scenario, TOP,
    disk_file, disk_ls, joined, run, say, timings
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
    Scenario("reprovision-rhcos", "an RHCOS-like node re-bootstraps in place through the machine-config-daemon",
             initrd=False, boots=2, tag=None, os_after=None),
]


def run_scenario(s, sc, accel, boot_timeout):
    """Returns (ok, boots, seconds to kubelet or None, problems)."""
    if sc.name == "reprovision-rhcos":
        return run_reprovision(s, sc, accel, boot_timeout)
    say("\n=== %s: %s" % (sc.name, sc.doc))
    files = s.node_files(sc.name, api_up=sc.api_up, upgrade_os=sc.upgrade_os,
                         update_engine=sc.update_engine, master=sc.master,
                         installer_files=sc.api_up, torcx_base=sc.torcx_base)
    config = s.path(sc.name + ".ign")
    with open(config, "w") as f:
        run([os.path.join(TOP, "ignition/render"), "master" if sc.master else "worker"] + files, stdout=f)
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
    events = []  # (seconds, boot, kind, text)
    joining = Joining(s.cluster, sc.name)
    t0 = time.time()
    kubelet = []  # (seconds, the line's details) once the kubelet started
    docker = []  # (seconds, details) once docker-check ran a container (or failed)
    tamper = {"failures": 0, "healed": False}
    if sc.tamper:
        s.tamper(True)

    def on_line(now, boots, line):
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
        # Once the kubelet started: its Node registered and its pod ran, and docker ran a
        # container. A master goes on until tectonic ran (bootkube and tectonic come after the
        # kubelet started).
        if kubelet:
            joining.poll(time.time() - t0)
        return bool(kubelet) and bool(docker) and joining.done() and (
            not sc.master or any(e[3] == "tectonic ran" for e in events) or time.time() - t0 - kubelet[0][0] > 120)

    try:
        boots, problems, log = boot_until(s, sc, disk, config, accel, boot_timeout, base, t0, events,
                                          on_line, done, "a reboot or the kubelet", "no kubelet")
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
    problems += check(s, sc, boots, kubelet[1], events, disk)
    problems += check_node(s, sc, joining)
    problems += check_docker(docker[1])
    for p in problems:
        say("  problem: " + p)
    # docker-check reports when `docker info` first answered, in seconds of that boot's uptime.
    info_at = re.search(r"info-at=([\d.]+)", docker[1])
    boot_kernel = [t for t, _, k, _ in events if k == "kernel"]
    docker_at = boot_kernel[-1] + float(info_at.group(1)) if info_at and boot_kernel else None
    sc.timings = timings(events, kubelet[0], docker_at)
    sc.timings.update(joined(events, joining))
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


def check(s, sc, boots, kubelet_line, events, disk):
    """What the scenario promises, from the markers and from the disk the node left."""
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
    raw = disk + ".raw"
    run(["qemu-img", "convert", "-U", "-O", "raw", disk, raw])
    try:
        # The VM was stopped with the root mounted: replay the journal (on the copy) first, as
        # the next mount would. 0 and 1 (errors corrected, e.g. free counts) are fine.
        fsck = subprocess.run(["e2fsck", "-fy", raw], capture_output=True, text=True)
        if fsck.returncode not in (0, 1):
            p.append("e2fsck on the node's disk: exit %d: %s" % (fsck.returncode, fsck.stdout[-500:]))
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
        p += check_record(s, sc, raw)
        if sc.torcx_base != "/var/lib/torcx" and disk_ls(raw, "/var/lib/torcx/store"):
            p.append("something was staged under /var/lib/torcx/store although torcx's config.json moves the stores")
        for d in ("/etc/kubernetes", "/etc/torcx", "/etc/torcx/profiles"):
            left = [n for n in disk_ls(raw, d) if ".nodestrap-" in n]
            if left:
                p.append("temp files left in %s: %r" % (d, left))
    finally:
        os.unlink(raw)
    return p


def check_record(s, sc, raw):
    """The status record kept under /var/lib: the run is done, the version and its source are
    the scenario's, and every store holds the file it lists with the published digest."""
    p = []
    try:
        rec = json.loads(disk_file(raw, "/var/lib/nodestrap/status.json") or b"")
    except ValueError as e:
        return ["/var/lib/nodestrap/status.json on disk is not JSON: %s" % e]
    if (rec.get("state"), rec.get("phase"), rec.get("exit_code")) != ("done", "done", 0):
        p.append("status record: state %s phase %s exit %s" % (rec.get("state"), rec.get("phase"), rec.get("exit_code")))
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
