#!/usr/bin/env bash
# Smoke test of `muster-bench store --quick --no-torch`: every workload runs
# briefly against a musterd the benchmark starts itself; the run must exit 0
# and print every row, as a table and as JSON lines. Then
# `muster-run --nproc-per-node 2 -- muster-bench collectives --quick --verify`:
# every op at every quick size must run and check correct on both ranks;
# --touch with --verify; bench-shm-rounds at world 2 and 3.
set -uo pipefail
bench="${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-muster}/tools/muster-bench"
[[ -x "$bench" ]] || bench="tools/muster-bench"
run="${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-muster}/tools/muster-run"
[[ -x "$run" ]] || run="tools/muster-run"
fail=0
errfile="${TEST_TMPDIR:-/tmp}/muster-bench-smoke.stderr"
check() {  # check NAME OUTPUT REGEX
  if ! grep -Eq -- "$3" <<<"$2"; then
    echo "FAIL: $1: no line matching /$3/"
    fail=1
  fi
}

out="$("$bench" store --quick --no-torch 2>"$errfile")"
rc=$?
echo "$out"
if [[ $rc -ne 0 ]]; then
  echo "FAIL: muster-bench store --quick --no-torch exited $rc; stderr:"
  cat "$errfile"
  fail=1
fi
for op in set get add compare_set check wait delete_key num_keys; do
  check "latency $op" "$out" "^$op +[0-9.]+ +[0-9.]+ +[0-9.]+ \| +- +- +- \|"
done
check "throughput 1" "$out" "^1 +[0-9]+ "
check "throughput 8" "$out" "^8 +[0-9]+ "
check "barrier 64" "$out" "^64 +[0-9.]+ \[[0-9.]+\.\.[0-9.]+\] [0-9.]+ [0-9]+/[0-9]+ \|"
check "connections" "$out" "^musterd +256 +0 "
check "targets" "$out" "^n/a +4096 connections"
check "done" "$out" "^done in .* ok$"
check "progress" "$(cat "$errfile")" "^muster-bench: latency get on musterd "

json="$("$bench" store --quick --no-torch --json --ops get --clients 2 --barrier 4 \
          --connections 16 2>/dev/null)"
rc=$?
echo "$json"
[[ $rc -eq 0 ]] || { echo "FAIL: --json run exited $rc"; fail=1; }
check "json meta" "$json" '^\{"type":"meta",'
check "json latency" "$json" '^\{"type":"latency","op":"get","musterd":\{"p50_us":'
check "json throughput" "$json" '^\{"type":"throughput","clients":2,'
check "json barrier" "$json" '^\{"type":"barrier","n":4,'
check "json connections" "$json" '^\{"type":"connections","n":16,.*"connect_errors":0,"add_errors":0'
check "json done" "$json" '^\{"type":"done",.*"ok":true'

# Collectives: 2 ranks under muster-run with its own embedded musterd (the
# socket in MUSTER_SOCKET answers nothing, so muster-run starts one).
nodaemon="${TEST_TMPDIR:-/tmp}/no-daemon-$$.sock"
coll="$(MUSTER_SOCKET="$nodaemon" timeout 60 "$run" --nproc-per-node 2 -- \
          "$bench" collectives --quick --verify 2>"$errfile")"
rc=$?
echo "$coll"
if [[ $rc -ne 0 ]]; then
  echo "FAIL: muster-run -- muster-bench collectives --quick --verify exited $rc; stderr:"
  cat "$errfile"
  fail=1
fi
for op in all_reduce broadcast all_gather reduce_scatter; do
  for size in "4 B|8 B" "4 KiB" "256 KiB" "5242884 B|5 MiB"; do
    check "collectives $op $size" "$coll" \
      "^\[rank 0\] $op +($size) +10 +2( +[0-9.]+){6} +[0-9.]+/[0-9.]+ +ok$"
  done
done
check "collectives barrier" "$coll" "^\[rank 0\] barrier +- +10 +2( +[0-9.]+){4} +- +- +[0-9.]+/[0-9.]+ +ok$"

cjson="$(MUSTER_SOCKET="$nodaemon" timeout 60 "$run" --nproc-per-node 2 -- \
           "$bench" collectives --json --verify --op all_reduce,barrier --bytes 4K --iters 5 \
           2>"$errfile")"
rc=$?
echo "$cjson"
[[ $rc -eq 0 ]] || { echo "FAIL: collectives --json run exited $rc"; cat "$errfile"; fail=1; }
check "collectives json all_reduce" "$cjson" \
  '^\[rank 0\] \{"system":"muster","op":"all_reduce","bytes":4096,"world":2,"dtype":"float32","iters":5,.*"p50_us":[0-9.e+-]+,.*"busbw_gbps":[0-9.e+-]+,"verified":true'
check "collectives json barrier" "$cjson" \
  '^\[rank 0\] \{"system":"muster","op":"barrier","bytes":0,"world":2,.*"busbw_gbps":null,"verified":true'

# --touch (inputs rewritten before each timed iteration) keeps results right.
tout="$(MUSTER_SOCKET="$nodaemon" timeout 60 "$run" --nproc-per-node 2 -- \
          "$bench" collectives --json --verify --touch --op broadcast,all_gather --bytes 300K \
          --iters 5 2>"$errfile")"
rc=$?
echo "$tout"
[[ $rc -eq 0 ]] || { echo "FAIL: collectives --touch run exited $rc"; cat "$errfile"; fail=1; }
check "collectives --touch broadcast" "$tout" '"op":"broadcast",.*"verified":true'
check "collectives --touch all_gather" "$tout" '"op":"all_gather",.*"verified":true'
"$bench" collectives --touch --trace-compare >/dev/null 2>"$errfile"
rc=$?
[[ $rc -eq 2 ]] || { echo "FAIL: --touch --trace-compare exited $rc, not 2"; fail=1; }
check "--touch --trace-compare refused" "$(cat "$errfile")" "do not go together"

# The shm layer alone: both ops at world 2 and 3, and bad usage refused.
rounds="${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-muster}/tools/bench-shm-rounds"
[[ -x "$rounds" ]] || rounds="tools/bench-shm-rounds"
for w in 2 3; do
  rout="$(timeout 60 "$rounds" --world "$w" --iters 200 --passes 2 --json 2>"$errfile")"
  rc=$?
  echo "$rout"
  [[ $rc -eq 0 ]] || { echo "FAIL: bench-shm-rounds --world $w exited $rc"; cat "$errfile"; fail=1; }
  for op in barrier all_reduce; do
    check "shm rounds $op world $w" "$rout" \
      "^\\{\"system\":\"muster-shm\",\"op\":\"$op\",\"world\":$w,.*\"pass\":2,\"iters\":200,\"p50_us\":[0-9.]+"
  done
done
"$rounds" --op gather >/dev/null 2>"$errfile"
rc=$?
[[ $rc -eq 2 ]] || { echo "FAIL: bench-shm-rounds --op gather exited $rc, not 2"; fail=1; }
check "shm rounds bad op" "$(cat "$errfile")" "unknown --op 'gather'"

# The copy floor: every pattern and method at world 2 and 3 (allgather-push
# over CMA only; each run checks the bytes it copied and exits non-zero if
# they are wrong), and bad usage refused with the reason.
floor="${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-muster}/tools/bench-copy-floor"
[[ -x "$floor" ]] || floor="tools/bench-copy-floor"
for w in 2 3; do
  for p in gather allgather allgather-push broadcast private; do
    for m in cma shared; do
      [[ $p == allgather-push && $m == shared ]] && continue  # CMA only: refused below
      fout="$(timeout 60 "$floor" --world "$w" --pattern "$p" --method "$m" --bytes 64K,1M \
        --iters 20 --chunk 16K 2>"$errfile")"
      rc=$?
      [[ $rc -eq 0 ]] || { echo "FAIL: bench-copy-floor $w $p $m exited $rc"; cat "$errfile"; fail=1; }
      for b in 65536 1048576; do
        check "copy floor $w $p $m $b" "$fout" \
          "^\\{\"world\":$w,\"pattern\":\"$p\",\"method\":\"$m\",.*\"bytes\":$b,\"chunk\":16384,\"iters\":20,\"p50_us\":[0-9.e+]+"
      done
    done
  done
done
# The all_reduce floor (bytes a multiple of 4 x world), over CMA and as
# AllocShared buffers allow: each run checks the sums every rank ends with.
for w in 2 3; do
  for m in cma shared; do
    fout="$(timeout 60 "$floor" --world "$w" --pattern allreduce --method "$m" --bytes 48K,768K \
      --iters 20 --chunk 16K 2>"$errfile")"
    rc=$?
    [[ $rc -eq 0 ]] || { echo "FAIL: bench-copy-floor $w allreduce $m exited $rc"; cat "$errfile"; fail=1; }
    check "copy floor $w allreduce $m" "$fout" \
      "^\\{\"world\":$w,\"pattern\":\"allreduce\",\"method\":\"$m\",.*\"bytes\":786432,\"chunk\":16384,\"iters\":20,\"p50_us\":[0-9.e+]+"
  done
done
# --nt: the push's own copies, the private copy and the all_gather read
# through a cached block with non-temporal stores (x86-64), checked like the
# rest.
if [[ $(uname -m) == x86_64 ]]; then
  for p in allgather-push private allgather; do
    fout="$(timeout 60 "$floor" --world 2 --pattern $p --nt --bytes 64K,1M --iters 20 \
      2>"$errfile")"
    rc=$?
    [[ $rc -eq 0 ]] || { echo "FAIL: bench-copy-floor $p --nt exited $rc"; cat "$errfile"; fail=1; }
    check "copy floor $p --nt" "$fout" "\"pattern\":\"$p\".*\"bytes\":1048576.*\"nt\":true\\}\$"
  done
fi
for bad in "--iters 5000|over the 4096 timed iterations" "--chunk 4X|--chunk wants one size" \
  "--bytes 1K,2K --iters 1,2,3|one count, or one per size" "--world 1|bad --world" \
  "--pattern allgather-push --method shared|writes with CMA: --method cma" \
  "--pattern allgather --method shared --nt|--nt is for --pattern allgather-push, private or allgather --method cma" \
  "--pattern gather --nt|--nt is for --pattern allgather-push, private or allgather --method cma" \
  "--pattern allreduce --touch|--touch would change the sums" \
  "--world 3 --pattern allreduce --bytes 64K|a multiple of 4 x 3"; do
  # shellcheck disable=SC2086
  timeout 60 "$floor" ${bad%%|*} >/dev/null 2>"$errfile"
  rc=$?
  [[ $rc -eq 2 ]] || { echo "FAIL: bench-copy-floor ${bad%%|*} exited $rc, not 2"; fail=1; }
  check "copy floor refuses ${bad%%|*}" "$(cat "$errfile")" "${bad#*|}"
done

if [[ $fail -ne 0 ]]; then exit 1; fi
echo "PASS"
