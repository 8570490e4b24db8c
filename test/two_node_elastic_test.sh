#!/usr/bin/env bash
# Elastic jobs across two "nodes" (network namespaces): muster-run with
# --restart-policy rank on each, node 0's embedded musterd serving the job's
# store. Rank 3 (on node 1) kills itself with SIGKILL after step 10; node 1's
# launcher starts only it again, the replacement takes the rank over through
# the job's store, every rank joins epoch 1 (node 0's ranks learn of the
# failure and of the replacement through the store), and the job completes
# with the right result on both nodes, the survivors' processes unchanged.
# (node 1's musterd killed instead: two_node_elastic_daemon_death_test.sh.)
set -uo pipefail
source "$(dirname "$0")/netns_lib.sh"
MUSTER_RUN=$(find_bin tools/muster-run)
RANK=$(find_bin test/muster-elastic-rank)
PORT=$(( 20000 + $$ % 20000 ))
STEPS=30

launch() {  # node namespace -> $WORK/node<node>.out
  local node=$1 ns=$2
  ip netns exec "$ns" env MUSTER_SOCKET="$WORK/none.sock" "$MUSTER_RUN" --nnodes 2 \
    --node-rank "$node" --nproc-per-node 2 --master-addr "$IPA" --master-port "$PORT" \
    --job-id elastic2 --restart-policy rank --max-restarts 1 --stop-grace-seconds 2 -- \
    "$RANK" --steps "$STEPS" --kill-rank 3 --kill-step 10 --step-ms 5 \
    >"$WORK/node$node.out" 2>&1 &
}

launch 0 "$NA"
pa=$!
launch 1 "$NB"
pb=$!
pids+=($pa $pb)
wait $pa; ra=$?
wait $pb; rb=$?
cat "$WORK/node0.out" "$WORK/node1.out"
[[ $ra -eq 0 && $rb -eq 0 ]] || fail "exit codes $ra $rb (want 0 0)"
expected=$(( 10 * STEPS * (STEPS + 1) / 2 ))  # sum of step * (1+2+3+4)
for r in 0 1 2 3; do
  out="$WORK/node$(( r / 2 )).out"
  grep -q "FINAL rank=$r total=$expected steps=$STEPS epoch=1 " "$out" \
    || fail "rank $r: no FINAL total=$expected in epoch 1"
  starts=$(grep -c "START rank=$r " "$out")
  want=1; [[ $r -eq 3 ]] && want=2
  [[ $starts -eq $want ]] || fail "rank $r started $starts times (want $want)"
done
grep -q "rank 3 (pid [0-9]*) was killed by signal 9 (Killed); restarting it (restart 1 of 1)" \
  "$WORK/node1.out" || fail "node 1 did not restart rank 3"
grep -q "RECONFIGURED rank=0 epoch=1" "$WORK/node0.out" || fail "node 0's rank 0 did not reconfigure"
grep -q "START rank=3 pid=[0-9]* epoch=1 restarts=1" "$WORK/node1.out" \
  || fail "the replacement did not join epoch 1"
echo "PASS: two-node elastic job (rank 3 on node 1 replaced, every rank in epoch 1)"

