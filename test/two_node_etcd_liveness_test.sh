#!/usr/bin/env bash
# Issue 17's Done-when test: two "nodes" (network namespaces), a musterd on
# each with --store-backend etcd (a 3-member etcd cluster listening on node
# A's veth address, which node B routes to; it is not part of node 0's fate:
# only musterd and ranks are killed), a job of 2 ranks per node running
# rounds of store set/get and all_reduce.
#  (a) the etcd leader is SIGKILLed mid-job: every rank finishes its rounds
#      with correct results;
#  (b) node 0's musterd and both its ranks are SIGKILLed: node 1's ranks are
#      told that ranks 0 and 1 failed, with the reason naming node 0 and its
#      expired lease, within the lease TTL (+1.5 s) of the kill (the time is
#      printed), and their store calls still work through node 1's musterd;
#      exactly one failure record per lost rank is in etcd;
#  (c) both musterds stopped and started again: every key written before is
#      read back through each of them.
# Needs root (ip netns) and etcd-server; without them it prints
# MUSTER_TEST_SKIPPED and passes.
set -uo pipefail

if ! command -v etcd >/dev/null || ! command -v curl >/dev/null; then
  echo "MUSTER_TEST_SKIPPED: etcd-server (etcd) or curl is not installed"
  exit 0
fi
source "$(dirname "$0")/netns_lib.sh"
MUSTERD=$(find_bin daemon/musterd)
MUSTERCTL=$(find_bin tools/musterctl)
RANK=$(find_bin test/muster-test-rank)
CLUSTER=$(find_bin tools/etcd_cluster.sh)
[[ -e $CLUSTER ]] || CLUSTER="$(cd "$(dirname "$0")/.." && pwd)/tools/etcd_cluster.sh"  # not in bazel
PORT=$(( 20000 + $$ % 20000 ))
TTL=3
JOB="lease-$$"
PREFIX="/lease-test-$$/"
HOSTNAME_NOW=$(hostname)
t0=$(date +%s%3N)

cluster() { ip netns exec "$NA" env ETCD_HOST="$IPA" bash "$CLUSTER" "$@"; }
cluster start "$WORK/etcd" >/dev/null || fail "etcd cluster did not start (logs in $WORK/etcd)"
EPS=$(cat "$WORK/etcd/endpoints")

start_musterd() {  # a|b namespace ip
  rm -f "$WORK/$1.json"
  ip netns exec "$2" "$MUSTERD" --socket "$WORK/$1.sock" --listen "$3" --grpc-port 0 \
    --store-port "$PORT" --store-backend etcd --etcd-endpoints "$EPS" --etcd-prefix "$PREFIX" \
    --etcd-lease-ttl-seconds "$TTL" --ready-file "$WORK/$1.json" 2>>"$WORK/musterd-$1.log" &
  pids+=($!)
  eval "musterd_pid_$1=$!"
}
wait_ready() {
  for _ in $(seq 200); do [[ -s $WORK/a.json && -s $WORK/b.json ]] && return; sleep 0.05; done
  fail "the musterds did not start"
}
start_musterd a "$NA" "$IPA"
start_musterd b "$NB" "$IPB"
wait_ready

ROUNDS=150
start_rank() {  # rank namespace ip socket script
  ip netns exec "$2" env RANK="$1" LOCAL_RANK=$(( $1 % 2 )) WORLD_SIZE=4 LOCAL_WORLD_SIZE=2 \
    MASTER_ADDR="$3" MASTER_PORT="$PORT" MUSTER_SOCKET="$4" MUSTER_JOB_ID="$JOB" \
    MUSTER_TEST_INIT_TIMEOUT_MS=30000 "$RANK" "$5" >"$WORK/rank$1.out" 2>&1 &
  pids+=($!)
  eval "rank_pid_$1=$!"
}
node0="init;storeloop world $ROUNDS;mark a-done;sleep 60000"
node1="init;storeloop world $ROUNDS;mark a-done;awaitlost 30000 2;storecheck"
start_rank 0 "$NA" "$IPA" "$WORK/a.sock" "$node0"
start_rank 1 "$NA" "$IPA" "$WORK/a.sock" "$node0"
start_rank 2 "$NB" "$IPB" "$WORK/b.sock" "$node1"
start_rank 3 "$NB" "$IPB" "$WORK/b.sock" "$node1"

count() { cat "$WORK"/rank?.out 2>/dev/null | grep -c -- "$1"; }
await() {  # pattern n seconds what
  for _ in $(seq $(( $3 * 20 ))); do (( $(count "$1") >= $2 )) && return; sleep 0.05; done
  fail "$4"
}

# (a) The etcd leader killed while every rank is in its rounds.
await "storeloop world running" 4 30 "the ranks did not all start their rounds"
sleep 0.3
(( $(count "storeloop world $ROUNDS ok") == 0 )) || fail "(a) the rounds ended before the kill"
read -r leader _ < <(cluster leader "$WORK/etcd") || fail "(a) no etcd leader"
cluster kill "$WORK/etcd" "$leader" || fail "(a) cannot kill etcd member $leader"
killed_leader_ms=$(date +%s%3N)
await "mark a-done" 4 40 "(a) the rounds did not all finish after the etcd leader was killed"
for r in 0 1 2 3; do
  grep -q "rank $r: storeloop world $ROUNDS ok iters=$ROUNDS" "$WORK/rank$r.out" \
    || fail "(a) rank $r: $(grep "storeloop world $ROUNDS " "$WORK/rank$r.out")"
done
a_ms=$(( $(date +%s%3N) - killed_leader_ms ))
echo "(a) etcd leader $leader killed mid-job: all 4 ranks finished $ROUNDS rounds ($a_ms ms after the kill)"

# (b) Node 0 vanishes: its musterd and ranks SIGKILLed together.
sleep 0.2
killed_us=$(date +%s%6N)
kill -9 "$musterd_pid_a" "$rank_pid_0" "$rank_pid_1"
for p in "$musterd_pid_a" "$rank_pid_0" "$rank_pid_1"; do wait "$p" 2>/dev/null; done
for r in 2 3; do wait "$(eval echo \$rank_pid_$r)"; done
at_us() { sed -nE 's/.* at_us=([0-9]+).*/\1/p' <<<"$1"; }
reason="node $HOSTNAME_NOW/$IPA (musterd lease expired after $TTL s): ranks 0, 1 lost"
summary=""
for r in 2 3; do
  line=$(grep "rank $r: awaitlost" "$WORK/rank$r.out")
  [[ $line == *" ok at_us="* ]] || fail "(b) rank $r was not told node 0 was lost: $line"
  for lost in 0 1; do
    [[ $line == *"rank $lost (host "*") failed: $reason"* ]] \
      || fail "(b) rank $r: no failure of rank $lost naming node 0 ('$reason'): $line"
  done
  ms=$(( ($(at_us "$line") - killed_us) / 1000 ))
  (( ms >= TTL * 1000 / 2 && ms <= TTL * 1000 + 1500 )) \
    || fail "(b) rank $r was told $ms ms after the kill (want $(( TTL * 500 ))..$(( TTL * 1000 + 1500 )) ms)"
  grep -q "rank $r: storecheck ok wl/0/0=0:0" "$WORK/rank$r.out" \
    || fail "(b) rank $r: store through node 1's musterd: $(grep "storecheck" "$WORK/rank$r.out")"
  summary+=" rank $r told after $ms ms;"
done
# Failure records in etcd, counted through etcd's JSON gateway (range over
# the prefix .../failure/, i.e. up to .../failure0).
b64() { printf '%s' "$1" | base64 -w0; }
base="${PREFIX}muster/$JOB/0/failure"
# Node 1's musterd tells its ranks first, then writes the records one by
# one: the ranks may be done before the second is in etcd. Up to 5 s.
read -r _ _ live < <(cluster leader "$WORK/etcd") || fail "(b) no etcd leader"
for _ in $(seq 50); do
  records=$(ip netns exec "$NA" curl -fsS -m 5 -X POST "$live/v3/kv/range" \
    -d "{\"key\":\"$(b64 "$base/")\",\"range_end\":\"$(b64 "${base}0")\",\"count_only\":true}" \
    | sed -nE 's/.*"count":"([0-9]+)".*/\1/p')
  [[ -n $records ]] || records=0
  (( records >= 2 )) && break
  sleep 0.1
done
(( records == 2 )) || fail "(b) $records failure records in etcd (want 2: ranks 0 and 1)"
echo "(b) node 0 killed (TTL $TTL s):$summary reason: $reason; 2 failure records"

# (c) Every musterd stopped and started again: the keys are all still there.
# (The ranks' keys: the daemons' own under muster/ may still change as node 1's
# ranks leave.)
before=$(ip netns exec "$NB" "$MUSTERCTL" --socket "$WORK/b.sock" store keys | grep '^user/' | sort)
nkeys=$(grep -c "wl/" <<<"$before")
(( nkeys == 4 * ROUNDS )) || fail "(c) $nkeys wl/ keys before the restart (want $(( 4 * ROUNDS )))"
kill -TERM "$musterd_pid_b"
wait "$musterd_pid_b"
start_musterd a "$NA" "$IPA"
start_musterd b "$NB" "$IPB"
wait_ready
for n in a b; do
  ns=$NA
  [[ $n == b ]] && ns=$NB
  after=$(ip netns exec "$ns" "$MUSTERCTL" --socket "$WORK/$n.sock" store keys | grep '^user/' | sort)
  [[ "$after" == "$before" ]] || fail "(c) keys through musterd $n after the restart differ: \
$(diff <(echo "$before") <(echo "$after") | head -20)"
  key=$(grep "wl/3/$(( ROUNDS - 1 ))\$" <<<"$after")
  value=$(ip netns exec "$ns" "$MUSTERCTL" --socket "$WORK/$n.sock" store get "$key")
  [[ $value == "3:$(( ROUNDS - 1 ))" ]] || fail "(c) $key through musterd $n: '$value'"
done
echo "(c) both musterds restarted: all $(grep -c . <<<"$before") keys read back through each"
echo "PASS: etcd liveness on two nodes in $(( $(date +%s%3N) - t0 )) ms"
