#!/usr/bin/env bash
# gpu_check.sh: everything to run on a machine with NVIDIA GPUs, in one go
# and within about 11 minutes (every phase has its own time limit):
#
#   1. build   (if bazel is present and no --prebuilt): the GPU binaries and
#              tests with -c opt (override with BAZEL_FLAGS)            <= 170 s
#   2. info    nvidia-smi and muster-gpu-info                             <= 20 s
#   3. tests   the gpu-tagged tests: bazel test --test_tag_filters=gpu, or
#              the prebuilt test binaries directly                       <= 170 s
#   4. bench   muster-bench collectives --device cuda (in-process NCCL vs
#              through musterd, all_reduce 4 B .. 256 MiB)               <= 110 s
#   5. torch   the torch.distributed backend "muster" on CUDA tensors: builds
#              the backend against the machine's torch (python3, or
#              $GPU_PYTHON; needs pybind11 and ninja), then one rank per GPU
#              under muster-run runs tools/gpu_torch_check.py: collectives
#              checked on the host, a DDP step, all_reduce latency vs torch's
#              own nccl backend                                          <= 200 s
#   6. elastic examples/elastic_train.py on CUDA tensors, undisturbed and
#              with rank 0 killed and replaced (new NCCL communicators for
#              the new epoch): the same final parameters                 <= 120 s
#
# and writes a Markdown summary (--out FILE, default gpu_check_summary.md)
# with the test results and the side-by-side benchmark table with ratios.
#
# Usage:
#   tools/gpu_check.sh [--out FILE] [--prebuilt DIR] [--bench-args "ARGS"]
#   tools/gpu_check.sh --pack DIR      # here, without a GPU: build the
#                                      # binaries into DIR for --prebuilt
#
# --prebuilt DIR is a tree laid out like bazel-bin (DIR/daemon/musterd,
# DIR/tools/{musterctl,muster-bench,muster-bench-gpu,muster-run},
# DIR/client/libmuster.so, DIR/backends/nccl/{muster-gpu-info,gpu_smoke_test,
# libmuster_cuda.so}, DIR/test/{muster-gpu-rank,gpu_collectives_test,
# gpu_abort_test} and _solib_k8/); --pack
# makes one, with DIR/syslib/ holding the Debian libraries the binaries link
# (gRPC, protobuf, Abseil, Gloo, ...), used only where the machine lacks them.
# The CUDA/NCCL libraries come from /usr/local/cuda (or the machine's own).
#
# Exit status: 0 when every test passed and the benchmark ran and verified;
# 1 when something failed; 2 when there is no usable GPU (with a message
# saying why) or for bad usage.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
ROOT=$(pwd)

OUT=gpu_check_summary.md
PREBUILT=""
PACK=""
BENCH_ARGS=""
BAZEL_FLAGS=${BAZEL_FLAGS:--c opt}
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=$2; shift 2 ;;
    --out=*) OUT=${1#--out=}; shift ;;
    --prebuilt) PREBUILT=$2; shift 2 ;;
    --prebuilt=*) PREBUILT=${1#--prebuilt=}; shift ;;
    --pack) PACK=$2; shift 2 ;;
    --pack=*) PACK=${1#--pack=}; shift ;;
    --bench-args) BENCH_ARGS=$2; shift 2 ;;
    --bench-args=*) BENCH_ARGS=${1#--bench-args=}; shift ;;
    -h|--help) sed -n '2,40p' "$0"; exit 0 ;;
    *) echo "gpu_check: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$OUT" in /*) ;; *) OUT="$ROOT/$OUT" ;; esac

TARGETS=(//backends/nccl:muster-gpu-info //test:muster-gpu-rank
         //tools:muster-bench-gpu //backends/nccl:gpu_smoke_test
         //test:gpu_collectives_test //test:gpu_abort_test
         //daemon:musterd //tools:musterctl //tools:muster-bench
         //tools:muster-run //client:libmuster.so)
FILES=(backends/nccl/muster-gpu-info test/muster-gpu-rank
       tools/muster-bench-gpu backends/nccl/gpu_smoke_test
       test/gpu_collectives_test test/gpu_abort_test
       backends/nccl/libmuster_cuda.so daemon/musterd tools/musterctl tools/muster-bench
       tools/muster-run client/libmuster.so)
# Where each GPU test lives (bazel-bin and bazel-testlogs layout).
declare -A TEST_DIR=([gpu_smoke_test]=backends/nccl [gpu_collectives_test]=test
                     [gpu_abort_test]=test)

say() { echo "gpu_check: $*" >&2; }

# --pack: build and copy (no GPU needed).
if [ -n "$PACK" ]; then
  command -v bazel >/dev/null || { say "--pack needs bazel"; exit 2; }
  # shellcheck disable=SC2086
  bazel build $BAZEL_FLAGS "${TARGETS[@]}" || exit 1
  # shellcheck disable=SC2086
  BIN=$(bazel info $BAZEL_FLAGS bazel-bin 2>/dev/null) || exit 1
  for f in "${FILES[@]}"; do
    mkdir -p "$PACK/$(dirname "$f")" && cp -f "$BIN/$f" "$PACK/$f" || exit 1
  done
  # Test binaries link the project's libraries dynamically ($ORIGIN-relative);
  # CUDA and NCCL come from /usr/local/cuda on the GPU machine.
  rm -rf "$PACK/_solib_k8" && mkdir -p "$PACK/_solib_k8"
  for d in "$BIN"/_solib_k8/*; do
    case "$d" in *local_Ucuda*) continue ;; esac
    cp -rL "$d" "$PACK/_solib_k8/" || exit 1
  done
  # The Debian libraries they link (not glibc, libstdc++ or CUDA: those are
  # the machine's), for a GPU machine that lacks them.
  rm -rf "$PACK/syslib" && mkdir -p "$PACK/syslib"
  for f in "${FILES[@]}"; do
    LD_LIBRARY_PATH="$BIN/_solib_k8" ldd "$BIN/$f" 2>/dev/null | awk '$3 ~ /^\// {print $3}'
  done | sort -u | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libstdc++*|libgcc_s*) ;;
      libcuda*|libnccl*|libcudart*|libnvidia*) ;;
      *) case "$lib" in "$BIN"/*) ;; *) cp -L "$lib" "$PACK/syslib/" || exit 1 ;; esac ;;
    esac
  done
  say "binaries in $PACK; on the GPU machine: tools/gpu_check.sh --prebuilt $PACK"
  exit 0
fi

# 0. Is there a GPU at all? (before spending minutes building)
if command -v nvidia-smi >/dev/null; then
  if ! SMI_LIST=$(timeout 20 nvidia-smi -L 2>&1) || ! grep -q '^GPU ' <<<"$SMI_LIST"; then
    say "no GPU: nvidia-smi -L found no device (${SMI_LIST:-no output})"
    exit 2
  fi
elif ! ls /dev/nvidia[0-9]* >/dev/null 2>&1; then
  say "no GPU: neither nvidia-smi nor /dev/nvidia* on this machine"
  exit 2
fi

STATUS=0
LOG=$(mktemp -d /tmp/gpu-check-XXXXXX)
START=$(date +%s)
phase() { say "== $1 ($(($(date +%s) - START)) s so far)"; }

# 1. Build.
if [ -n "$PREBUILT" ]; then
  BIN=$(cd "$PREBUILT" && pwd) || { say "--prebuilt $PREBUILT: no such folder"; exit 2; }
  BUILD_NOTE="prebuilt binaries from $BIN"
  # The machine's own libraries first; the packed Debian ones where it has none.
  export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}:$BIN/syslib
elif command -v bazel >/dev/null; then
  phase "build"
  # shellcheck disable=SC2086
  if ! timeout 170 bazel build $BAZEL_FLAGS "${TARGETS[@]}" >"$LOG/build.txt" 2>&1; then
    tail -30 "$LOG/build.txt" >&2
    say "the build failed or took over 170 s (log above)"
    exit 1
  fi
  # shellcheck disable=SC2086
  BIN=$(bazel info $BAZEL_FLAGS bazel-bin 2>/dev/null)
  BUILD_NOTE="bazel build $BAZEL_FLAGS (bazel-bin: $BIN)"
else
  say "no bazel here: pass --prebuilt DIR (made elsewhere with tools/gpu_check.sh --pack DIR)"
  exit 2
fi
for f in "${FILES[@]}"; do
  [ -x "$BIN/$f" ] || { say "missing $BIN/$f"; exit 2; }
done

# 2. Machine.
phase "info"
{
  timeout 20 nvidia-smi 2>&1 || echo "(nvidia-smi unavailable)"
} >"$LOG/smi.txt"
timeout 20 "$BIN/backends/nccl/muster-gpu-info" >"$LOG/info.txt" 2>&1
cat "$LOG/info.txt" >&2
DEVICES=$(awk '$1 == "devices" {print $2}' "$LOG/info.txt")
if [ -z "$DEVICES" ] || [ "$DEVICES" = 0 ]; then
  say "no usable GPU: muster-gpu-info says: $(grep devices "$LOG/info.txt")"
  exit 2
fi

# 3. Tests.
phase "tests"
TESTS_MD="$LOG/tests.md"
: >"$TESTS_MD"
if [ -z "$PREBUILT" ]; then
  # shellcheck disable=SC2086
  timeout 170 bazel test $BAZEL_FLAGS --test_tag_filters=gpu --build_tests_only --test_timeout=150 \
    --test_output=errors --test_summary=short //backends/nccl/... //test/... 2>&1 |
    python3 tools/test_summary.py "$(bazel info $BAZEL_FLAGS bazel-testlogs 2>/dev/null)" \
      >"$LOG/tests.txt" 2>&1
  rc=${PIPESTATUS[0]}
  summary_rc=${PIPESTATUS[1]}
  # shellcheck disable=SC2086
  TESTLOGS=$(bazel info $BAZEL_FLAGS bazel-testlogs 2>/dev/null)
  for t in gpu_smoke_test gpu_collectives_test gpu_abort_test; do
    cp -f "$TESTLOGS/${TEST_DIR[$t]}/$t/test.log" "$LOG/$t.log" 2>/dev/null
  done
  grep -E '^//|^skipped:|^tests:' "$LOG/tests.txt" | sed 's/^/    /' >>"$TESTS_MD"
  if [ "$rc" != 0 ] || [ "$summary_rc" != 0 ]; then STATUS=1; fi
else
  # The test binaries find their helpers relative to the working folder.
  for name in gpu_smoke_test gpu_collectives_test gpu_abort_test; do
    arg=()
    case "$name" in
      gpu_collectives_test) arg=(collectives) ;;
      gpu_abort_test) arg=(abort) ;;
    esac
    (cd "$BIN" && timeout 150 "./${TEST_DIR[$name]}/$name" "${arg[@]}") >"$LOG/$name.log" 2>&1
    rc=$?
    if grep -q MUSTER_TEST_SKIPPED "$LOG/$name.log"; then
      result="SKIPPED ($(grep -m1 MUSTER_TEST_SKIPPED "$LOG/$name.log"))"
      STATUS=1  # a GPU machine must not skip
    elif [ "$rc" = 0 ]; then
      result=PASSED
    elif [ "$rc" = 124 ]; then
      result="TIMEOUT (150 s)"; STATUS=1
    else
      result="FAILED (exit $rc)"; STATUS=1
    fi
    echo "    $name: $result" >>"$TESTS_MD"
  done
fi
cat "$TESTS_MD" >&2
for t in gpu_smoke_test gpu_collectives_test gpu_abort_test; do
  if [ -f "$LOG/$t.log" ] && grep -q MUSTER_TEST_SKIPPED "$LOG/$t.log"; then STATUS=1; fi
done

# 4. Benchmark.
phase "benchmark"
BENCH_CMD="$BIN/tools/muster-bench collectives --device cuda --bytes 4,4K,256K,4M,64M,256M $BENCH_ARGS"
# shellcheck disable=SC2086
timeout 110 $BENCH_CMD >"$LOG/bench.txt" 2>"$LOG/bench.err"
BENCH_RC=$?
cat "$LOG/bench.txt"
[ "$BENCH_RC" = 0 ] || { STATUS=1; tail -20 "$LOG/bench.err" >&2; }

# 5. torch.distributed backend "muster" on CUDA tensors.
phase "torch"
GPU_PYTHON=${GPU_PYTHON:-python3}
TORCH_RC=0
export MUSTER_LIBRARY="$BIN/client/libmuster.so"
export MUSTER_TORCH_BUILD_DIR="$LOG/torch-build"
export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
if ! timeout 120 "$GPU_PYTHON" -c 'import muster.torch as m; m.build()' >"$LOG/torch_build.txt" 2>&1; then
  TORCH_RC=1
  tail -20 "$LOG/torch_build.txt" >&2
  say "building the torch backend failed (log above)"
else
  NGPU=$(timeout 20 "$GPU_PYTHON" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
  [ "${NGPU:-0}" -ge 1 ] || NGPU=1
  MUSTER_SOCKET="$LOG/nobody.sock" timeout 80 "$BIN/tools/muster-run" --nproc-per-node "$NGPU" \
    --musterd "$BIN/daemon/musterd" -- "$GPU_PYTHON" "$ROOT/tools/gpu_torch_check.py" \
    >"$LOG/torch.txt" 2>&1
  TORCH_RC=$?
fi
grep -E 'RESULT|gpu_torch_check' "$LOG/torch.txt" 2>/dev/null >&2
[ "$TORCH_RC" = 0 ] || { STATUS=1; tail -30 "$LOG/torch.txt" >&2 2>/dev/null; }

# 6. Elastic: a rank replaced mid-training on CUDA tensors. One rank per
# GPU (NCCL takes one rank per GPU) under --restart-policy rank; rank 0 kills
# itself after step 3, its replacement joins epoch 1, musterd makes the new
# epoch's NCCL communicators; the parameters must end as in an undisturbed run.
phase "elastic"
ELASTIC_RC=0
if [ "$TORCH_RC" = 0 ]; then
  for run in calm killed; do
    extra=()
    [ "$run" = killed ] && extra=(env ELASTIC_KILL_RANK=0 ELASTIC_KILL_STEP=3)
    MUSTER_SOCKET="$LOG/nobody.sock" ELASTIC_DEVICE=cuda ELASTIC_STEPS=8 timeout 60 \
      "${extra[@]}" "$BIN/tools/muster-run" --nproc-per-node "$NGPU" --restart-policy rank \
      --max-restarts 1 --musterd "$BIN/daemon/musterd" -- "$GPU_PYTHON" \
      "$ROOT/examples/elastic_train.py" >"$LOG/elastic-$run.txt" 2>&1 || ELASTIC_RC=1
  done
  calm=$(grep -ho 'FINAL [0-9a-f]*' "$LOG/elastic-calm.txt" | sort -u)
  killed=$(grep -ho 'FINAL [0-9a-f]*' "$LOG/elastic-killed.txt" | sort -u)
  if [ -z "$calm" ] || [ "$calm" != "$killed" ] || ! grep -q 'epoch": 1' "$LOG/elastic-killed.txt"; then
    ELASTIC_RC=1
  fi
else
  ELASTIC_RC=1
fi
[ "$ELASTIC_RC" = 0 ] || { STATUS=1; tail -20 "$LOG/elastic-killed.txt" >&2 2>/dev/null; }

# Summary.
{
  echo "# GPU check"
  echo
  echo "$(date -u '+%Y-%m-%d %H:%M UTC') on $(hostname), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'); $BUILD_NOTE."
  echo
  echo "## Machine"
  echo
  echo '```'
  grep -E '^GPU |Driver Version|CUDA Version' "$LOG/smi.txt" | head -20
  cat "$LOG/info.txt"
  echo '```'
  echo
  echo "## Tests (gpu-tagged)"
  echo
  cat "$TESTS_MD"
  for t in gpu_collectives_test gpu_abort_test; do
    if [ -f "$LOG/$t.log" ]; then
      echo
      echo "$t: $(grep -c ' PASS' "$LOG/$t.log") PASS lines, $(grep -c ' FAIL' "$LOG/$t.log") FAIL lines"
      if grep -q ' FAIL' "$LOG/$t.log"; then
        echo
        grep ' FAIL' "$LOG/$t.log" | head -20 | sed 's/^/    /'
      fi
    fi
  done
  echo
  echo "## Benchmark: all_reduce, in-process NCCL vs through musterd"
  echo
  echo "\`muster-bench collectives --device cuda --bytes 4,4K,256K,4M,64M,256M $BENCH_ARGS\` (exit $BENCH_RC)"
  echo
  if grep -q '^|' "$LOG/bench.txt"; then
    grep -v '^{' "$LOG/bench.txt" | sed '/^$/N;/^\n$/D'
  else
    echo "no table (the benchmark failed or timed out):"
    echo
    tail -20 "$LOG/bench.err" | sed 's/^/    /'
  fi
  echo
  echo "JSON lines:"
  echo
  grep '^{' "$LOG/bench.txt" | sed 's/^/    /'
  echo
  echo "## torch backend \"muster\" on CUDA tensors (tools/gpu_torch_check.py, exit $TORCH_RC)"
  echo
  if [ -f "$LOG/torch.txt" ]; then
    grep -E 'RESULT|gpu_torch_check' "$LOG/torch.txt" | sed 's/^/    /'
    [ "$TORCH_RC" = 0 ] || tail -30 "$LOG/torch.txt" | sed 's/^/    /'
  else
    tail -20 "$LOG/torch_build.txt" | sed 's/^/    /'
  fi
  echo
  echo "## Elastic: rank 0 replaced mid-training on CUDA tensors (exit $ELASTIC_RC)"
  echo
  for run in calm killed; do
    [ -f "$LOG/elastic-$run.txt" ] && grep -E 'FINAL|RECONFIGURED|KILL|restarting' \
      "$LOG/elastic-$run.txt" | sed "s/^/    $run: /"
  done
  echo
  echo "## Verdict"
  echo
  if [ "$STATUS" = 0 ]; then echo "everything passed"; else echo "FAILED: see above (logs in $LOG)"; fi
} >"$OUT"
say "summary written to $OUT (logs in $LOG); $(($(date +%s) - START)) s"
exit "$STATUS"
