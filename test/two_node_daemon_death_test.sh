#!/usr/bin/env bash
# Two "nodes" in network namespaces, two ranks each, running all_reduce in a
# loop on the world group (hierarchical: shared memory within a node, Gloo
# between the nodes' leaders). Node B's musterd is killed with SIGKILL:
# both of B's ranks — the leader, whose Gloo stage may be in flight, too —
# fail with UNAVAILABLE naming B's musterd within 1 s of its exit, and node
# A's ranks, whose daemon lives, fail at once (ABORTED: B's ranks closed
# their connections) instead of waiting for the group timeout (30 s here).
# Needs root (ip netns); without it the test is reported as skipped.
set -uo pipefail

source "$(dirname "$0")/netns_lib.sh"
MUSTERD=$(find_bin daemon/musterd)
RANK=$(find_bin test/muster-test-rank)

start_daemons "$MUSTERD"

start_rank() {  # rank namespace socket
  ip netns exec "$2" env RANK="$1" LOCAL_RANK=$(( $1 % 2 )) WORLD_SIZE=4 LOCAL_WORLD_SIZE=2 \
    MASTER_ADDR="$IPA" MASTER_PORT="$PORT" MUSTER_SOCKET="$3" MUSTER_JOB_ID=two-node-death \
    MUSTER_TEST_INIT_TIMEOUT_MS=30000 "$RANK" "init;arloop world;artime world" \
    >"$WORK/rank$1.out" 2>&1 &
  pids+=($!)
  eval "rank_pid_$1=$!"
}
start_rank 0 "$NA" "$WORK/a.sock"
start_rank 1 "$NA" "$WORK/a.sock"
start_rank 2 "$NB" "$WORK/b.sock"
start_rank 3 "$NB" "$WORK/b.sock"
for _ in $(seq 600); do
  n=0
  for r in 0 1 2 3; do grep -q "rank $r: arloop world running" "$WORK/rank$r.out" && n=$((n + 1)); done
  (( n == 4 )) && break
  sleep 0.05
done
(( n == 4 )) || fail "the ranks did not all start their loop"
sleep 0.3
killed_us=$(date +%s%6N)
kill -9 "$PID_B" || fail "kill musterd B"
# The ranks can only notice once the kernel closed the dead daemon's sockets,
# which a loaded machine may delay (CI once saw 5.5 s between the kill and
# the ranks' errors, both ranks within 10 ms of each other): their time is
# counted from the exit, reaped here, and the exit time is reported.
wait "$PID_B" 2>/dev/null
exited_us=$(date +%s%6N)
exit_ms=$(( (exited_us - killed_us) / 1000 ))
for r in 0 1 2 3; do wait "$(eval echo \$rank_pid_$r)"; done

at_us() { sed -nE 's/.* at_us=([0-9]+).*/\1/p' <<<"$1"; }
gone="musterd (pid $PID_B, unix:$WORK/b.sock) is gone: the session stream ended"
summary=""
for r in 2 3; do
  line=$(grep "rank $r: arloop world error" "$WORK/rank$r.out")
  [[ $line == *"error UNAVAILABLE: "*"$gone"* ]] || fail "rank $r (node B): $line"
  at=$(at_us "$line")
  ms=$(( (at - exited_us) / 1000 ))
  (( at >= killed_us && ms < 1000 )) ||
    fail "rank $r (node B) failed $ms ms after musterd B exited ($exit_ms ms after the kill)"
  later=$(grep "rank $r: artime world" "$WORK/rank$r.out")
  [[ $later == *"error UNAVAILABLE: "*"$gone"* ]] || fail "rank $r (node B), later: $later"
  summary+=" rank $r: UNAVAILABLE after $ms ms;"
done
for r in 0 1; do
  line=$(grep "rank $r: arloop world error" "$WORK/rank$r.out")
  [[ $line == *"error ABORTED: "* ]] || fail "rank $r (node A): $line"
  at=$(at_us "$line")
  ms=$(( (at - exited_us) / 1000 ))
  (( at >= killed_us && ms < 5000 )) ||
    fail "rank $r (node A) failed $ms ms after musterd B exited ($exit_ms ms after the kill)"
  summary+=" rank $r: ABORTED after $ms ms;"
done
echo "PASS: node B's musterd killed (exited $exit_ms ms after SIGKILL); after its exit:$summary"
