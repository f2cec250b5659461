#!/usr/bin/env bash
# make demo: simulate a DGX H100 node and show what the driver discovers and
# would publish. (The in-process Kubernetes cluster demo replaces this.)
set -euo pipefail
BIN=${BIN:-bin}
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT

echo "== rdmactl simulate --preset dgx-h100 --root $root"
"$BIN/rdmactl" simulate --preset dgx-h100 --root "$root"
echo
echo "== rdmactl discover"
"$BIN/rdmactl" discover --sysfs-root "$root/sys" --dev-root "$root/dev"
echo
echo "== the ResourceSlice the driver would publish (first device)"
"$BIN/rdmactl" discover --sysfs-root "$root/sys" --dev-root "$root/dev" --node-name dgx01 -o yaml \
  | awk '/^  devices:/{p=1} p&&/^  - /{n++} n==2{exit} {print}'
