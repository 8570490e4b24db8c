#!/usr/bin/env bash
# Installs everything muster needs from Debian's apt repositories and checks
# the CUDA tree. Idempotent: a second run installs nothing and only reports.
#
# Also creates the virtual environment with torch 2.x from the package index
# that the Python tests use beside Debian's torch 1.13 (once per machine: the
# CUDA build of torch is about 3 GB with its nvidia-* wheels).
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
  iproute2 systemd libssl-dev openssl util-linux
  python3-torch libtorch-dev pybind11-dev ninja-build
  python3-numpy python3-pytest python3-setuptools python3-wheel python3-venv python3-pip
  cmake pkg-config
  # the etcd store backend: the server (tests, tools/etcd_cluster.sh) and the
  # .proto files //third_party/etcd generates its C++ client from
  etcd-server golang-etcd-server-dev golang-github-gogo-protobuf-dev
  golang-github-gogo-googleapis-dev
)

# torch 2.x for the Python tests and benchmarks (MUSTER_TORCH_VENV moves it).
TORCH_VENV=${MUSTER_TORCH_VENV:-/opt/muster/torch-venv}
TORCH_SPEC="torch==2.11.*"
VENV_PACKAGES=(numpy pytest ninja pybind11 setuptools wheel)

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

# The torch 2.x virtual environment (reused once it has torch 2.11).
if "$TORCH_VENV/bin/python" -c 'import torch, numpy, pytest, ninja; assert torch.__version__.startswith("2.11")' 2>/dev/null; then
  echo "setup: torch $("$TORCH_VENV/bin/python" -c 'import torch; print(torch.__version__)') venv at $TORCH_VENV"
elif ((check_only)); then
  echo "setup: missing the torch 2.x venv at $TORCH_VENV" >&2
  exit 1
else
  echo "setup: creating the torch 2.x venv at $TORCH_VENV (once per machine; about 3 GB from the package index)"
  mkdir -p "$(dirname "$TORCH_VENV")"
  /usr/bin/python3 -m venv "$TORCH_VENV"
  if ! "$TORCH_VENV/bin/pip" install -q --progress-bar off "$TORCH_SPEC" "${VENV_PACKAGES[@]}"; then
    echo "setup: ERROR: could not install $TORCH_SPEC into $TORCH_VENV (no access to the package index?)" >&2
    exit 1
  fi
  echo "setup: torch venv ready at $TORCH_VENV"
fi
