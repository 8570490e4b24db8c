#!/usr/bin/env bash
# The README's test command: installs what is missing, builds everything and
# runs the whole test suite, then prints "tests: N passed, M failed".
# Extra arguments go to `bazel test` (e.g. --config=asan).
set -uo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh || exit 1
bazel test //... --test_summary=short "$@" 2>&1 | python3 tools/test_summary.py "$(pwd)/bazel-testlogs"
