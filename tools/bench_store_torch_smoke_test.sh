#!/bin/bash
# Smoke test of `muster-bench store --client torch` (tools/bench_store_torch.py):
# with 2 PyTorch client processes and short windows, each torch found
# (Debian's 1.13 in /usr/bin/python3, 2.x in /opt/muster/torch-venv) drives
# musterd, the floor server (tools/store_floor_server.cc) and torch's own
# master, and every server answers with a positive rate and CPU per op.
# Prints "MUSTER_TEST_SKIPPED: ..." and exits 0 when no python imports torch.
set -u

if [[ -n "${TEST_SRCDIR:-}" && -d "${TEST_SRCDIR}/muster" ]]; then
  ROOT="${TEST_SRCDIR}/muster"
else
  ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/bazel-bin"
fi
MUSTERD="$ROOT/daemon/musterd"
FLOOR="$ROOT/tools/store-floor-server"
SCRIPT="$ROOT/tools/bench_store_torch.py"
[[ -e "$SCRIPT" ]] || SCRIPT="$(dirname "${BASH_SOURCE[0]}")/bench_store_torch.py"
for f in "$MUSTERD" "$FLOOR" "$SCRIPT"; do
  if [[ ! -e "$f" ]]; then
    echo "FAIL: missing $f"
    exit 1
  fi
done

ran=0
for py in /usr/bin/python3 /opt/muster/torch-venv/bin/python; do
  if ! "$py" -c 'import torch.distributed as d; assert d.is_available()' >/dev/null 2>&1; then
    continue
  fi
  ran=$((ran + 1))
  errfile="$(mktemp)"
  out="$(/usr/bin/python3 "$SCRIPT" --musterd "$MUSTERD" --floor "$FLOOR" --python "$py" \
    --clients 2 --duration 0.3 --repeats 1 --json 2>"$errfile")"
  rc=$?
  err="$(cat "$errfile")"
  rm -f "$errfile"
  if [[ $rc -ne 0 ]]; then
    echo "FAIL: $py: bench_store_torch.py exited $rc:"
    echo "$out"
    echo "$err"
    exit 1
  fi
  if ! echo "$out" | /usr/bin/python3 -c '
import json, sys
r = json.load(sys.stdin)["rows"][0]
for name in ("musterd", "floor", "torch"):
    assert r[name]["ops_per_s"] > 0 and r[name]["server_cpu_us_per_op"] >= 0, name
assert r["floor_cpu_per_op_ratio"] > 0 and r["cpu_per_op_ratio"] > 0
print("torch clients, 2 processes: musterd %.0f, floor %.0f, torch %.0f op/s" % (
    r["musterd"]["ops_per_s"], r["floor"]["ops_per_s"], r["torch"]["ops_per_s"]))
'; then
    echo "FAIL: $py: unexpected output:"
    echo "$out"
    exit 1
  fi
done
if [[ $ran -eq 0 ]]; then
  echo "MUSTER_TEST_SKIPPED: no python with torch.distributed"
  exit 0
fi
echo "PASS"
