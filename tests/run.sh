#!/usr/bin/env bash
# The test command (README, CI): format check, licence list, the static release binaries for
# amd64 and arm64 (static, size-capped), unit tests, integration tests against both release
# binaries, a short run of every fuzz target, the Ignition configs, the in-cluster manifests,
# and the QEMU scenarios.
#
#   tests/run.sh [PHASE...]    PHASE: lint unit integration arm64 fuzz qemu (default: all of them)
#
# `tests/run.sh lint unit integration` is the short loop of a change: amd64 only, no cost per
# crate, herds of 200 in the ledger's tests, no QEMU (docs/build.md, "Tests and fuzzing").
set -euo pipefail
cd "$(dirname "$0")/.."
all=(lint unit integration arm64 fuzz qemu)
phases=("$@")
[ ${#phases[@]} -gt 0 ] || phases=("${all[@]}")
for p in "${phases[@]}"; do
  [[ " ${all[*]} " == *" $p "* ]] || { echo "tests/run.sh: unknown phase $p (known: ${all[*]})" >&2; exit 2; }
done
want() { [[ " ${phases[*]} " == *" $1 "* ]]; }
# The short loop (no arm64, no QEMU): the amd64 binary alone, and herds of 200 nodes in the
# ledger's tests (CI's: 500) unless told otherwise.
short_loop=
if ! want arm64 && ! want qemu; then
  short_loop=1
  export NODESTRAP_LEDGER_NODES=${NODESTRAP_LEDGER_NODES:-200}
fi
# Each phase's start, minutes and seconds into the run: CI's 90 minutes are a budget, and a slow
# runner's log says where it went.
# Each phase with the disk's free space: a run that fills it says where.
phase() {
  printf 'tests/run.sh: +%dm%02ds %s (%s free in /tmp)\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*" \
    "$(df -h --output=avail /tmp 2>/dev/null | tail -1 | tr -d ' ')" >&2
}
# One line per scenario of qemu/run's results files (NODESTRAP_QEMU_RESULTS), a failed one's
# problems under it; a file a run never wrote (it stopped early) is said as such.
qemu_summary() {
  python3 - "$@" <<'EOF'
import json, sys
for path in sys.argv[1:]:
    try:
        scenarios = json.load(open(path))["scenarios"]
    except (OSError, ValueError, KeyError) as e:
        print("no results in %s (%s): that qemu/run stopped before its table" % (path, e))
        continue
    for s in scenarios:
        print("%-17s %-4s %5s s" % (s["name"], "pass" if s["pass"] else "FAIL", s.get("wall_seconds", "?")))
        for p in s.get("problems") or []:
            print("    problem: " + p)
EOF
}
# What the phases share: the release binaries (integration, arm64, qemu), and the test programs
# built from the Go module proxy (cached by version; test programs only) with Debian 13's
# systemd-repart and containerd and Debian 14's systemd (debootstrap'ed roots, cached by their
# package lists): the real torcx, the oracle of what torcx finds at boot (tests/torcx, the QEMU
# guests), real Kubernetes, the cluster the commands that talk to one are tested against
# (tests/support/cluster.rs) and the QEMU nodes join, real Butane (ignition/check), the signed
# DDIs, the oracle of sysext.conf (tests/sysext/signed.rs) and of hosts.toml folders
# (tests/sysext/oci.rs). Cold, they take minutes: they build in the background while the release
# binaries link (mostly one core: LTO), and are waited for before the tests that need them.
need_bins=; need_go=
if want integration || want arm64 || want qemu; then need_bins=1 need_go=1; fi
go_out=$(mktemp -d)
# The integration tests' worlds (node roots, served files, clusters, namespaces' scratch) go to
# one folder per run: removed once the tests pass, kept and named when they fail.
worlds=$(mktemp -d /tmp/nodestrap-worlds.XXXXXX)
trap 'rm -rf "$go_out"; [ ! -d "$worlds" ] || echo "tests/run.sh: the tests'"'"' worlds are kept in $worlds" >&2' EXIT
if [ -n "$need_go" ]; then
  (qemu/build-torcx >"$go_out/torcx" && qemu/build-kubernetes >"$go_out/kubernetes" &&
    qemu/build-etcd >"$go_out/etcd" && qemu/build-butane >/dev/null) 2>"$go_out/log" &
  go_build=$!
  # The two Debian roots beside them: debootstrap waits on the network and dpkg more than on
  # the cores the Go builds and the release link want.
  (qemu/build-ddi-tools >"$go_out/ddi" && qemu/build-systemd-forky >"$go_out/forky") 2>"$go_out/debian-log" &
  debian_build=$!
fi
# Every integration test program, as `cargo test --test '*'` runs them (from the package root),
# but the ledger's beside the others: its herds spend most of their six minutes waiting on the
# join services and the API server (the cores were 80 % idle through it), so it runs as a
# process of its own from the start, its output printed whole once the others are done. Every
# program runs, whatever failed before it; the phase fails if any did.
integration_tests() {
  local progs name exe rc=0 beside start began
  progs=$(cargo test --locked --test '*' --no-run --message-format=json-render-diagnostics | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["target"]["name"], m["executable"])')
  beside=$(mktemp -d)
  local ledger
  ledger=$(sed -n 's/^ledger //p' <<<"$progs")
  [ -z "$ledger" ] || ("$ledger" >"$beside/out" 2>&1; echo $? >"$beside/rc"; echo $SECONDS >"$beside/end") &
  began=$SECONDS
  while read -r name exe; do
    [ "$name" != ledger ] || continue
    echo "     Running $name ($exe)" >&2
    start=$SECONDS
    "$exe" || { echo "tests/run.sh: $name failed" >&2; rc=1; }
    echo "tests/run.sh: $name took $((SECONDS - start)) s" >&2
  done <<<"$progs"
  wait
  if [ -n "$ledger" ]; then
    # A run that left no exit status (killed with its subshell) failed too.
    echo "     Ran ledger ($ledger), beside the others, in $(($(cat "$beside/end" 2>/dev/null || echo "$SECONDS") - began)) s:" >&2
    cat "$beside/out"
    [ "$(cat "$beside/rc" 2>/dev/null)" = 0 ] || { echo "tests/run.sh: ledger failed" >&2; rc=1; }
  fi
  rm -rf "$beside"
  return "$rc"
}
if want lint; then
  phase "format, lints, licences, layout"
  cargo fmt --check
  # clippy -D warnings, shellcheck, pyflakes, the minimum Rust (.ci/lint says what each covers).
  .ci/lint
  .ci/licenses --check
  # The import rule of README.md's Layout: families over floors, no cycles.
  .ci/check-layout
  # No function over 80 lines, no file over 700 outside tests (the listed exceptions only shrink).
  .ci/check-size
fi
if want unit; then
  phase "unit tests"
  cargo test --locked --lib
fi
if [ -n "$need_bins" ]; then
  # Both release binaries, static-pie, stripped and under 4 MiB (.ci/build-release checks them
  # and prints their sizes and each crate's cost).
  phase "release binaries"
  # First a later release of the same code, the next patch version (build.rs's
  # NODESTRAP_VERSION), that the self-update tests move a node's nodestrap to: built in the same
  # folder (only nodestrap itself recompiles) and copied aside; the build below makes the
  # release as it is again.
  version=$(awk -F'"' '/^version *=/{print $2; exit}' Cargo.toml)
  next=$(NODESTRAP_VERSION=${version%.*}.$((${version##*.} + 1)) .ci/build-release --amd64 2>"$go_out/next" |
    sed -n 's/^x86_64-unknown-linux-musl=//p') || { cat "$go_out/next" >&2; exit 1; }
  install -D -m 0755 "$next" target/next/nodestrap
  export NODESTRAP_NEXT_BIN=$PWD/target/next/nodestrap
  release=()
  [ -z "$short_loop" ] || release=(--amd64)
  builds=$(.ci/build-release "${release[@]}")
  x86=$(sed -n 's/^x86_64-unknown-linux-musl=//p' <<<"$builds")
  arm=$(sed -n 's/^aarch64-unknown-linux-musl=//p' <<<"$builds")
  # docs/: each command's options are its --help; links and citations resolve.
  .ci/check-docs "$x86"
  # (The Go builds, started above; their progress and durations.)
  phase "waiting for the Go builds and the Debian roots"
  wait "$go_build" || { cat "$go_out/log" >&2; echo "tests/run.sh: building torcx, Kubernetes or Butane failed" >&2; exit 1; }
  cat "$go_out/log" >&2
  wait "$debian_build" || { cat "$go_out/debian-log" >&2; echo "tests/run.sh: debootstrapping the DDI tools or Debian 14's systemd failed" >&2; exit 1; }
  cat "$go_out/debian-log" >&2
  NODESTRAP_TORCX=$(cat "$go_out/torcx")
  eval "$(cat "$go_out/kubernetes")"
  NODESTRAP_KUBE_BIN=$KUBE_BIN
  # The images a kubeadm control plane runs, made from that build and the etcd kubeadm pins
  # (qemu/build-etcd), and the sandbox image:
  # tests/activation/images.rs imports them into a real containerd and runs each.
  eval "$(cat "$go_out/etcd")"
  export NODESTRAP_ETCD_IMAGE=$ETCD_IMAGE_BIN
  built=$(KUBE_BIN=$KUBE_BIN ETCD_IMAGE_BIN=$ETCD_IMAGE_BIN qemu/build-images "$KUBE_VERSION")
  NODESTRAP_CONTROL_PLANE_IMAGES=$(sed -n 's/^CONTROL_PLANE_IMAGES=//p' <<<"$built")
  NODESTRAP_PAUSE_IMAGE=$(sed -n 's/^PAUSE_IMAGE=//p' <<<"$built")
  export NODESTRAP_CONTROL_PLANE_IMAGES NODESTRAP_PAUSE_IMAGE
  # Debian 13's systemd-repart, which makes the signed DDIs of tests/sysext/signed.rs, and its
  # containerd, the oracle of a config_path's hosts.toml folders (tests/sysext/oci.rs).
  NODESTRAP_DDI_TOOLS=$(cat "$go_out/ddi")
  # Debian 14's systemd (259 or later), whose systemd-sysext reads the policy from sysext.conf.
  NODESTRAP_SYSTEMD_FORKY=$(cat "$go_out/forky")
  export NODESTRAP_TORCX NODESTRAP_KUBE_BIN NODESTRAP_DDI_TOOLS NODESTRAP_SYSTEMD_FORKY
fi
# The integration tests against each release binary: the arm64 one under qemu-user
# (NODESTRAP_RUNNER), so its board fallback and syscalls are exercised, not only built.
# (sysext's tests are x86-64 only: their images are built for x86-64 and merged by this
# machine's systemd-sysext.)
if want integration; then
  phase "integration tests (amd64)"
  TMPDIR=$worlds NODESTRAP_BIN=$x86 integration_tests
fi
if want arm64; then
  phase "integration tests (arm64 under qemu-user)"
  TMPDIR=$worlds NODESTRAP_BIN=$arm NODESTRAP_RUNNER=${NODESTRAP_RUNNER_ARM64:-/usr/local/lib/nodestrap-ci/qemu-aarch64} \
    cargo test --locked --test bootstrap --test hook --test activate --test reprovision --test kubeconfig
fi
rm -rf "$worlds"
# A few seconds of every fuzz target from the committed corpus, one summary line each: here, or
# with the QEMU scenarios beside the last of them (below).
fuzz_secs=${NODESTRAP_FUZZ_SECONDS:-5}
if want fuzz && ! want qemu; then
  phase "fuzz targets"
  fuzz/run -t "$fuzz_secs"
fi
if want qemu; then
  # The Ignition configs through real ignition-validate, the in-cluster manifests' consistency,
  # the dracut module on both architectures, then QEMU scenarios against this binary (qemu/build
  # runs systemd-analyze verify on every unit).
  phase "Ignition configs, manifests, dracut module"
  ignition/check
  deploy/check
  dracut/check-arch "$x86" "$arm"
  # CI boots under TCG (a fresh runner has no usable KVM; nested KVM here fails or hangs). Every
  # scenario under TCG takes about 80 min, more than CI has, so CI boots one scenario per home
  # and payload: the torcx bootstrap on the real root (one reboot) and from the initramfs, the
  # in-place reprovision, activation (the real kubeadm init and join on two sysext nodes; its
  # failing twin, activate-init-fails, runs by name), and the sysext bootstrap from the initramfs:
  # signed (two boots: the trust chain) and from an OCI registry (Debian's docker-registry, TLS
  # and htpasswd; with the events of both runs and the boot check, which sysext-initrd, by name,
  # also shows for plain images from the web mirror that activate stages from); a stock node for
  # a year (flatcar-year: nodestrap by Ignition alone, then the patch stream); and Debian 14's systemd 262, whose
  # initramfs merges the real root's extensions (sysext-initrd-262, three boots).
  # `qemu/run` without names boots them all.
  phase "QEMU scenarios"
  export NODESTRAP_BIN=$x86 NODESTRAP_QEMU_ACCEL=${NODESTRAP_QEMU_ACCEL:-tcg}
  end=$((SECONDS + ${NODESTRAP_QEMU_DEADLINE:-3600}))
  rc=0
  # Each call's results (with each failed scenario's problems) are summed up again at the end:
  # a log cut to its last lines still says which scenario failed and why.
  results=$(mktemp -d)
  NODESTRAP_QEMU_DEADLINE=$((end - SECONDS)) NODESTRAP_QEMU_RESULTS=$results/1.json \
    qemu/run firstboot initrd reprovision-rhcos activate sysext-signed sysext-oci flatcar-year || rc=1
  # sysext-initrd-262 runs its vCPUs on one host thread (qemu/harness/vm.py): the fuzz targets
  # build and run on the other core meanwhile, at the lowest priority (docs/build.md, "Tests and
  # fuzzing": beside anything that wants both cores, work at nice 19 still cost it time).
  fuzzing=
  if want fuzz; then
    phase "fuzz targets (beside sysext-initrd-262, nice 19)"
    fuzz_log=$(mktemp)
    (nice -n 19 fuzz/run -t "$fuzz_secs" >"$fuzz_log" 2>&1; echo $? >"$fuzz_log.rc") &
    fuzzing=$!
  fi
  phase "QEMU: sysext-initrd-262"
  NODESTRAP_QEMU_DEADLINE=$((end - SECONDS)) NODESTRAP_QEMU_RESULTS=$results/2.json \
    qemu/run sysext-initrd-262 || rc=1
  if [ -n "$fuzzing" ]; then
    wait "$fuzzing" || true
    phase "fuzz targets: done"
    # The build's output only if the run failed; its summary lines (and cargo's) always.
    if [ "$(cat "$fuzz_log.rc" 2>/dev/null)" = 0 ]; then
      grep -E '^fuzz |Finished' "$fuzz_log" >&2 || true
    else
      cat "$fuzz_log" >&2
      echo "tests/run.sh: fuzz targets failed" >&2
      rc=1
    fi
    rm -f "$fuzz_log" "$fuzz_log.rc"
  fi
  phase "QEMU scenarios: summary"
  qemu_summary "$results"/1.json "$results"/2.json >&2
  rm -rf "$results"
  [ "$rc" = 0 ] || { echo "tests/run.sh: QEMU scenarios or fuzz targets failed" >&2; exit 1; }
fi
phase "done"
