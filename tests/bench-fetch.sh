#!/usr/bin/env bash
# Benchmark (not a test): nodestrap's fetch-hash-write path against `curl | tee | sha512sum`,
# side by side, over loopback TLS (nginx) with a CA and an OpenPGP key made for the run.
#   usage: tests/bench-fetch.sh [SIZE_MIB] [ROUNDS]     (defaults 512 and 5)
# Rounds alternate between the two so machine noise hits both alike. Prints the best and median
# throughput and the peak RSS of each.
set -euo pipefail
cd "$(dirname "$0")/.."
size_mib=${1:-512}
rounds=${2:-5}
. tests/lib.sh
ns_begin bench
cd "$work"
os=3033.2.0
head -c "$((size_mib << 20))" /dev/urandom > payload
hash=$(sha512sum payload | cut -d' ' -f1)
ns_publish "$os" payload 20.10
mapfile -t args < <(ns_args "$work/root")

# Each run writes "seconds peak-RSS-KiB" to result.txt; a failure shows its log and stops.
run_nodestrap() {
  ns_node root "$os" v1.20.4_coreos.0 1.20 20.10
  if ! DBUS_SYSTEM_BUS_ADDRESS=unix:path=/nonexistent /usr/bin/time -f '%e %M' -o result.txt \
    "$bin" "${args[@]}" --reboot=never --verbose=info > /dev/null 2> log.txt; then
    echo "nodestrap failed:" >&2; cat log.txt >&2; exit 1
  fi
  cmp -s "root/var/lib/torcx/store/$os/docker:20.10.torcx.tgz" payload || { echo "staged file differs" >&2; exit 1; }
}

# The pipeline's peak RSS is the largest of its three processes' (curl's, in practice).
run_curl() {
  rm -f out.tgz
  local start end got
  start=$(date +%s.%N)
  got=$(/usr/bin/time -f '%M' -o rss.curl curl -sS --cacert ca.pem "$ns_url/pkgs/docker-20.10.torcx.tgz" \
    | /usr/bin/time -f '%M' -o rss.tee tee out.tgz | /usr/bin/time -f '%M' -o rss.sha sha512sum | cut -d' ' -f1)
  end=$(date +%s.%N)
  [ "$got" = "$hash" ] || { echo "curl: hash differs" >&2; exit 1; }
  echo "$(awk -v a="$start" -v b="$end" 'BEGIN{printf "%.3f", b-a}') $(cat rss.curl rss.tee rss.sha | sort -n | tail -1)" > result.txt
}

ns=(); cs=(); nrss=0; crss=0
for _ in $(seq "$rounds"); do
  run_nodestrap; read -r t m < result.txt; ns+=("$t"); [ "$m" -gt "$nrss" ] && nrss=$m
  run_curl; read -r t m < result.txt; cs+=("$t"); [ "$m" -gt "$crss" ] && crss=$m
done

stats() { printf '%s\n' "$@" | sort -n | awk -v mib="$size_mib" '{a[NR]=$1} END {printf "%.0f %.0f\n", mib/a[1], mib/a[int((NR+1)/2)]}'; }
read -r nbest nmed < <(stats "${ns[@]}")
read -r cbest cmed < <(stats "${cs[@]}")
echo
echo "fetch + sha512 + write of a ${size_mib} MiB payload over loopback TLS, $rounds rounds each, $(nproc) cores"
printf '%-40s %11s %13s %13s\n' tool "best MiB/s" "median MiB/s" "peak RSS KiB"
printf '%-40s %11s %13s %13s\n' "nodestrap bootstrap (verify, fsync)" "$nbest" "$nmed" "$nrss"
printf '%-40s %11s %13s %13s\n' "curl | tee | sha512sum (no fsync)" "$cbest" "$cmed" "$crss"
awk -v n="$nmed" -v c="$cmed" -v r="$nrss" 'BEGIN{printf "median throughput ratio nodestrap/curl: %.2fx (goal >= 0.90x); nodestrap peak RSS %.1f MiB (goal <= 16 MiB)\n", n/c, r/1024}'
