#!/usr/bin/env bash
# Soak test of musterd (not in CI): an hour of mixed store traffic,
# collectives with random rank kills, compactions, scrapes and restarts, as
# root and as nobody, with musterd's RSS, fds and threads sampled. Ends with a
# report (lost acknowledged writes, hangs, fd/thread growth) and exit 0 only
# when all is well. See the header of tools/soak.py.
#
# Usage: sudo tools/soak.sh [--minutes 60] [--out DIR] [--seed N]
#                           [--workers 4] [--flat-minutes 10]
# Binaries: $MUSTER_BIN_DIR (default: bazel-bin of this checkout), built with
#   bazel build //daemon:musterd //tools:musterctl //test:muster-test-rank
set -euo pipefail
exec /usr/bin/python3 "$(dirname "$0")/soak.py" "$@"
