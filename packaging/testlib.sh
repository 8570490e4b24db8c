# shellcheck shell=bash disable=SC2034  # sourced; its variables are for the tests
# Shared by //packaging's tests: where the runfiles are, a scratch directory
# removed on exit, and check helpers that print what they expected.
set -uo pipefail

if [[ -n ${TEST_SRCDIR:-} && -d ${TEST_SRCDIR}/muster ]]; then
  R=$TEST_SRCDIR/muster
else
  # By hand from a source tree after `bazel build` of the data deps.
  R=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
fi
TMP=$(mktemp -d "${TEST_TMPDIR:-/tmp}/muster-pkg.XXXXXX")
cleanup_hooks=()
cleanup() {  # the hooks, last added first
  local i
  for ((i = ${#cleanup_hooks[@]} - 1; i >= 0; --i)); do eval "${cleanup_hooks[i]}" || true; done
  rm -rf "$TMP"
}
trap cleanup EXIT
VERSION=$(sed -n 's/.*kVersion\[\] = "\([^"]*\)".*/\1/p' "$R/common/version.h")
API=$(sed -n 's/^#define MUSTER_C_API_VERSION \([0-9]*\).*/\1/p' "$R/client/include/muster/muster.h")
MULTIARCH=$(gcc -print-multiarch 2>/dev/null || true)
[[ -n $MULTIARCH ]] || MULTIARCH=x86_64-linux-gnu
failures=0
# A sanitizer build (--config=asan/tsan) of libmuster.so needs its runtime
# loaded first, which a plain program or Python does not do: the checks that
# load it into one are skipped there (see python/tests/run_pytest.sh).
SANITIZED=0
if [[ -e $R/client/libmuster.so.1 ]]; then
  lib_deps=$(ldd "$R/client/libmuster.so.1" 2>/dev/null || true)
  grep -qE 'lib(a|t)san' <<<"$lib_deps" && SANITIZED=1
fi

fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}
pass() { echo "ok: $*"; }
# check WHAT GOT WANT: equal strings.
check_eq() {
  if [[ $2 == "$3" ]]; then pass "$1"; else fail "$1: got '$2', want '$3'"; fi
}
# check_has WHAT TEXT REGEX: TEXT has a line matching the extended REGEX.
check_has() {
  if grep -Eq -- "$3" <<<"$2"; then pass "$1"; else fail "$1: no line matches /$3/ in:"$'\n'"$2"; fi
}
# finish NAME: the verdict; exit status 1 if any check failed.
finish() {
  if ((failures)); then
    echo "$1: $failures check(s) FAILED"
    exit 1
  fi
  echo "$1: PASS"
  exit 0
}
