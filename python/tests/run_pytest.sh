#!/usr/bin/env bash
# Runs muster's Python tests (python/tests) with the interpreter given as $1
# against the binaries of this Bazel tree (or bazel-bin outside Bazel).
# pytest's closing line ("N passed, M failed in S s") is what
# tools/test_summary.py counts.
set -uo pipefail
PY=${1:?usage: run_pytest.sh PYTHON [PYTEST ARGS...]}
shift
if [[ -n "${TEST_SRCDIR:-}" && -d "${TEST_SRCDIR}/muster" ]]; then
  export MUSTER_BIN_DIR="${TEST_SRCDIR}/muster"
  TESTS="${TEST_SRCDIR}/muster/python/tests"
else
  TESTS="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
fi
if [[ ! -x "$PY" ]]; then
  echo "run_pytest: FAIL: no interpreter at $PY (tools/setup.sh installs Debian's python3-torch" \
       "and creates the torch 2.x venv at /opt/muster/torch-venv)" >&2
  exit 1
fi
# A sanitizer build of libmuster.so needs its runtime loaded first, which a
# Python interpreter does not do: say so instead of failing on it.
LIB="${MUSTER_BIN_DIR:-$(cd "$TESTS/../.." && pwd)/bazel-bin}/client/libmuster.so"
# (ldd's output is read whole first: with pipefail, grep -q closing the pipe
# early would fail the pipeline.)
deps=$(ldd "$LIB" 2>/dev/null || true)
if grep -qE 'lib(a|t)san' <<<"$deps"; then
  echo "MUSTER_TEST_SKIPPED: libmuster.so is a sanitizer build (--config=asan/tsan); the Python" \
       "suites run in the plain build (the C API's own test, //client:c_api_test, runs here)"
  exit 0
fi
# The torch backend is compiled once per torch version into this cache.
# Private to this user: the backend refuses a folder others can write.
export MUSTER_TORCH_BUILD_DIR="${MUSTER_TORCH_BUILD_DIR:-/var/tmp/muster-torch-build-$(id -u)}"
mkdir -p -m 700 "$MUSTER_TORCH_BUILD_DIR"
# HOME may be a fresh temporary directory under Bazel; torch's extension
# builder and pip want one that exists.
export HOME="${HOME:-/tmp}"
mkdir -p "$HOME"
echo "run_pytest: $("$PY" -c 'import sys, torch; print(sys.executable, "torch", torch.__version__)' 2>&1)"
cd "$TESTS" && exec "$PY" -m pytest -p no:cacheprovider -q -rfEs "$@" "$TESTS"
