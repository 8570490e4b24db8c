#!/usr/bin/env bash
# Fuzzes the store's wire protocol parser and KvStore for SECONDS (default
# 600) with libFuzzer + ASan:
#
#   tools/fuzz.sh [SECONDS] [extra libFuzzer flags...]
#
# Builds //daemon/store:request_parser_fuzzer with --config=fuzz (clang),
# copies daemon/store/fuzz_corpus to a temporary directory (the repository
# is never modified) and runs on it with -max_len=4096. Ends with one line:
#   fuzz: <status>: <N> executions in <S>s (<E> exec/s), coverage <C> edges,
#   <F> features, corpus <K> inputs (<B> bytes), crashes: <none|FILE>
# Exit status: 0 when nothing crashed, 1 on a crash (its input is kept and
# named in the summary), 2 when the build or the setup failed.
#
# To triage a crash:
#   <fuzzer> CRASH_FILE                       # reproduce, with the stack
#   <fuzzer> -minimize_crash=1 -runs=20000 -exact_artifact_path=MIN CRASH_FILE
#   MUSTER_FUZZ_VERBOSE=1 <fuzzer> MIN         # the parsed requests
# then add MIN to daemon/store/fuzz_corpus/ so the replay test covers it.
set -uo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-600}"
[[ $# -gt 0 ]] && shift
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [[ "$seconds" -eq 0 ]]; then
  echo "usage: $0 [SECONDS] [libFuzzer flags...]" >&2
  exit 2
fi

target=//daemon/store:request_parser_fuzzer
corpus_src=daemon/store/fuzz_corpus
work="$(mktemp -d "${TMPDIR:-/tmp}/muster-fuzz.XXXXXX")"
build_log="$work/build.log"

echo "fuzz: building $target (--config=fuzz) ..."
if ! bazel build --config=fuzz "$target" >"$build_log" 2>&1; then
  # The linker's warnings about ASan's local symbols are noise; show the rest.
  grep -v "Cannot export local symbol" "$build_log" | tail -40 >&2
  echo "fuzz: build failed (full log: $build_log)" >&2
  exit 2
fi
# --config=fuzz creates no bazel-* symlinks; ask where the outputs went.
bin_dir="$(bazel info --config=fuzz bazel-bin 2>/dev/null)"
fuzzer="$bin_dir/daemon/store/request_parser_fuzzer"
if [[ ! -x "$fuzzer" ]]; then
  echo "fuzz: built, but no executable at $fuzzer" >&2
  exit 2
fi

mkdir -p "$work/corpus" "$work/artifacts"
cp -p "$corpus_src"/* "$work/corpus/"
seeds=$(find "$work/corpus" -type f | wc -l)
log="$work/fuzz.log"
echo "fuzz: running $fuzzer for ${seconds}s on $seeds seeds in $work/corpus (log: $log)"

# Progress: libFuzzer's latest status line once a minute.
(
  while sleep 60; do
    line=$(grep -aE '^#[0-9]+' "$log" 2>/dev/null | tail -1)
    [[ -n "$line" ]] && echo "fuzz: $line"
  done
) &
progress=$!

started=$SECONDS
# detect_leaks stays on; abort_on_error would skip libFuzzer's crash dump.
ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}" "$fuzzer" \
  -max_len=4096 \
  -max_total_time="$seconds" \
  -timeout=25 \
  -print_final_stats=1 \
  -artifact_prefix="$work/artifacts/" \
  "$@" \
  "$work/corpus" >"$log" 2>&1
rc=$?
ran=$((SECONDS - started))
kill "$progress" 2>/dev/null
wait "$progress" 2>/dev/null
# A crash: show libFuzzer's report (the invariant or ASan error, the stack).
if [[ $rc -ne 0 ]]; then
  grep -anE "invariant violated|==[0-9]+==ERROR|deadly signal|SUMMARY" "$log" | head -1 |
    cut -d: -f1 | { read -r n; [[ -n "$n" ]] && tail -n +"$n" "$log" | head -60 >&2; }
fi

# Numbers from libFuzzer's own report.
execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
last=$(grep -E '^#[0-9]+' "$log" | tail -1)
cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
if [[ -z "$execs" ]]; then execs=$(sed -n 's/^#\([0-9]*\).*/\1/p' <<<"$last"); fi
corpus_n=$(find "$work/corpus" -type f | wc -l)
corpus_b=$(find "$work/corpus" -type f -printf '%s\n' | awk '{s+=$1} END {print s+0}')
crashes=$(find "$work/artifacts" -type f \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' \
  -o -name 'oom-*' \) | sort)

status=ok
if [[ -n "$crashes" || $rc -ne 0 ]]; then status=CRASH; fi
crash_text=none
if [[ -n "$crashes" ]]; then crash_text="$(echo "$crashes" | tr '\n' ' ' | sed 's/ $//')"; fi
if [[ "$status" == CRASH && -z "$crashes" ]]; then crash_text="fuzzer exited $rc (see $log)"; fi

echo "fuzz: $status: ${execs:-?} executions in ${ran:-?}s (${rate:-?} exec/s), coverage ${cov:-?} edges, ${ft:-?} features, corpus $corpus_n inputs ($corpus_b bytes), crashes: $crash_text"
if [[ "$status" == CRASH ]]; then
  echo "fuzz: reproduce with: $fuzzer ${crashes%%$'\n'*}" >&2
  echo "fuzz: work directory kept: $work" >&2
  exit 1
fi
echo "fuzz: grown corpus in $work/corpus (copy new inputs to $corpus_src to keep them)"
exit 0
