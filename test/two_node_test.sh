#!/usr/bin/env bash
# Two "nodes" in two network namespaces joined by a veth pair, each with its
# own musterd; four ranks (two per node) join one job whose store is node
# A's musterd. Checks world init and groups across both daemons, every
# collective and point to point across the nodes (hierarchical: shared memory
# within a node, Gloo between the nodes' leaders; results checked in the
# ranks), that node B reaches the store only through its daemon (fan-in),
# and that a rank killed on node B fails node A's pending barrier and the
# collectives waiting for it (on node A over Gloo, on node B in shared
# memory) within 2 s, naming the rank. Each daemon's flight recorder shows
# its own members of the spanning world group and dumps them when it breaks.
# Needs root (ip netns); without it the test is reported as skipped.
set -uo pipefail

source "$(dirname "$0")/netns_lib.sh"
MUSTERD=$(find_bin daemon/musterd)
MUSTERCTL=$(find_bin tools/musterctl)
RANK=$(find_bin test/muster-test-rank)

# Node A: the job's store. Node B: no store of its own (--store=false).
start_daemons "$MUSTERD"

start_rank() {  # rank namespace socket script
  ip netns exec "$2" env RANK="$1" LOCAL_RANK=$(( $1 % 2 )) WORLD_SIZE=4 LOCAL_WORLD_SIZE=2 MASTER_ADDR="$IPA" \
    MASTER_PORT="$PORT" MUSTER_SOCKET="$3" MUSTER_JOB_ID=two-node "$RANK" "$4" \
    >"$WORK/rank$1.out" 2>&1 &
  pids+=($!)
  eval "rank_pid_$1=$!"
}
SCRIPT="init;subgroups 2;group cross 1,2;barrier world;barrier world;allreduce world 100000;bcast world 1000 3;gatherobj world;a2a world;cbarrier world;xops world;ring world 1048576;tagorder world;anysrc world"
start_rank 0 "$NA" "$WORK/a.sock" "$SCRIPT;barrier world 20000;sleep 1500"
start_rank 1 "$NA" "$WORK/a.sock" "$SCRIPT;barrier cross 20000;xops cross;allreduce cross 1000;barrier world 20000;sleep 1000"
start_rank 2 "$NB" "$WORK/b.sock" "$SCRIPT;barrier cross 20000;xops cross;sleep 2500;crash"
start_rank 3 "$NB" "$WORK/b.sock" "$SCRIPT;allreduce world 1000"

# While the job runs: both daemons show the cross-node groups; node A's
# store sees connections from node B's daemon only, not from its ranks.
sleep 1.5
groups_b=$(ip netns exec "$NB" "$MUSTERCTL" --socket "$WORK/b.sock" groups) || fail "musterctl B"
echo "$groups_b" | grep -Eq "two-node +cross +cpu:gloo +ready +2 +1,2" || fail "B groups: $groups_b"
groups_a=$(ip netns exec "$NA" "$MUSTERCTL" --socket "$WORK/a.sock" groups) || fail "musterctl A"
echo "$groups_a" | grep -Eq "two-node +group_2 +cpu:gloo +ready +2 +2,3" || fail "A groups: $groups_a"
ranks_b=$(ip netns exec "$NB" "$MUSTERCTL" --socket "$WORK/b.sock" ranks) || fail "ranks B"
echo "$ranks_b" | grep -Eq "two-node +0 +3 +4 +1 " || fail "B ranks: $ranks_b"
peers=$(ip netns exec "$NA" ss -Htn state established "( sport = :$PORT )" | awk '{print $4}' \
  | grep -c "^$IPB:" || true)
(( peers >= 1 && peers <= 4 )) || fail "node B holds $peers store connections to node A (want 1-4)"

# The flight recorder of a spanning group: each daemon shows its own
# members' records (from their node's segment), aligned by sequence number.
for try in $(seq 1 100); do
  trace_b=$(ip netns exec "$NB" "$MUSTERCTL" --socket "$WORK/b.sock" trace two-node world --json) \
    || fail "trace B"
  n=$(echo "$trace_b" | grep -c '"seq":1,"op":"all_reduce","dtype":"int32","device":"cpu","count":100000' || true)
  (( n == 2 )) && break
  sleep 0.1
done
(( n == 2 )) || fail "B trace lacks ranks 2 and 3's all_reduce #1: $trace_b"
echo "$trace_b" | grep -q '"rank":0,' && fail "B trace shows node A's rank 0: $trace_b"
trace_a=$(ip netns exec "$NA" "$MUSTERCTL" --socket "$WORK/a.sock" trace two-node world --json) \
  || fail "trace A"
echo "$trace_a" | grep -q '"rank":0,"group_rank":0,.*"seq":1,"op":"all_reduce"' || fail "A trace: $trace_a"

for r in 0 1 2 3; do wait "$(eval echo \$rank_pid_$r)"; done
# Rank 2's death broke the world group on both nodes: each daemon dumped
# its members' records.
for ns_sock in "$NA $WORK/a.sock" "$NB $WORK/b.sock"; do
  set -- $ns_sock
  jobs=$(ip netns exec "$1" "$MUSTERCTL" --socket "$2" jobs) || fail "jobs on $1"
  echo "$jobs" | grep -q "job two-node dump: .*trace-two-node-world-e0-" || fail "no dump on $1: $jobs"
done
for r in 0 1 2 3; do
  grep -q "rank $r: init ok name=world rank=$r size=4" "$WORK/rank$r.out" || fail "rank $r init"
  grep -q "rank $r: barrier world ok" "$WORK/rank$r.out" || fail "rank $r barrier"
done
for r in 0 1 2 3; do
  for step in "allreduce world 100000 ok" "bcast world 1000 3 ok" "gatherobj world ok a,bb,ccc,dddd" \
      "a2a world ok" "cbarrier world ok"; do
    grep -q "rank $r: $step" "$WORK/rank$r.out" || fail "rank $r: $step (collectives across nodes)"
  done
  for op in "all_reduce SUM" "all_reduce AVG" "all_reduce PRODUCT" "all_reduce MIN" "all_reduce MAX" \
      "all_reduce BAND" "all_reduce BOR" "all_reduce BXOR" "all_reduce PREMUL_SUM" broadcast reduce \
      all_gather gather scatter reduce_scatter all_to_all all_to_all_single barrier send_recv \
      isend_irecv_tags; do
    grep -q "rank $r: xops world $op ok" "$WORK/rank$r.out" || fail "rank $r: xops world $op"
  done
  grep -q "rank $r: ring world 1048576 ok" "$WORK/rank$r.out" || fail "rank $r: ring across nodes"
  grep -q "rank $r: tagorder world ok" "$WORK/rank$r.out" || fail "rank $r: tags out of order"
  grep -q "rank $r: anysrc world ok" "$WORK/rank$r.out" || fail "rank $r: recv from any source"
done
senders=$(sed -nE 's/^rank 0: anysrc world ok senders=([0-9,]+).*/\1/p' "$WORK/rank0.out" \
  | tr , '\n' | sort | tr '\n' ' ')
[[ $senders == "1 2 3 " ]] || fail "rank 0 was told senders '$senders' (want 1 2 3)"
for r in 1 2; do  # one member per node: leaders only
  n=$(grep -c "rank $r: xops cross .* ok" "$WORK/rank$r.out")
  (( n == 20 )) || fail "rank $r: $n of 20 operations on group cross"
done
# Node B's leader (rank 2) dies: rank 1 waits for it in Gloo (node A),
# rank 3 in node B's shared memory.
for r in 1 3; do
  line=$(grep -E "rank $r: allreduce (cross|world) 1000 " "$WORK/rank$r.out")
  [[ $line == *"error ABORTED"*"rank 2 (host"*"failed"* ]] \
    || fail "rank $r's collective did not fail naming rank 2: $line"
  ms=$(echo "$line" | sed -E 's/.*elapsed_ms=([0-9]+).*/\1/')
  (( ms < 4500 )) || fail "rank $r's collective failed after $ms ms (2.5 s sleep + 2 s allowed)"
done
grep -q "rank 2: subgroups 2 ok count=2 mine: name=group_2 rank=0 size=2 ranks=2,3" \
  "$WORK/rank2.out" || fail "rank 2 subgroup"
grep -q "rank 1: barrier cross 20000 ok" "$WORK/rank1.out" || fail "cross barrier on A"
grep -q "rank 2: barrier cross 20000 ok" "$WORK/rank2.out" || fail "cross barrier on B"
for r in 0 1; do
  line=$(grep "rank $r: barrier world 20000" "$WORK/rank$r.out")
  [[ $line == *"error ABORTED"*"rank 2 (host"*"failed: its process exited"* ]] \
    || fail "rank $r did not see rank 2's failure: $line"
  ms=$(echo "$line" | sed -E 's/.*elapsed_ms=([0-9]+).*/\1/')
  (( ms < 4500 )) || fail "rank $r noticed the failure after $ms ms (2.5 s sleep + 2 s allowed)"
done
echo "PASS: two nodes, 4 ranks, cross-node groups, every collective and p2p across nodes, fan-in ($peers store connection(s) from B), failure seen on A"
