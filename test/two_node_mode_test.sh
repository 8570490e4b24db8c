#!/usr/bin/env bash
# Two "nodes" in network namespaces, two ranks each, where node A's ranks
# run spanning groups flat over Gloo (MUSTER_HIERARCHICAL=0, as when a
# node's musterd cannot create a group's segment) and node B's run them
# hierarchically. The members agree on the mode through the job's store, so
# every rank fails the world group at once, naming the mismatch, instead of
# joining mismatched meshes and waiting for the group timeout (30 s here).
# Needs root (ip netns); without it the test is reported as skipped.
set -uo pipefail

source "$(dirname "$0")/netns_lib.sh"
MUSTERD=$(find_bin daemon/musterd)
RANK=$(find_bin test/muster-test-rank)

start_daemons "$MUSTERD"

start_rank() {  # rank namespace socket hierarchical
  ip netns exec "$2" env RANK="$1" LOCAL_RANK=$(( $1 % 2 )) WORLD_SIZE=4 LOCAL_WORLD_SIZE=2 \
    MASTER_ADDR="$IPA" MASTER_PORT="$PORT" MUSTER_SOCKET="$3" MUSTER_JOB_ID=two-node-mode \
    MUSTER_HIERARCHICAL="$4" MUSTER_TEST_INIT_TIMEOUT_MS=30000 "$RANK" "init;cbarrier world" \
    >"$WORK/rank$1.out" 2>&1 &
  pids+=($!)
  eval "rank_pid_$1=$!"
}
start=$(date +%s%N)
start_rank 0 "$NA" "$WORK/a.sock" 0
start_rank 1 "$NA" "$WORK/a.sock" 0
start_rank 2 "$NB" "$WORK/b.sock" 1
start_rank 3 "$NB" "$WORK/b.sock" 1
for r in 0 1 2 3; do wait "$(eval echo \$rank_pid_$r)"; done
ms=$(( ($(date +%s%N) - start) / 1000000 ))
for r in 0 1 2 3; do
  line=$(grep "rank $r: cbarrier world" "$WORK/rank$r.out")
  [[ $line == *"error FAILED_PRECONDITION: backend 'gloo': group 'world': group rank 0 (rank 0) runs flat"*"group rank 2 (rank 2) runs hierarchical"*"MUSTER_HIERARCHICAL differs"* ]] \
    || fail "rank $r did not fail naming the mode mismatch: $line"
done
(( ms < 10000 )) || fail "the ranks took $ms ms to fail (group timeout 30 s)"
echo "PASS: mixed flat/hierarchical modes fail every rank in $ms ms, naming the mismatch"
