# Sourced by the multi-node tests: two "nodes" in network namespaces joined
# by a veth pair, addresses from 198.18.0.0/15, removed on exit. Defines
# NA NB IPA IPB WORK, find_bin, fail, and a `pids` array killed on exit.
# Exits 0 with MUSTER_TEST_SKIPPED when namespaces cannot be created.

find_bin() {
  local rel=$1
  if [[ -n "${TEST_SRCDIR:-}" && -x "$TEST_SRCDIR/${TEST_WORKSPACE:-muster}/$rel" ]]; then
    echo "$TEST_SRCDIR/${TEST_WORKSPACE:-muster}/$rel"
  elif [[ -n "${TEST_SRCDIR:-}" && -e "$TEST_SRCDIR/${TEST_WORKSPACE:-muster}/$rel" ]]; then
    echo "$TEST_SRCDIR/${TEST_WORKSPACE:-muster}/$rel"
  else
    echo "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/bazel-bin/$rel"
  fi
}

if [[ $(id -u) -ne 0 ]] || ! ip netns add "muster-probe-$$" 2>/dev/null; then
  echo "MUSTER_TEST_SKIPPED: creating network namespaces needs root and iproute2"
  exit 0
fi
ip netns del "muster-probe-$$"

netns_id=$(( $$ % 250 + 1 ))
NA="muster-a-$$"
NB="muster-b-$$"
IPA="198.18.$netns_id.1"
IPB="198.18.$netns_id.2"
WORK=$(mktemp -d /tmp/muster-netns-XXXXXX)
pids=()
netns_cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  wait 2>/dev/null
  ip netns pids "$NA" 2>/dev/null | xargs -r kill -9 2>/dev/null
  ip netns pids "$NB" 2>/dev/null | xargs -r kill -9 2>/dev/null
  ip netns del "$NA" 2>/dev/null
  ip netns del "$NB" 2>/dev/null
  rm -rf "$WORK"
}
trap netns_cleanup EXIT
fail() {
  echo "FAIL: $*"
  for f in "$WORK"/*.log "$WORK"/*.out; do [[ -f $f ]] && { echo "== $f"; cat "$f"; }; done
  exit 1
}

ip netns add "$NA" && ip netns add "$NB" || fail "ip netns add"
ip link add "va$$" type veth peer name "vb$$" || fail "veth"
ip link set "va$$" netns "$NA" && ip link set "vb$$" netns "$NB" || fail "veth move"
ip -n "$NA" addr add "$IPA/24" dev "va$$" && ip -n "$NB" addr add "$IPB/24" dev "vb$$" || fail "addr"
for ns in "$NA" "$NB"; do ip -n "$ns" link set lo up; done
ip -n "$NA" link set "va$$" up && ip -n "$NB" link set "vb$$" up || fail "link up"

# start_daemons MUSTERD [node A flags...] [-- node B flags...]: node A's
# musterd serves the job store, node B's has none (--store=false); returns
# once both are ready, with PORT (A's store port), GRPC_A (A's TCP gRPC port,
# 0 when off) and PID_A, PID_B set; the daemons' pids are in `pids`.
start_daemons() {
  local musterd=$1 a_flags=() b_flags=()
  shift
  while (($#)) && [[ $1 != -- ]]; do a_flags+=("$1"); shift; done
  (($#)) && shift
  b_flags=("$@")
  ip netns exec "$NA" "$musterd" --socket "$WORK/a.sock" --listen "$IPA" --grpc-port 0 \
    --store-port 0 --ready-file "$WORK/a.json" "${a_flags[@]}" 2>"$WORK/musterd-a.log" &
  pids+=($!)
  ip netns exec "$NB" "$musterd" --socket "$WORK/b.sock" --listen "$IPB" --grpc-port 0 \
    --store=false --ready-file "$WORK/b.json" "${b_flags[@]}" 2>"$WORK/musterd-b.log" &
  pids+=($!)
  for _ in $(seq 200); do [[ -s $WORK/a.json && -s $WORK/b.json ]] && break; sleep 0.05; done
  [[ -s $WORK/a.json && -s $WORK/b.json ]] || fail "daemons did not start"
  PORT=$(sed -E 's/.*"store_port":([0-9]+).*/\1/' "$WORK/a.json")
  GRPC_A=$(sed -E 's/.*"grpc_port":([0-9]+).*/\1/' "$WORK/a.json")
  PID_A=$(sed -E 's/.*"pid":([0-9]+).*/\1/' "$WORK/a.json")
  PID_B=$(sed -E 's/.*"pid":([0-9]+).*/\1/' "$WORK/b.json")
}
