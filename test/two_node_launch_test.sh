#!/usr/bin/env bash
# muster-run on two "nodes" (network namespaces), the same command on each
# with the same master: node 0's embedded musterd serves the job's store.
# First a job that succeeds across both nodes; then one where a rank on
# node 1 fails, which must stop node 0's ranks too, with both launchers
# naming the failed rank; last, node 0 waits for a node whose ranks finish
# later before it stops the store.
set -uo pipefail
source "$(dirname "$0")/netns_lib.sh"
MUSTER_RUN=$(find_bin tools/muster-run)
RANK=$(find_bin test/muster-test-rank)
PORT=$(( 20000 + $$ % 20000 ))

launch() {  # node namespace job script... -> $WORK/<job>-node<node>.out
  local node=$1 ns=$2 job=$3
  shift 3
  ip netns exec "$ns" env MUSTER_SOCKET="$WORK/none.sock" "$MUSTER_RUN" --nnodes 2 \
    --node-rank "$node" --nproc-per-node 2 --master-addr "$IPA" --master-port "$PORT" \
    --job-id "$job" --stop-grace-seconds 2 -- "$@" >"$WORK/$job-node$node.out" 2>&1 &
}

launch 0 "$NA" ok "$RANK" "init;subgroups 2;barrier world"
pa=$!
launch 1 "$NB" ok "$RANK" "init;subgroups 2;barrier world"
pb=$!
pids+=($pa $pb)
wait $pa; ra=$?
wait $pb; rb=$?
[[ $ra -eq 0 && $rb -eq 0 ]] || fail "ok job: exit codes $ra $rb"
for r in 0 1 2 3; do
  node=$(( r / 2 ))
  grep -q "\[rank $r\] rank $r: init ok name=world rank=$r size=4" "$WORK/ok-node$node.out" \
    || fail "rank $r did not join"
  grep -q "\[rank $r\] rank $r: barrier world ok" "$WORK/ok-node$node.out" || fail "rank $r barrier"
done
grep -q "started an embedded musterd" "$WORK/ok-node1.out" || fail "node 1 daemon"

PORT=$(( PORT + 1 ))
launch 0 "$NA" bad "$RANK" "init;barrier world 30000"
pa=$!
launch 1 "$NB" bad /bin/sh -c 'if [ "$RANK" = 3 ]; then sleep 1; echo dying; exit 4; fi; exec '"$RANK"' "init;barrier world 30000"'
pb=$!
pids+=($pa $pb)
start=$(date +%s)
wait $pa; ra=$?
wait $pb; rb=$?
took=$(( $(date +%s) - start ))
[[ $ra -eq 1 && $rb -eq 1 ]] || fail "bad job: exit codes $ra $rb (want 1 1)"
grep -q "job bad failed: rank 3 (pid [0-9]*) exited with status 4; its last output:" \
  "$WORK/bad-node1.out" || fail "node 1 summary"
grep -Eq "job bad failed: the job failed (elsewhere|on another node) \(node 1: rank 3 \(pid [0-9]+\) exited with status 4\)" \
  "$WORK/bad-node0.out" || fail "node 0 summary"
(( took < 20 )) || fail "the failing job took $took s to stop"

# Node 1's ranks finish 3 s after node 0's: node 0 keeps the job's store
# up until node 1's launcher is done with it (the exit barrier), so node 1
# still learns the job's outcome at once and exits 0.
PORT=$(( PORT + 1 ))
launch 0 "$NA" late "$RANK" "init;barrier world"
pa=$!
launch 1 "$NB" late /bin/sh -c "$RANK 'init;barrier world' && sleep 3"
pb=$!
pids+=($pa $pb)
start=$(date +%s)
wait $pa; ra=$?
wait $pb; rb=$?
late_took=$(( $(date +%s) - start ))
[[ $ra -eq 0 && $rb -eq 0 ]] || fail "late job: exit codes $ra $rb (want 0 0)"
grep -q "waiting up to 5m for 1 other node(s) to finish before stopping the job's store" \
  "$WORK/late-node0.out" || fail "node 0 did not wait for node 1"
(( late_took < 20 )) || fail "the late node's job took $late_took s"
echo "PASS: two-node launch (ok job, a failure on node 1 stopping node 0 in ${took}s," \
  "node 0 waiting for a late node 1: ${late_took}s)"
