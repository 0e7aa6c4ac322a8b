#!/usr/bin/env bash
# Demonstration (README's first command until the QEMU harness lands): a Container Linux-like
# node root bootstraps itself against a local signed release server, first as in the initramfs
# (torcx has not run yet: no reboot needed), then as on a first boot where torcx already applied
# the vendor runtime (a reboot is needed and the docker cleanup unit is installed). Prints a
# timeline of each run and the files it left.
set -euo pipefail
cd "$(dirname "$0")/.."
. tests/lib.sh
ns_begin demo
os=3033.2.0

# A torcx image shaped like the real ones: the runtime's binaries plus /.torcx/manifest.json.
img=$work/img
mkdir -p "$img/.torcx" "$img/bin"
printf '{"kind":"image-manifest-v0","value":{"bin":["/bin/docker"],"units":[]}}\n' > "$img/.torcx/manifest.json"
printf '#!/bin/sh\necho "Docker version 20.10.24 (nodestrap demo)"\n' > "$img/bin/docker"
chmod +x "$img/bin/docker"
tar -C "$img" -czf "$work/docker-20.10.torcx.tgz" .
ns_publish "$os" "$work/docker-20.10.torcx.tgz" 20.10

timeline() {
  local start=$1
  while IFS= read -r line; do
    printf '%6.2fs  %s\n' "$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN{print b-a}')" "$line"
  done
}

show() {
  local root=$1
  echo "--- files under the node root"
  (cd "$root" && find . \( -type f -o -type l \) | sort | sed 's/^\.\//    /')
  echo "--- $root/etc/kubernetes/kubelet.env"
  sed 's/^/    /' "$root/etc/kubernetes/kubelet.env"
  echo "--- $root/etc/torcx/profiles/tectonic.json"
  sed 's/^/    /' "$root/etc/torcx/profiles/tectonic.json"
}

for scenario in initrd firstboot; do
  root=$work/$scenario-root
  ns_node "$root" "$os" v1.20.4_coreos.0 1.20 20.10
  if [ "$scenario" = firstboot ]; then
    # torcx's generator already ran in this boot and applied the vendor runtime.
    mkdir -p "$root/run/torcx"
    printf '{"kind":"profile-manifest-v0","value":{"images":[{"name":"docker","reference":"com.coreos.cl"}]}}\n' > "$root/run/torcx/profile.json"
  fi
  mapfile -t args < <(ns_args "$root")
  echo
  echo "=== $scenario: nodestrap ${args[*]} --reboot=never"
  start=$(date +%s.%N)
  DBUS_SYSTEM_BUS_ADDRESS=unix:path=/nonexistent "$bin" "${args[@]}" --reboot=never 2>&1 | timeline "$start"
  show "$root"
done
echo
echo "demo: both node roots bootstrapped; the first needs no reboot, the second asks for one."
