#!/usr/bin/env bash
# Test of tools/bench_collectives.sh without running a benchmark:
# - --plan: the order of the runs (muster and Open MPI back to back, the
#   first of the two alternating between passes, gloo after them, idle before
#   hog in each world), and the refusal of bad --repeats and --worlds and of
#   --plan with --report;
# - --report on a --keep directory written here: medians over the passes,
#   busbw rescaled to the median p50, the ratios, each target met, missed or
#   not measured, and a result that failed --verify named.
set -uo pipefail
script="${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-muster}/tools/bench_collectives.sh"
[[ -f $script ]] || script="tools/bench_collectives.sh"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
fail=0
expect_line() {  # NAME OUTPUT LINE: OUTPUT has LINE, exactly
  if ! grep -Fxq -- "$3" <<<"$2"; then
    echo "FAIL: $1: no line '$3'"
    fail=1
  fi
}

# --plan, every option that changes the order.
got="$(bash "$script" --plan --repeats 2 --worlds "2 4" --hog 1 --shared)"
want=""
for pass in 1 2; do
  if ((pass == 1)); then pair="muster mpi"; else pair="mpi muster"; fi
  for w in 2 4; do
    for load in idle hog; do
      for system in $pair muster-shared gloo; do want+="$pass $w $load $system"$'\n'; done
    done
  done
done
if [[ $got != "${want%$'\n'}" ]]; then
  echo "FAIL: --plan --repeats 2 --worlds \"2 4\" --hog 1 --shared:"
  diff <(echo "${want%$'\n'}") <(echo "$got")
  fail=1
fi
# The defaults: 3 passes, worlds 2 and 4, idle only, no shared buffers.
got="$(bash "$script" --plan)"
want="1 2 idle muster
1 2 idle mpi
1 2 idle gloo
1 4 idle muster
1 4 idle mpi
1 4 idle gloo
2 2 idle mpi
2 2 idle muster
2 2 idle gloo
2 4 idle mpi
2 4 idle muster
2 4 idle gloo
3 2 idle muster
3 2 idle mpi
3 2 idle gloo
3 4 idle muster
3 4 idle mpi
3 4 idle gloo"
if [[ $got != "$want" ]]; then
  echo "FAIL: --plan (defaults):"
  diff <(echo "$want") <(echo "$got")
  fail=1
fi
for bad in "--repeats 0|--repeats takes a count of 1 or more, not '0'" \
  "--worlds 2,4|--worlds takes world sizes of 2 or more, not '2,4'" \
  "--worlds 1|--worlds takes world sizes of 2 or more, not '1'" \
  "--report $tmp|--plan is for a run; --report DIR runs nothing"; do
  args="${bad%%|*}"
  # shellcheck disable=SC2086
  err="$(bash "$script" --plan $args 2>&1 >/dev/null)"
  rc=$?
  if [[ $rc -ne 2 || $err != *"${bad#*|}"* ]]; then
    echo "FAIL: --plan $args: exit $rc, stderr '$err' (want exit 2 and '${bad#*|}')"
    fail=1
  fi
done
help="$(bash "$script" --help)"
expect_line "--help" "$help" "Usage: tools/bench_collectives.sh [--worlds \"2 4\"] [--repeats R] [--max-load L]"
grep -q -- "--plan        print the order of the runs" <<<"$help" ||
  { echo "FAIL: --help does not describe --plan"; fail=1; }

# --report on a directory with no run in it.
err="$(bash "$script" --report "$tmp/none" --no-doc 2>&1 >/dev/null)"
rc=$?
if [[ $rc -ne 2 || $err != *"has no results.jsonl and meta.env (made by --keep)"* ]]; then
  echo "FAIL: --report of an empty directory: exit $rc, stderr '$err'"
  fail=1
fi

# --report on a kept run: three passes, world 2, idle and hog.
keep="$tmp/kept"
mkdir -p "$keep"
row() {  # SYSTEM OP BYTES LOAD PASS P50 P99 BUSBW [VERIFIED]
  printf '{"pass":%s,"load":"%s","system":"%s","world":2,"op":"%s","bytes":%s,"p50_us":%s,"p99_us":%s,"busbw_gbps":%s,"verified":%s}\n' \
    "$5" "$4" "$1" "$2" "$3" "$6" "$7" "$8" "${9:-true}"
}
{
  # 4 B all_reduce: muster's p50 1.0, 3.0, 1.2 (median 1.2), p99 2.0.
  row muster all_reduce 4 idle 1 1.0 2.0 null
  row muster all_reduce 4 idle 2 3.0 2.0 null
  row muster all_reduce 4 idle 3 1.2 2.0 null
  for p in 1 2 3; do
    row mpi all_reduce 4 idle $p 1.0 1.0 null
    row gloo all_reduce 4 idle $p 50.0 60.0 null false
    row muster barrier 0 idle $p 1.4 1.4 null
    row mpi barrier 0 idle $p 1.0 1.0 null
    row muster all_reduce 4 hog $p 5.0 20.0 null
    row mpi all_reduce 4 hog $p 4.0 8.0 null
    row mpi all_reduce 262144 idle $p 80 90 2.5
    row muster all_gather 16777216 idle $p 1000 1100 3.0
    row mpi all_gather 16777216 idle $p 1500 1600 2.0
  done
  # 256 KiB all_reduce: pass 1 at 200 µs (1.0 GB/s), then 100 µs (2.0 GB/s).
  row muster all_reduce 262144 idle 1 200 210 1.0
  row muster all_reduce 262144 idle 2 100 110 2.0
  row muster all_reduce 262144 idle 3 100 110 2.0
} >"$keep/results.jsonl"
cat >"$keep/meta.env" <<'META'
REPORT_CMD='tools/bench_collectives.sh --hog 1'
REPORT_DATE='2026-01-01 00:00'
REPORT_LOAD_START='0.00 0.00 0.00'
REPORT_LOAD_END='0.00 0.00 0.00'
REPORT_ELAPSED='60'
REPORT_MACHINE='test machine'
REPORT_VERSIONS='test versions'
REPORT_SETUP='test setup'
REPORT_SHARED='0'
REPORT_HOG='1 busy process(es) beside each system run'
META
out="$(bash "$script" --report "$keep" --no-doc 2>"$tmp/report.err")"
rc=$?
if [[ $rc -ne 0 ]]; then
  echo "FAIL: --report exited $rc:"; cat "$tmp/report.err"; fail=1
fi
expect_line "table, 4 B all_reduce" "$out" \
  "| 2 | all_reduce | 4 B | 1.20 | 50.0 | 1.00 | - | - | - | - | - | 0.024x | 1.20x |"
expect_line "table, 256 KiB all_reduce (busbw from the median p50)" "$out" \
  "| 2 | all_reduce | 256 KiB | 100.0 | n/a | 80.0 | 2.00 | - | 2.50 | - | 0.80x | - | 1.25x |"
expect_line "latency, idle" "$out" \
  "| 2 | idle | all_reduce 4 B | 1.20 / 2.00 | 1.00 / 1.00 | 50.0 / 60.0 | 1.20x | 2.00x |"
expect_line "latency, hog" "$out" \
  "| 2 | hog | all_reduce 4 B | 5.00 / 20.0 | 4.00 / 8.00 | n/a | 1.25x | 2.50x |"
expect_line "target p50 met" "$out" \
  "| 4 B all_reduce p50 <= 1.5x Open MPI | 2 | **met** | 1.20 vs 1.00 µs = 1.20x |"
expect_line "target p99 missed" "$out" \
  "| 4 B all_reduce p99 <= 1.5x Open MPI | 2 | **missed** | 2.00 vs 1.00 µs = 2.00x |"
expect_line "target barrier" "$out" \
  "| barrier p50 <= 1.5x Open MPI | 2 | **met** | 1.40 vs 1.00 µs = 1.40x |"
expect_line "target under load" "$out" \
  "| 4 B all_reduce p99 under load <= 2x Open MPI under load | 2 | **missed** | 20.0 vs 8.00 µs = 2.50x |"
expect_line "target against idle, at the bound" "$out" \
  "| 4 B all_reduce p99 under load <= 10x its idle p99 | 2 | **met** | 20.0 vs 2.00 µs = 10.00x |"
expect_line "target not measured" "$out" \
  "| barrier p50 under load <= 2x Open MPI under load | 2 | not measured | |"
expect_line "target busbw missed" "$out" \
  "| all_reduce busbw 256 KiB >= 1x Open MPI | 2 | **missed** | 2.00 vs 2.50 GB/s = 0.80x (muster p50 100.0..200.0 µs over 3 passes) |"
expect_line "target busbw met at the bound" "$out" \
  "| all_gather busbw 16 MiB >= 1.5x Open MPI | 2 | **met** | 3.00 vs 2.00 GB/s = 1.50x (muster p50 1000..1000 µs over 3 passes) |"
expect_line "wrong results named" "$out" \
  "- **Wrong results** (--verify): gloo all_reduce 4 B world 2."
if grep -q "written into" <<<"$out"; then
  echo "FAIL: --report --no-doc wrote the doc"; fail=1
fi

if ((fail)); then
  echo "--- report:"; echo "$out"
  exit 1
fi
echo "bench_collectives.sh: --plan, its refusals and --report checked"
