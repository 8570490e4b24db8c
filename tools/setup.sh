#!/usr/bin/env bash
# Installs everything muster needs from Debian's apt repositories and checks
# the CUDA tree. Idempotent: a second run installs nothing and only reports.
#
# Usage: tools/setup.sh [--check] [--bench]
#   --check: report only, install nothing
#   --bench: also the benchmarks' peers that tools/bench_collectives.sh runs
#            (Open MPI: openmpi-bin, libopenmpi-dev)
set -euo pipefail

PACKAGES=(
  bazel-bootstrap bazel-platforms bazel-skylib
  build-essential clang clang-format libclang-rt-14-dev
  libgrpc++-dev protobuf-compiler-grpc protobuf-compiler libprotobuf-dev
  libabsl-dev catch2 libgloo-dev
  iproute2 systemd python3-torch
)

# Only with --bench: the peers of the collectives benchmark.
BENCH_PACKAGES=(openmpi-bin libopenmpi-dev)

check_only=0
for arg in "$@"; do
  case "$arg" in
    --check) check_only=1 ;;
    --bench) PACKAGES+=("${BENCH_PACKAGES[@]}") ;;
    *) echo "setup: ignoring unknown argument $arg (usage: tools/setup.sh [--check] [--bench])" >&2 ;;
  esac
done

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  if ((check_only)); then
    echo "setup: missing packages: ${missing[*]}" >&2
    exit 1
  fi
  sudo=""
  if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
  echo "setup: installing ${#missing[@]} package(s): ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  echo "setup: packages installed"
else
  echo "setup: all ${#PACKAGES[@]} apt packages present"
fi

# CUDA and NCCL are not Debian packages; only the GPU backend links them.
cuda=/usr/local/cuda
cuda_missing=()
[[ -f $cuda/include/cuda_runtime.h ]] || cuda_missing+=("$cuda/include/cuda_runtime.h")
[[ -f $cuda/include/nccl.h ]] || cuda_missing+=("$cuda/include/nccl.h")
ls $cuda/lib64/libcudart.so* >/dev/null 2>&1 || cuda_missing+=("$cuda/lib64/libcudart.so")
ls $cuda/lib/libnccl.so* $cuda/lib64/libnccl.so* >/dev/null 2>&1 || cuda_missing+=("$cuda/lib/libnccl.so")
if ((${#cuda_missing[@]})); then
  echo "setup: WARNING: CUDA/NCCL incomplete, missing: ${cuda_missing[*]}" >&2
  echo "setup: the CPU build and tests work; //backends/nccl needs the CUDA 13 toolkit and NCCL at $cuda" >&2
else
  echo "setup: CUDA/NCCL found at $cuda"
fi
