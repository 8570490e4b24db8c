#!/usr/bin/env bash
# Cross-node all_reduce, flat Gloo vs hierarchical: two "nodes" in network
# namespaces (test/netns_lib.sh: a veth pair, no bandwidth limit), one
# musterd each, 2 ranks per node running `muster-bench collectives`. The
# flat run sets MUSTER_HIERARCHICAL=0 on every rank (each rank in one Gloo
# mesh of all four); the hierarchical run uses the default (shared memory
# within a node, Gloo between the two leaders). Needs root.
#
#   bazel build -c opt //daemon:musterd //tools:muster-bench
#   tools/bench_two_node.sh [--bytes 4,4K,256K,4M] [--iters 500,500,100,20]
set -uo pipefail
BYTES=4,4K,256K,4M
ITERS=500,500,100,20
while [[ $# -gt 0 ]]; do
  case $1 in
    --bytes) BYTES=$2; shift 2 ;;
    --iters) ITERS=$2; shift 2 ;;
    *) echo "usage: $0 [--bytes LIST] [--iters LIST]"; exit 2 ;;
  esac
done
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BIN:-$ROOT/bazel-out/k8-opt/bin}
MUSTERD=$BIN/daemon/musterd
BENCH=$BIN/tools/muster-bench
[[ -x $MUSTERD && -x $BENCH ]] || { echo "build first: bazel build -c opt //daemon:musterd //tools:muster-bench"; exit 2; }
source "$ROOT/test/netns_lib.sh"

start_daemons "$MUSTERD"

run() {  # mode (flat|hier)
  local hier=1 ranks=()
  [[ $1 == flat ]] && hier=0
  for r in 0 1 2 3; do
    local ns=$NA sock=$WORK/a.sock
    (( r >= 2 )) && { ns=$NB; sock=$WORK/b.sock; }
    ip netns exec "$ns" env RANK=$r LOCAL_RANK=$((r % 2)) WORLD_SIZE=4 LOCAL_WORLD_SIZE=2 \
      MASTER_ADDR="$IPA" MASTER_PORT="$PORT" MUSTER_SOCKET="$sock" MUSTER_JOB_ID="bench-$1" \
      MUSTER_HIERARCHICAL=$hier "$BENCH" collectives --op all_reduce --bytes "$BYTES" \
      --iters "$ITERS" --verify >"$WORK/$1.$r.out" 2>&1 &
    ranks+=($!)
  done
  for p in "${ranks[@]}"; do wait "$p" || fail "a $1 rank failed"; done
  echo "== $1 (MUSTER_HIERARCHICAL=$hier), 2 nodes x 2 ranks"
  cat "$WORK/$1.0.out"
}
run flat
run hier
