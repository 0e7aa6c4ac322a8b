"""The in-place family: reprovision-rhcos, an RHCOS-like node that re-bootstraps itself
through the machine-config-daemon."""
import json
import os
import subprocess
import time

from harness.common import (
    IPB_LABEL, RENDERED, RHCOS_NODE, disk_file, run, say,
)
from harness.vm import boot_until


def run_reprovision(s, sc, accel, boot_timeout):
    """reprovision-rhcos: boot 1 runs `nodestrap reprovision` (as the DaemonSet's pod would),
    which hands the served config to the stand-in machine-config-daemon; it writes the files and
    reboots. Boot 2 comes up with them, and a second run finds the reprovision done."""
    say("\n=== %s: %s" % (sc.name, sc.doc))
    config = s.path(sc.name + ".ign")
    with open(config, "w") as f:
        json.dump(s.rhcos_files(), f)
    run(["ignition-validate", config])
    disk = s.path(sc.name + ".qcow2")
    run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", s.images["NODE_IMAGE"], "-F", "raw", disk])
    base = ["root=LABEL=root", "rw", "console=ttyS0", "loglevel=5", "panic=-1", "rd.shell=0",
            "rd.emergency=poweroff", "systemd.show_status=1", "rd.nodestrap=0"]
    events = []
    t0 = time.time()
    finished = []

    def on_line(now, boots, line):
        if boots >= 2 and "nodestrap-qemu: reprovision exited 0" in line and not finished:
            finished.append(now)

    def done(boots):
        return bool(finished) and any(e[1] == boots and e[3] == "rhcos-marker ran" for e in events)

    boots, problems, log = boot_until(s, sc, disk, config, accel, boot_timeout, base, t0, events,
                                      on_line, done, "a reboot", "not finished")
    finished = finished[0] if finished else None
    if not problems:
        problems += check_reprovision(s, sc, boots, events, disk)
    for p in problems:
        say("  problem: " + p)
    if problems and log:
        tail = open(log, errors="replace").read().splitlines()[-40:]
        say("  last lines of %s:\n    %s" % (log, "\n    ".join(tail)))
    return not problems, boots, finished, problems


def check_reprovision(s, sc, boots, events, disk):
    p = []
    if boots != sc.boots:
        p.append("%d boots, expected %d" % (boots, sc.boots))
    texts = [(b, k, t) for _, b, k, t in events]
    want = [
        (1, "nodestrap", "flow rhcos (from ID=rhcos in /etc/os-release)"),
        (1, "guest", "mcd applied %s" % RENDERED),
        # nodestrap's own last line: the unit's ExecStartPost echo can lose the race against the
        # reboot the machine-config-daemon has queued by then (seen once in a full run).
        (1, "nodestrap", "(exit 0)"),
        (2, "guest", "rhcos-marker ran"),
        (2, "nodestrap", "rebooted into its new configuration since the hand-off; reprovision done"),
    ]
    for boot, kind, text in want:
        if not any(b == boot and k == kind and text in t for b, k, t in texts):
            p.append("boot %d: no %s line %r" % (boot, kind, text))
    # Server side: the label patch, and the progress events in order, with the token.
    patches = [l.rstrip("\n").split(" ", 3)[3] for l in open(s.server_log) if " api PATCH-BODY /api/v1/nodes/%s " % RHCOS_NODE in l]
    if patches != ['/api/v1/nodes/%s {"metadata": {"labels": {"%s": null}}}' % (RHCOS_NODE, IPB_LABEL)]:
        p.append("label patches seen by the API server: %r" % patches)
    events_seen = [json.loads(l) for l in open(s.path("progress.jsonl"))] if os.path.exists(s.path("progress.jsonl")) else []
    phases = [(e["phase"], e["status"]) for e in events_seen]
    want_phases = [(ph, st) for ph in ("preflight", "fetch", "configure", "reboot") for st in ("started", "succeeded")]
    if phases != want_phases:
        p.append("progress events: %r" % phases)
    if any(e.get("node") != RHCOS_NODE for e in events_seen):
        p.append("progress events name another node: %r" % events_seen)
    raw = disk + ".raw"
    run(["qemu-img", "convert", "-U", "-O", "raw", disk, raw])
    try:
        fsck = subprocess.run(["e2fsck", "-fy", raw], capture_output=True, text=True)
        if fsck.returncode not in (0, 1):
            p.append("e2fsck on the node's disk: exit %d: %s" % (fsck.returncode, fsck.stdout[-500:]))
        got = {path: disk_file(raw, path) for path in (
            "/etc/kubernetes/kubeconfig", "/etc/machine-config-daemon/node-annotations.json", "/etc/rhcos-reprovisioned",
            "/etc/ignition-machine-config-encapsulated.json", "/etc/ignition-machine-config-encapsulated.json.bak",
            "/var/lib/nodestrap/reprovision/state.json")}
        if got["/etc/kubernetes/kubeconfig"] != s.node_kubeconfig.encode():
            p.append("/etc/kubernetes/kubeconfig is not the Secret's kubeconfig: %r" % got["/etc/kubernetes/kubeconfig"])
        ann = json.loads(got["/etc/machine-config-daemon/node-annotations.json"] or b"null")
        want_ann = {"machineconfiguration.openshift.io/%s" % k: v for k, v in
                    (("currentConfig", RENDERED), ("desiredConfig", RENDERED), ("state", "Done"))}
        if ann != want_ann:
            p.append("node-annotations.json: %r" % ann)
        if got["/etc/rhcos-reprovisioned"] != RENDERED.encode() + b"\n":
            p.append("the served config's own file: %r" % got["/etc/rhcos-reprovisioned"])
        if got["/etc/ignition-machine-config-encapsulated.json"] is not None or not got["/etc/ignition-machine-config-encapsulated.json.bak"]:
            p.append("the MachineConfig file was not consumed (renamed to .bak) by the machine-config-daemon")
        else:
            mc = json.loads(got["/etc/ignition-machine-config-encapsulated.json.bak"])
            if mc.get("metadata", {}).get("name") != RENDERED or mc.get("kind") != "MachineConfig":
                p.append("the MachineConfig handed over: %r" % mc.get("metadata"))
        state = json.loads(got["/var/lib/nodestrap/reprovision/state.json"] or b"{}")
        if state.get("phase") != "done" or state.get("config") != RENDERED:
            p.append("state.json: %r" % state)
    finally:
        os.unlink(raw)
    return p
