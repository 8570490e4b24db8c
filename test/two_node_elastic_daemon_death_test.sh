#!/usr/bin/env bash
# An elastic job on two "nodes" (network namespaces) whose node 1 loses its
# embedded musterd (SIGKILL) mid-job: node 1's launcher records its ranks as
# failed in the job's store, starts a new musterd and the ranks again; node
# 0's ranks reconfigure with them. (Two bugs made it hang under load: a
# failure event reached a replacement before its `registered` reply, and
# node 0 stopped the job's store while node 1's launcher still needed it.)
set -uo pipefail
source "$(dirname "$0")/netns_lib.sh"
MUSTER_RUN=$(find_bin tools/muster-run)
RANK=$(find_bin test/muster-elastic-rank)
PORT=$(( 20000 + $$ % 20000 ))

# Node 1's musterd dies (SIGKILL) mid-job: node 1's launcher records its
# ranks as failed in the job's store (their daemon cannot), starts a new
# musterd and the ranks again; node 0's ranks reconfigure with them.
launch_daemon_death() {  # node namespace -> $WORK/dd-node<node>.out
  local node=$1 ns=$2
  ip netns exec "$ns" env MUSTER_SOCKET="$WORK/none.sock" timeout 150 "$MUSTER_RUN" --nnodes 2 \
    --node-rank "$node" --nproc-per-node 2 --master-addr "$IPA" --master-port "$PORT" \
    --job-id elastic3 --restart-policy rank --max-restarts 2 --stop-grace-seconds 2 -- \
    "$RANK" --steps 60 --step-ms 20 >"$WORK/dd-node$node.out" 2>&1 &
}
launch_daemon_death 0 "$NA"
pa=$!
launch_daemon_death 1 "$NB"
pb=$!
pids+=($pa $pb)
# Only once every rank is past Init (the world formed) and stepping: a
# musterd killed during the world's formation is another story.
for _ in $(seq 1 1200); do
  n=$(cat "$WORK/dd-node0.out" "$WORK/dd-node1.out" 2>/dev/null | grep -c "START rank=")
  [[ $n -ge 4 ]] && break
  sleep 0.05
done
[[ $n -ge 4 ]] || fail "daemon death: the ranks did not all start"
sleep 0.4
socket=$(sed -n 's/.*started an embedded musterd for this job (socket \([^)]*\)).*/\1/p' \
  "$WORK/dd-node1.out" | head -1)
[[ -n "$socket" ]] || fail "node 1's embedded musterd socket not found"
dpid=$(pgrep -f -- "--socket=$socket" | head -1)
[[ -n "$dpid" ]] || fail "node 1's embedded musterd not found"
kill -9 "$dpid"
wait $pa; ra=$?
wait $pb; rb=$?
cat "$WORK/dd-node0.out" "$WORK/dd-node1.out"
[[ $ra -eq 0 && $rb -eq 0 ]] || fail "daemon death: exit codes $ra $rb (want 0 0)"
expected=$(( 10 * 60 * 61 / 2 ))
for r in 0 1 2 3; do
  out="$WORK/dd-node$(( r / 2 )).out"
  grep -q "FINAL rank=$r total=$expected steps=60 epoch=1 " "$out" \
    || fail "daemon death: rank $r has no FINAL total=$expected in epoch 1"
  starts=$(grep -c "START rank=$r " "$out")
  want=1; (( r >= 2 )) && want=2
  [[ $starts -eq $want ]] || fail "daemon death: rank $r started $starts times (want $want)"
done
grep -q "the embedded musterd was killed by signal 9.*restarting musterd, then the ranks" \
  "$WORK/dd-node1.out" || fail "node 1 did not say it restarts its musterd"
echo "PASS: two-node elastic job (node 1's musterd killed: its ranks restarted with a new one)"
