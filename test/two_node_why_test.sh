#!/usr/bin/env bash
# `musterctl why` across nodes: two "nodes" in network namespaces, each
# musterd serving TCP gRPC with the cluster token; a 4-rank job (ranks 0,1
# on node A, 2,3 on node B) in which rank 3 stops before its third
# all_reduce while the others enter it. Asked on node A only, musterctl why
# names rank 3 (node B's), the op and the sequence number within 1 s (node
# A's musterd gathers node B's records from its daemon); with --local it
# sees only node A's members and cannot; musterctl trace on node A shows node
# B's ranks' records. Needs root (ip netns); otherwise reported as skipped.
set -uo pipefail

source "$(dirname "$0")/netns_lib.sh"
MUSTERD=$(find_bin daemon/musterd)
MUSTERCTL=$(find_bin tools/musterctl)
RANK=$(find_bin test/muster-test-rank)

head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$WORK/token"
chmod 600 "$WORK/token"
start_daemons "$MUSTERD" --token-file "$WORK/token" -- --token-file "$WORK/token"
(( GRPC_A > 0 )) || fail "node A serves no TCP gRPC"

JOB=why-two-node
start_rank() {  # rank namespace socket script
  ip netns exec "$2" env RANK="$1" LOCAL_RANK=$(( $1 % 2 )) WORLD_SIZE=4 LOCAL_WORLD_SIZE=2 \
    MASTER_ADDR="$IPA" MASTER_PORT="$PORT" MUSTER_SOCKET="$3" MUSTER_JOB_ID=$JOB "$RANK" "$4" \
    >"$WORK/rank$1.out" 2>&1 &
  pids+=($!)
}
RUN="init;allreduce world 1000;allreduce world 1000"
start_rank 0 "$NA" "$WORK/a.sock" "$RUN;allreduce world 1000"
start_rank 1 "$NA" "$WORK/a.sock" "$RUN;allreduce world 1000"
start_rank 2 "$NB" "$WORK/b.sock" "$RUN;allreduce world 1000"
start_rank 3 "$NB" "$WORK/b.sock" "$RUN;mark stopped;sleep 60000;allreduce world 1000"

ctl_a() { ip netns exec "$NA" "$MUSTERCTL" --socket "$WORK/a.sock" "$@"; }
want="rank 3 has not entered all_reduce #3 that ranks 0-2 entered"
for _ in $(seq 1 200); do
  why=$(ctl_a why "$JOB" 2>&1)
  [[ $why == *"$want"* ]] && break
  sleep 0.1
done
[[ $why == *"$want"* ]] || fail "node A's why does not name rank 3: $why"
grep -q "rank 3: mark stopped" "$WORK/rank3.out" || fail "rank 3 did not stop where scripted"

# Once the job is stuck: one question, answered within 1 s.
t0=$(date +%s%N)
why=$(ctl_a why "$JOB" 2>&1) || fail "why failed: $why"
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
echo "$why"
[[ $why == *"job $JOB group world: $want"* ]] || fail "why on node A: $why"
echo "$why" | grep -Eq "rank 3: last completed #2; not in a collective" \
  || fail "why does not show rank 3's progress: $why"
echo "$why" | grep -Eq "rank 2: last completed #2; in all_reduce #3" \
  || fail "why does not show rank 2 (node B) in #3: $why"
[[ $why == *"records missing"* ]] && fail "node A could not reach node B: $why"
(( ms < 1000 )) || fail "musterctl why took $ms ms (over 1 s)"

# Without the peer: node A's members alone are all in #3, nobody to blame.
local_why=$(ctl_a why "$JOB" --local 2>&1) || fail "why --local failed: $local_why"
[[ $local_why == *"rank 3"* ]] && fail "why --local on node A knows of rank 3: $local_why"
[[ $local_why == *"every local member is in all_reduce #3"* ]] || fail "why --local: $local_why"

# trace on node A shows node B's ranks too (gathered), aligned by seq.
trace=$(ctl_a trace "$JOB" world --json 2>&1) || fail "trace on node A: $trace"
for r in 2 3; do
  echo "$trace" | grep -q "\"rank\":$r,.*\"seq\":2,\"op\":\"all_reduce\",\"dtype\":\"int32\"" \
    || fail "node A's trace lacks node B's rank $r: $trace"
done
echo "$trace" | grep -q '"rank":3,.*"seq":3,' && fail "rank 3 has a record of #3: $trace"
echo "PASS: musterctl why on node A named node B's rank 3 (all_reduce #3) in $ms ms"
