#!/usr/bin/env python3
"""Times a 4-rank PyTorch gloo init_process_group two ways, in one run:

  muster:  muster-run --nproc-per-node 4 -- python3 examples/torch_gloo.py
           (musterd's store listens before any rank starts; every rank is a
           store client through PyTorch's agent-store mode)
  torch:   4 ranks with init_method=tcp://127.0.0.1:PORT (rank 0 hosts the
           TCPStore; the others find it not listening yet and retry)

For each trial it records the slowest rank's init_process_group time, and
prints the median of each and the ratio. Usage (after bazel build
//tools:muster-run //daemon:musterd):

  /usr/bin/python3 tools/bench_torch_init.py [--trials 9] [--world 4] [--json]
"""
import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "examples", "torch_gloo.py")
MUSTER_RUN = os.path.join(ROOT, "bazel-bin", "tools", "muster-run")
INIT = re.compile(r"init_ms=([0-9.]+)")
SPAN = re.compile(r"init_start=([0-9.]+) init_end=([0-9.]+)")


def after_last_arrival(text):
    """ms from the last rank entering init_process_group to the last leaving."""
    spans = [(float(a), float(b)) for a, b in SPAN.findall(text)]
    return (max(b for _, b in spans) - max(a for a, _ in spans)) * 1000


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def muster_trial(world):
    env = dict(os.environ, MUSTER_SOCKET="/nonexistent/muster-bench.sock")
    out = subprocess.run([MUSTER_RUN, "--nproc-per-node", str(world), "--",
                          "/usr/bin/python3", SCRIPT], env=env, capture_output=True,
                         text=True, timeout=300)
    if out.returncode != 0:
        sys.exit(f"muster-run failed:\n{out.stdout}\n{out.stderr}")
    times = [float(x) for x in INIT.findall(out.stdout)]
    assert len(times) == world, out.stdout
    return times, after_last_arrival(out.stdout)


def torch_trial(world):
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world),
                   INIT_METHOD=f"tcp://127.0.0.1:{port}")
        for k in ("TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT"):
            env.pop(k, None)
        procs.append(subprocess.Popen(["/usr/bin/python3", SCRIPT], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    times = []
    text = ""
    for p in procs:
        out, err = p.communicate(timeout=300)
        if p.returncode != 0:
            sys.exit(f"torch rank failed:\n{out}\n{err}")
        times += [float(x) for x in INIT.findall(out)]
        text += out
    assert len(times) == world
    return times, after_last_arrival(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=9)
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not os.access(MUSTER_RUN, os.X_OK):
        sys.exit("build first: bazel build //tools:muster-run //daemon:musterd")
    muster, torch, muster_tail, torch_tail = [], [], [], []
    for i in range(args.trials):
        print(f"bench_torch_init: trial {i + 1}/{args.trials}", file=sys.stderr, flush=True)
        times, tail = muster_trial(args.world)
        muster.append(times)
        muster_tail.append(tail)
        times, tail = torch_trial(args.world)
        torch.append(times)
        torch_tail.append(tail)
    # Per trial, the slowest rank (the job is initialized when it is).
    m = statistics.median(max(x) for x in muster)
    t = statistics.median(max(x) for x in torch)
    # Over every rank of every trial.
    m_all = statistics.median(v for x in muster for v in x)
    t_all = statistics.median(v for x in torch for v in x)
    result = {"bench": "torch_init", "world": args.world, "trials": args.trials,
              "muster_median_ms": round(m, 1), "torch_tcp_median_ms": round(t, 1),
              "muster_median_all_ranks_ms": round(m_all, 1),
              "torch_tcp_median_all_ranks_ms": round(t_all, 1),
              "muster_after_last_arrival_ms": round(statistics.median(muster_tail), 1),
              "torch_tcp_after_last_arrival_ms": round(statistics.median(torch_tail), 1),
              "speedup": round(t / m, 1), "muster_ms": muster, "torch_tcp_ms": torch}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{args.world}-rank gloo init_process_group, median of {args.trials} "
              f"(slowest rank per trial):")
        print(f"  muster-run (agent store on musterd): {m:8.1f} ms   (all ranks: {m_all:.1f} ms)")
        print(f"  plain tcp:// (rank 0 hosts store):  {t:8.1f} ms   (all ranks: {t_all:.1f} ms)")
        print(f"  from the last rank's arrival to the last rank's return: muster "
              f"{statistics.median(muster_tail):.1f} ms, tcp:// {statistics.median(torch_tail):.1f} ms")
        print(f"  speedup: {t / m:.1f}x   target: muster <= 100 ms")


if __name__ == "__main__":
    main()
