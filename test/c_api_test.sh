#!/usr/bin/env bash
# The C API's test program: two ranks of c_api_rank (plain C over
# libmuster.so) under muster-run with an embedded musterd. Each must print
# "RANK r OK"; any failed check prints what it expected and got.
set -uo pipefail

if [[ -n "${TEST_SRCDIR:-}" && -d "${TEST_SRCDIR}/muster" ]]; then
  ROOT="${TEST_SRCDIR}/muster"
else
  ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/bazel-bin"
fi
RUN="$ROOT/tools/muster-run"
RANK="$ROOT/test/c_api_rank"
for f in "$RUN" "$RANK" "$ROOT/daemon/musterd" "$ROOT/client/libmuster.so"; do
  [[ -e "$f" ]] || { echo "c_api_test: FAIL: missing $f" >&2; exit 1; }
done

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Nobody answers at this socket: muster-run starts an embedded musterd.
export MUSTER_SOCKET="$tmp/nobody.sock"
timeout 120 "$RUN" --nproc-per-node 2 --musterd "$ROOT/daemon/musterd" -- "$RANK" >"$tmp/out" 2>&1
rc=$?
cat "$tmp/out"
if [[ $rc -ne 0 ]]; then
  echo "c_api_test: FAIL: muster-run exited $rc" >&2
  exit 1
fi
for r in 0 1; do
  if ! grep -q "RANK $r OK" "$tmp/out"; then
    echo "c_api_test: FAIL: rank $r did not print RANK $r OK" >&2
    exit 1
  fi
done
echo "c_api_test: both ranks passed"
