#!/usr/bin/env bash
# Unmodified PyTorch 1.13 ranks (Debian's python3-torch, CPU, gloo) rendezvous
# through a real musterd's TCP store, with no store server on the torch side.
#
# Starts musterd (store on 127.0.0.1, port picked by the daemon), then runs
# WORLD ranks of test/torch_compat/torch_ranks.py in each mode:
#   agent     TORCHELASTIC_USE_AGENT_STORE=True + env:// (every rank a client)
#   explicit  TCPStore(is_master=False) passed as store= to init_process_group
# Every rank must print "RANK r OK" and exit 0. Then checks, over musterd's
# gRPC API (musterctl), the keys and counters torch left in the store, that the
# daemon saw every connection close, and that SIGTERM stops it with exit 0.
#
# With MUSTER_TEST_STORE_BACKEND=etcd (//test:torch_compat_etcd_test) musterd
# runs --store-backend etcd over a 3-member etcd cluster this script starts
# (tools/etcd_cluster.sh); the same checks then run against the etcd-backed
# store, and at the end musterd is restarted and the keys must still be there.
#
# Prints "MUSTER_TEST_SKIPPED: ..." and exits 0 when /usr/bin/python3 cannot
# import torch.distributed (or, for etcd, when etcd is not installed).
set -uo pipefail

WORLD=4
RANK_TIMEOUT_S=40     # per mode; a normal mode takes ~3 s
READY_TIMEOUT_S=20
PYTHON=${MUSTER_TORCH_PYTHON:-/usr/bin/python3}

log() { echo "torch_compat_test: $*" >&2; }

# --- Locate the binaries (Bazel runfiles, else a bazel-bin next to the repo).
if [[ -n "${TEST_SRCDIR:-}" && -d "${TEST_SRCDIR}/muster" ]]; then
  ROOT="${TEST_SRCDIR}/muster"
  MUSTERD="$ROOT/daemon/musterd"
  MUSTERCTL="$ROOT/tools/musterctl"
else
  ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  MUSTERD="$ROOT/bazel-bin/daemon/musterd"
  MUSTERCTL="$ROOT/bazel-bin/tools/musterctl"
fi
RANKS_PY="$ROOT/test/torch_compat/torch_ranks.py"
ETCD_CLUSTER="$ROOT/tools/etcd_cluster.sh"
BACKEND=${MUSTER_TEST_STORE_BACKEND:-memory}
for f in "$MUSTERD" "$MUSTERCTL" "$RANKS_PY"; do
  if [[ ! -e "$f" ]]; then
    log "FAIL: missing $f (build with: bazel build //daemon:musterd //tools:musterctl)"
    exit 1
  fi
done

# --- Skip when Debian's torch is not installed.
if ! "$PYTHON" -c 'import torch, torch.distributed as d; assert d.is_available()' \
    >/dev/null 2>&1; then
  echo "MUSTER_TEST_SKIPPED: python3-torch not installed"
  exit 0
fi

if [[ "$BACKEND" == etcd ]] && ! command -v etcd >/dev/null; then
  echo "MUSTER_TEST_SKIPPED: etcd not installed (apt-get install etcd-server)"
  exit 0
fi

# --- Scratch directory (short: it holds the unix socket) and cleanup.
DIR="$(mktemp -d /tmp/muster-torch-XXXXXX)" || { log "FAIL: mktemp"; exit 1; }
SOCK="$DIR/musterd.sock"
READY="$DIR/ready.json"
DAEMON_LOG="$DIR/musterd.log"
DAEMON_PID=""
declare -a RANK_PIDS=()
FAILED=0

dump_logs() {
  local f
  for f in "$DAEMON_LOG" "$DIR"/*.out "$DIR"/*.err "$DIR"/keys.txt; do
    [[ -f "$f" ]] || continue
    echo "----- ${f##*/} (last 60 lines) -----" >&2
    tail -n 60 "$f" >&2
  done
  if [[ -n "${TEST_UNDECLARED_OUTPUTS_DIR:-}" ]]; then
    cp "$DIR"/*.log "$DIR"/*.out "$DIR"/*.err "$DIR"/*.txt "$TEST_UNDECLARED_OUTPUTS_DIR"/ \
      2>/dev/null || true
  fi
}

cleanup() {
  local rc=$? p
  for p in "${RANK_PIDS[@]}"; do
    kill -TERM "$p" 2>/dev/null
  done
  if [[ -n "$DAEMON_PID" ]] && kill -0 "$DAEMON_PID" 2>/dev/null; then
    kill -TERM "$DAEMON_PID" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$DAEMON_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$DAEMON_PID" 2>/dev/null
  fi
  wait 2>/dev/null
  [[ "$BACKEND" == etcd ]] && "$ETCD_CLUSTER" stop "$DIR/etcd"
  if [[ $rc -ne 0 || $FAILED -ne 0 ]]; then dump_logs; fi
  rm -rf "$DIR"
  exit $rc
}
trap cleanup EXIT
trap 'log "interrupted"; exit 1' INT TERM

fail() {
  FAILED=1
  log "FAIL: $*"
  exit 1
}

ctl() { "$MUSTERCTL" --socket "$SOCK" --timeout 5 "$@"; }

START=$SECONDS

BACKEND_ARGS=()
if [[ "$BACKEND" == etcd ]]; then
  ENDPOINTS=$("$ETCD_CLUSTER" start "$DIR/etcd") || fail "could not start etcd"
  BACKEND_ARGS=(--store-backend etcd --etcd-endpoints "$ENDPOINTS" --etcd-prefix /torch-compat/)
  log "etcd cluster at $ENDPOINTS"
fi

# --- Start musterd and wait for its ready file.
start_musterd() {
"$MUSTERD" --socket "$SOCK" --grpc-port 0 --store-port "${1:-0}" --listen 127.0.0.1 \
  "${BACKEND_ARGS[@]}" --ready-file "$READY" --log-level info >>"$DAEMON_LOG" 2>&1 &
DAEMON_PID=$!
for _ in $(seq $((READY_TIMEOUT_S * 10))); do
  [[ -s "$READY" ]] && break
  kill -0 "$DAEMON_PID" 2>/dev/null || fail "musterd exited before it was ready"
  sleep 0.1
done
[[ -s "$READY" ]] || fail "no ready file after ${READY_TIMEOUT_S}s"
read -r READY_PID STORE_PORT < <("$PYTHON" -c '
import json, sys
r = json.load(open(sys.argv[1]))
print(r["pid"], r["store_port"])' "$READY") || fail "bad ready file: $(cat "$READY")"
[[ "$READY_PID" == "$DAEMON_PID" ]] || fail "ready file pid $READY_PID, started $DAEMON_PID"
[[ "$STORE_PORT" =~ ^[0-9]+$ && "$STORE_PORT" -gt 0 ]] || fail "no store port in $(cat "$READY")"
log "musterd pid $DAEMON_PID, store on 127.0.0.1:$STORE_PORT"
}
start_musterd

# --- Run WORLD ranks of one mode; every one must print "RANK r OK" and exit 0.
run_mode() {
  local mode=$1 r p rc pid bad=0 t0=$SECONDS
  declare -A rank_of=()
  RANK_PIDS=()
  for ((r = 0; r < WORLD; r++)); do
    timeout -k 5 "$RANK_TIMEOUT_S" "$PYTHON" "$RANKS_PY" "$mode" "$r" "$WORLD" "$STORE_PORT" \
      >"$DIR/$mode.$r.out" 2>"$DIR/$mode.$r.err" </dev/null &
    RANK_PIDS+=($!)
    rank_of[$!]=$r
  done
  local remaining=$WORLD
  while ((remaining > 0)); do
    pid=""
    wait -n -p pid
    rc=$?
    [[ -n "$pid" ]] || fail "$mode: wait -n returned no pid"
    if [[ "$pid" == "$DAEMON_PID" ]]; then
      DAEMON_PID=""
      fail "$mode: musterd exited (status $rc) while ranks were running"
    fi
    r=${rank_of[$pid]:-}
    [[ -n "$r" ]] || continue
    remaining=$((remaining - 1))
    if [[ $rc -ne 0 ]]; then
      if [[ $rc -eq 124 || $rc -eq 137 ]]; then
        log "$mode: rank $r timed out after ${RANK_TIMEOUT_S}s"
      else
        log "$mode: rank $r exited with status $rc"
      fi
      if ((bad == 0)); then  # one rank failed: the others would only hang
        for p in "${RANK_PIDS[@]}"; do
          [[ "$p" == "$pid" ]] || kill -TERM "$p" 2>/dev/null
        done
      fi
      bad=1
    elif ! grep -qx "RANK $r OK" "$DIR/$mode.$r.out"; then
      log "$mode: rank $r exited 0 without 'RANK $r OK'"
      bad=1
    fi
  done
  RANK_PIDS=()
  ((bad == 0)) || fail "$mode: not every rank succeeded (logs below)"
  log "$mode: $WORLD ranks OK in $((SECONDS - t0))s"
}

run_mode agent
run_mode explicit

# --- What torch left in the store, read back over musterd's gRPC API.
ctl store keys >"$DIR/keys.txt" || fail "musterctl store keys failed"
AGENT_P="//worker/attempt_0/default_pg/"   # PrefixStores: attempt_0, default_pg
EXPLICIT_P="/"                              # store= passed: the TCPStore's own "/"
expect_key() {
  grep -qxF -- "$1" "$DIR/keys.txt" || fail "expected key '$1' not in the store"
}
expect_value() {
  local v
  v="$(ctl store get "$1")" || fail "musterctl store get '$1' failed"
  [[ "$v" == "$2" ]] || fail "key '$1' = '$v', expected '$2'"
}
for P in "$AGENT_P" "$EXPLICIT_P"; do
  # Store-based barriers of the default group (:1) and of new_group (:2),
  # reached by all WORLD ranks; the ADD counters are decimal text.
  expect_key "${P}store_based_barrier_key:1"
  expect_key "${P}store_based_barrier_key:2"
  expect_value "${P}store_based_barrier_key:1" "$WORLD"
  expect_value "${P}store_based_barrier_key:2" "$WORLD"
  # Gloo full-mesh rendezvous: group 0 has every rank, group 1 ranks 0 and 1.
  for ((r = 0; r < WORLD; r++)); do
    expect_key "${P}0/0/rank_$r"
    expect_key "${P}0/0/$r"
  done
  for r in 0 1; do
    expect_key "${P}1/0/rank_$r"
    expect_key "${P}1/0/$r"
  done
  if grep -qxF -- "${P}1/0/rank_2" "$DIR/keys.txt"; then
    fail "non-member rank 2 registered in new_group([0, 1])"
  fi
  expect_key "${P}0/SEQ_NUM_STORE_KEY"
  expect_key "${P}1/SEQ_NUM_STORE_KEY"
done
# Every rank's TCPStore client did ADD init/ 1 (no "/" prefix): 2 modes x WORLD.
expect_value "init/" "$((2 * WORLD))"
# Rank 0's semantics checks, seen from the gRPC side.
for mode in agent explicit; do
  expect_value "/muster_compat_$mode/ctr" "-2"
  expect_value "/muster_compat_$mode/late" "here"
  expect_value "/muster_compat_$mode/shared" "$((200 * WORLD))"
  expect_value "/muster_compat_$mode/m2" "7"
  for gone in cs cs_missing never big; do
    if grep -qxF -- "/muster_compat_$mode/$gone" "$DIR/keys.txt"; then
      fail "key '/muster_compat_$mode/$gone' should not exist"
    fi
  done
done
log "store holds $(wc -l <"$DIR/keys.txt") keys, torch's layout as expected"

# --- Every torch connection (2 per client in 1.13) was closed and reaped.
conns=""
for _ in $(seq 50); do
  conns="$(ctl --json status | "$PYTHON" -c 'import json,sys; print(json.load(sys.stdin)["store_connections"])')" \
    || fail "musterctl status failed"
  [[ "$conns" == "0" ]] && break
  sleep 0.1
done
[[ "$conns" == "0" ]] || fail "musterd still counts $conns store connections after all ranks exited"

# --- SIGTERM: exit 0, ready file removed.
stop_musterd() {
kill -TERM "$DAEMON_PID"
rc=""
for _ in $(seq 100); do
  if ! kill -0 "$DAEMON_PID" 2>/dev/null; then
    wait "$DAEMON_PID"
    rc=$?
    break
  fi
  sleep 0.1
done
[[ -n "$rc" ]] || fail "musterd still running 10s after SIGTERM"
DAEMON_PID=""
[[ "$rc" -eq 0 ]] || fail "musterd exited with status $rc after SIGTERM"
[[ ! -e "$READY" ]] || fail "ready file left behind after shutdown"
}
stop_musterd

# --- etcd: a fresh musterd serves every key the first one stored.
if [[ "$BACKEND" == etcd ]]; then
  cp "$DIR/keys.txt" "$DIR/keys.before.txt"
  start_musterd
  ctl store keys >"$DIR/keys.txt" || fail "musterctl store keys failed after the restart"
  cmp -s "$DIR/keys.before.txt" "$DIR/keys.txt" || fail "keys differ after restarting musterd"
  expect_value "/muster_compat_agent/shared" "$((200 * WORLD))"
  expect_value "init/" "$((2 * WORLD))"
  log "restarted musterd: all $(wc -l <"$DIR/keys.txt") keys survived in etcd"
  stop_musterd
fi

log "PASS in $((SECONDS - START))s"
