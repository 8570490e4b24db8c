#!/usr/bin/env bash
# The README's first command: sets up the machine, builds muster, and runs
# the main jobs under muster-run, which starts an embedded musterd for each
# job's lifetime: the C++ example on 4 ranks (each rank's result and rank 0's
# summary), then PyTorch DistributedDataParallel on the backend "muster"
# (examples/torch_ddp.py, Debian's torch 1.13, 4 ranks: the loss and each
# rank's parameter checksum, equal on every rank).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
echo "demo: building (the first build takes a few minutes)..."
targets=(//daemon:musterd //tools:musterctl //tools:muster-run //examples:cpp_demo
         //client:libmuster.so)
if ! bazel build "${targets[@]}" >/tmp/muster-demo-build.log 2>&1; then
  grep -E "^(ERROR|FAILED)|error:" /tmp/muster-demo-build.log >&2 || tail -20 /tmp/muster-demo-build.log >&2
  echo "demo: build failed (full log: /tmp/muster-demo-build.log)" >&2
  exit 1
fi
echo "demo: running 4 ranks: bazel-bin/tools/muster-run --nproc-per-node 4 -- bazel-bin/examples/cpp_demo"
echo
bazel-bin/tools/muster-run --nproc-per-node 4 -- bazel-bin/examples/cpp_demo
echo
echo "demo: PyTorch DDP on backend \"muster\": bazel-bin/tools/muster-run --nproc-per-node 4 -- /usr/bin/python3 examples/torch_ddp.py --steps 20"
echo
PYTHONPATH="$(pwd)/python" bazel-bin/tools/muster-run --nproc-per-node 4 -- \
  /usr/bin/python3 examples/torch_ddp.py --steps 20
