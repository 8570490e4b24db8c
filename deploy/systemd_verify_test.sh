#!/usr/bin/env bash
# Checks deploy/systemd/musterd.service with `systemd-analyze verify`, its
# ExecStart pointed at the musterd just built (the installed path does not
# exist on a build machine).
set -uo pipefail
root="${TEST_SRCDIR:-}/${TEST_WORKSPACE:-muster}"
[[ -n "${TEST_SRCDIR:-}" ]] || root=$(cd "$(dirname "$0")/.." && pwd)
musterd="$root/daemon/musterd"
[[ -x $musterd ]] || musterd="$root/bazel-bin/daemon/musterd"
unit="$root/deploy/systemd/musterd.service"
if ! command -v systemd-analyze >/dev/null; then
  echo "MUSTER_TEST_SKIPPED: systemd-analyze not installed"
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
sed "s#/usr/local/bin/musterd#$musterd#" "$unit" >"$work/musterd.service"
grep -q "^Type=notify" "$work/musterd.service" || { echo "FAIL: not Type=notify"; exit 1; }
grep -q "^ExecStart=$musterd " "$work/musterd.service" || { echo "FAIL: ExecStart"; exit 1; }
out=$(systemd-analyze verify "$work/musterd.service" 2>&1)
rc=$?
# Messages about the machine (no running systemd, unrelated units) are not
# about our unit; anything naming musterd.service is.
ours=$(echo "$out" | grep "musterd.service" || true)
if [[ $rc -ne 0 || -n $ours ]]; then
  echo "FAIL: systemd-analyze verify (rc=$rc):"
  echo "$out"
  exit 1
fi
echo "PASS: systemd-analyze verify accepts musterd.service"
