#!/usr/bin/env python3
"""Elastic-job benchmark: the time from a rank's SIGKILL to a working world
again, muster's `--restart-policy rank` (only the dead rank restarts, the
survivors reconfigure) against `--restart-policy job` (every rank restarts
with a new generation), side by side in one run, for C++ ranks
(test/muster-elastic-rank) and torch ranks (examples/elastic_train.py).

    bazel build -c opt //tools:muster-run //daemon:musterd //tools:musterctl \\
        //client:libmuster.so //test:muster-elastic-rank
    tools/bench_elastic.py [--repeats 3] [--bin-dir bazel-out/k8-opt/bin]
                           [--python /usr/bin/python3 ...] [--no-torch]

4 ranks on this node (an embedded musterd per job); rank 2 kills itself
with SIGKILL after step 10. Figures per run, from the ranks' wall-clock
lines (µs):
  recovery   KILL -> the last survivor's Reconfigure returned (rank policy),
             or -> the last restarted rank finished Init (job policy)
  startup    KILL -> main() of the last new process (the launcher noticing
             the death, fork/exec, loading; for torch, importing torch)
  excl.      recovery - startup: what muster itself takes
Prints a progress line per run and a table of medians with the job/rank
ratio.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def lines(out, tag):
    """(fields dict) for every `TAG k=v ...` line in `out`."""
    found = []
    for line in out.splitlines():
        m = re.search(rf"\b{tag} (.*)$", line)
        if m:
            found.append(dict(kv.split("=", 1) for kv in m.group(1).split() if "=" in kv))
    return found


def run(bin_dir, policy, command, env_extra, timeout=300):
    with tempfile.TemporaryDirectory(prefix="muster-bench-elastic-") as tmp:
        env = dict(os.environ)
        env.update(env_extra)
        env["MUSTER_SOCKET"] = os.path.join(tmp, "nobody.sock")  # an embedded musterd
        cmd = [str(bin_dir / "tools/muster-run"), "--nproc-per-node", "4",
               "--musterd", str(bin_dir / "daemon/musterd"), "--restart-policy", policy,
               "--max-restarts", "1", "--", *command]
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        if p.returncode != 0:
            sys.exit(f"bench_elastic: {policy} run failed (exit {p.returncode}):\n{p.stdout}")
        return p.stdout


def measure(out, policy):
    kill = int(lines(out, "KILL")[0]["t_us"])
    boots = [int(b["t_us"]) for b in lines(out, "BOOT") if int(b["t_us"]) > kill]
    if policy == "rank":
        done = [int(r["t_us"]) for r in lines(out, "RECONFIGURED")]
        if len(done) != 3:
            sys.exit(f"bench_elastic: {len(done)} survivors reconfigured, not 3:\n{out}")
    else:
        done = [int(s["t_us"]) for s in lines(out, "START") if int(s["t_us"]) > kill]
        if len(done) != 4:
            sys.exit(f"bench_elastic: {len(done)} ranks restarted, not 4:\n{out}")
    recovery = (max(done) - kill) / 1000
    startup = (max(boots) - kill) / 1000
    return recovery, startup, recovery - startup


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--bin-dir", default=str(REPO / "bazel-out/k8-opt/bin"))
    ap.add_argument("--python", action="append", default=[],
                    help="interpreter with torch for the torch ranks (repeatable; default: "
                         "/usr/bin/python3 and /opt/muster/torch-venv/bin/python if present)")
    ap.add_argument("--no-torch", action="store_true")
    args = ap.parse_args()
    bin_dir = Path(args.bin_dir)
    for rel in ("tools/muster-run", "daemon/musterd", "test/muster-elastic-rank",
                "client/libmuster.so"):
        if not (bin_dir / rel).exists():
            sys.exit(f"bench_elastic: missing {bin_dir / rel} (see --help for the build command)")
    pythons = args.python or [p for p in ("/usr/bin/python3", "/opt/muster/torch-venv/bin/python")
                              if Path(p).exists()]
    cases = [("C++", [str(bin_dir / "test/muster-elastic-rank"), "--steps", "40", "--kill-rank",
                      "2", "--kill-step", "10", "--step-ms", "5"], {})]
    if not args.no_torch:
        torch_env = {"PYTHONPATH": str(REPO / "python"),
                     "MUSTER_LIBRARY": str(bin_dir / "client/libmuster.so"),
                     "ELASTIC_STEPS": "20", "ELASTIC_KILL_RANK": "2", "ELASTIC_KILL_STEP": "5"}
        for py in pythons:
            version = subprocess.run([py, "-c", "import torch; print(torch.__version__)"],
                                     stdout=subprocess.PIPE, text=True).stdout.strip()
            if not version:
                print(f"bench_elastic: no torch in {py}; skipped", file=sys.stderr)
                continue
            # Build the torch backend once, outside the timings.
            subprocess.run([py, "-c", "import muster.torch"], env={**os.environ, **torch_env},
                           check=True)
            cases.append((f"torch {version}", [py, str(REPO / "examples/elastic_train.py")],
                          torch_env))
    results = {}
    total = len(cases) * 2 * args.repeats
    n = 0
    for name, command, env in cases:
        for repeat in range(args.repeats):
            for policy in ("rank", "job"):
                n += 1
                figures = measure(run(bin_dir, policy, command, env), policy)
                results.setdefault((name, policy), []).append(figures)
                print(f"[{n}/{total}] {name} --restart-policy {policy}: recovery "
                      f"{figures[0]:.0f} ms (start-up {figures[1]:.0f} ms, excl. "
                      f"{figures[2]:.0f} ms)", file=sys.stderr, flush=True)
    print(f"4 ranks, one node, SIGKILL of rank 2; medians of {args.repeats} runs (ms)")
    print(f"{'ranks':<20} {'policy':<6} {'recovery':>9} {'startup':>8} {'excl.':>7} "
          f"{'job/rank (recovery)':>20}")
    for name, _, _ in cases:
        med = {p: [statistics.median(f[i] for f in results[(name, p)]) for i in range(3)]
               for p in ("rank", "job")}
        for policy in ("rank", "job"):
            r, s, e = med[policy]
            ratio = f"{med['job'][0] / med['rank'][0]:.2f}x" if policy == "job" else ""
            print(f"{name:<20} {policy:<6} {r:>9.0f} {s:>8.0f} {e:>7.0f} {ratio:>20}")


if __name__ == "__main__":
    main()
