#!/usr/bin/env bash
# The README's first command: sets up the machine, builds muster, starts a
# daemon on free ports, shows `musterctl status`, and stops the daemon.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
echo "demo: building (first build takes a few minutes)..."
bazel build //daemon:musterd //tools:musterctl 2>&1 | grep -E "^(ERROR|FAILED)|error:" || true
[[ -x bazel-bin/daemon/musterd && -x bazel-bin/tools/musterctl ]] || {
  echo "demo: build failed; run: bazel build //daemon:musterd //tools:musterctl" >&2
  exit 1
}
bin=$(pwd)/bazel-bin
work=$(mktemp -d /tmp/muster-demo-XXXXXX)
daemon_pid=""
cleanup() {
  [[ -n "$daemon_pid" ]] && kill -TERM "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

"$bin/daemon/musterd" --socket "$work/musterd.sock" --grpc-port 0 --store-port 0 --listen 127.0.0.1 \
  --ready-file "$work/ready.json" 2>"$work/musterd.log" &
daemon_pid=$!
for _ in $(seq 200); do [[ -s "$work/ready.json" ]] && break; sleep 0.05; done
[[ -s "$work/ready.json" ]] || { echo "demo: musterd did not start:" >&2; cat "$work/musterd.log" >&2; exit 1; }
echo "demo: musterd is up: $(cat "$work/ready.json")"
echo
"$bin/tools/musterctl" --socket "$work/musterd.sock" status
echo
kill -TERM "$daemon_pid"
wait "$daemon_pid" && echo "demo: musterd stopped cleanly (exit 0)"
daemon_pid=""
