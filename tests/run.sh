#!/usr/bin/env bash
# The test command (README, CI): format check, the static release binary (static, size-capped),
# unit tests, integration tests against that release binary, the Ignition configs, and the QEMU
# scenarios.
set -euo pipefail
cd "$(dirname "$0")/.."
limit=$((4 * 1024 * 1024))
target=x86_64-unknown-linux-musl

cargo fmt --check
.ci/licenses --check
cargo build --release --locked --target "$target"
bin=target/$target/release/nodestrap
if ! file "$bin" | grep -q 'static'; then
  echo "FAIL: $bin is not statically linked: $(file "$bin")" >&2; exit 1
fi
if ldd "$bin" 2>&1 | grep -q '=>'; then
  echo "FAIL: $bin has dynamic dependencies" >&2; exit 1
fi
size=$(stat -c %s "$bin")
printf 'binary %s: %d bytes (%.2f MiB), limit %d bytes\n' "$bin" "$size" "$(awk -v s="$size" 'BEGIN{print s/1048576}')" "$limit"
if [ "$size" -gt "$limit" ]; then
  echo "FAIL: binary is larger than 4 MiB" >&2; exit 1
fi
NODESTRAP_BIN="$PWD/$bin" cargo test --locked
# The Ignition configs through real ignition-validate, the in-cluster manifests' consistency,
# then every QEMU scenario against this
# binary (qemu/build runs systemd-analyze verify on every unit).
ignition/check
deploy/check
# CI boots under TCG (as a fresh machine without usable KVM would), within a bound that leaves
# room in its 90 minutes.
NODESTRAP_BIN="$PWD/$bin" NODESTRAP_QEMU_ACCEL=${NODESTRAP_QEMU_ACCEL:-tcg} \
  NODESTRAP_QEMU_DEADLINE=${NODESTRAP_QEMU_DEADLINE:-2700} qemu/run
