#!/usr/bin/env python3
"""torch.distributed on backend "muster" vs "gloo", side by side in one run.

For each world size the driver runs one job under muster-run (-c opt
binaries). Every rank initializes torch.distributed with backend "muster"
and creates a gloo group over the same ranks; then, for each op and size,
the two backends take turns on the same inputs: warm-up calls, then timed
calls (op + wait, no barrier between them). Each rank takes the p50 of its
own calls; the slowest rank's p50 counts. Then the example DDP model
(examples/torch_ddp.py) trains a few steps on each backend (p50 step time).
In the same run, the C++ SDK's all_reduce of 4 B (muster-bench collectives
under muster-run) gives the baseline for what the torch layer adds.

Usage:
  tools/bench_torch_backend.py [--python PY] [--worlds 2,4]
      [--sizes 4,4K,256K,4M,64M] [--ops all_reduce,all_gather_into_tensor,broadcast,barrier]
      [--repeats R] [--no-build] [--no-doc] [--quick]

--repeats R runs every job R times (default 3) and reports, per row, the
median over the passes of each side's p50 (the ratio of those medians).
Prints a Markdown table (ratio = gloo p50 / muster p50, > 1: muster is
faster) with the issue's targets, and (unless --no-doc) writes it into
docs/benchmarks.md, in the section "## torch.distributed: backend muster vs
gloo" (one block per torch major version, between its markers). Progress goes to stderr.
Needs: bazel (unless --no-build), and a python with torch.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OPT_BIN = ROOT / "bazel-out" / "k8-opt" / "bin"
SECTION = "## torch.distributed: backend muster vs gloo"


def parse_size(s):
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    return int(s[:-1] if s[-1:] in "KMG" else s) * mult


def fmt_size(n):
    for unit, m in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= m and n % m == 0:
            return f"{n // m} {unit}"
    return f"{n} B"


def iterations(nbytes, quick):
    n = max(10, min(2000, int(2e8 // max(nbytes, 100_000))))
    if nbytes <= 4096:
        n = 2000
    return max(5, n // 10) if quick else n


# ---------------------------------------------------------------- rank side

def rank_main(args):
    import torch
    import torch.distributed as dist

    sys.path.insert(0, str(ROOT / "python"))
    sys.path.insert(0, str(ROOT / "examples"))
    import muster.torch  # noqa: F401  registers "muster"

    dist.init_process_group("muster")
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    groups = {"muster": None, "gloo": gloo}

    def slowest(value):
        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=gloo)
        return t.item()

    def emit(**fields):
        if rank == 0:
            print("BENCH " + json.dumps(fields), flush=True)

    def time_calls(fn, iters, warmup):
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1e6

    for op in args.ops:
        sizes = [0] if op == "barrier" else args.sizes
        for nbytes in sizes:
            iters = iterations(max(nbytes, 4), args.quick)
            count = max(nbytes // 4, 1)
            if op == "all_reduce":
                x = torch.ones(count)
                calls = {b: (lambda g=g: dist.all_reduce(x, group=g)) for b, g in groups.items()}
            elif op == "broadcast":
                x = torch.ones(count)
                calls = {b: (lambda g=g: dist.broadcast(x, src=0, group=g))
                         for b, g in groups.items()}
            elif op == "all_gather_into_tensor":
                # nbytes is the gathered output, as in muster-bench.
                inp = torch.ones(max(count // world, 1))
                out = torch.empty(inp.numel() * world)
                calls = {b: (lambda g=g: dist.all_gather_into_tensor(out, inp, group=g))
                         for b, g in groups.items()}
                if torch.__version__.startswith("1."):
                    # torch 1.13's gloo has no _allgather_base: the same
                    # gather into views of the output tensor.
                    views = list(out.chunk(world))
                    calls["gloo"] = lambda: dist.all_gather(views, inp, group=gloo)
            elif op == "barrier":
                calls = {b: (lambda g=g: dist.barrier(group=g)) for b, g in groups.items()}
            else:
                raise SystemExit(f"unknown op {op}")
            warmup = max(3, iters // 10)
            p50 = {}
            for backend in ("muster", "gloo"):  # same inputs, taking turns
                p50[backend] = slowest(time_calls(calls[backend], iters, warmup))
            emit(kind="op", op=op, bytes=nbytes, world=world, iters=iters,
                 muster_p50_us=round(p50["muster"], 2), gloo_p50_us=round(p50["gloo"], 2),
                 ratio=round(p50["gloo"] / p50["muster"], 2))

    # DDP step of the example model.
    from torch.nn.parallel import DistributedDataParallel as DDP
    import torch_ddp
    steps = 6 if args.quick else 40
    result = {}
    for backend in ("muster", "gloo"):
        ddp = DDP(torch_ddp.make_model(), process_group=groups[backend])
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
        batches = [torch_ddp.batch(rank, s) for s in range(4)]

        def step(i=[0]):
            inputs, target = batches[i[0] % len(batches)]
            i[0] += 1
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(ddp(inputs), target)
            loss.backward()
            opt.step()
        result[backend] = slowest(time_calls(step, steps, 3))
    emit(kind="ddp", world=world, steps=steps, muster_p50_us=round(result["muster"], 1),
         gloo_p50_us=round(result["gloo"], 1), ratio=round(result["gloo"] / result["muster"], 2))
    dist.destroy_process_group()


# ---------------------------------------------------------------- driver

def say(msg):
    print(f"bench_torch_backend: {msg}", file=sys.stderr, flush=True)


def run_job(bin_dir, world, cmd, env):
    with tempfile.TemporaryDirectory(prefix="muster-bench-torch-") as tmp:
        e = dict(os.environ, **env)
        e["MUSTER_SOCKET"] = os.path.join(tmp, "nobody.sock")  # an embedded musterd
        full = [str(bin_dir / "tools" / "muster-run"), "--nproc-per-node", str(world),
                "--musterd", str(bin_dir / "daemon" / "musterd"), "--", *cmd]
        p = subprocess.run(full, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=1800)
        if p.returncode != 0:
            sys.stderr.write(p.stdout)
            raise SystemExit(f"bench_torch_backend: job failed (exit {p.returncode}): "
                             f"{' '.join(cmd)}")
        return p.stdout


FLOOR_SNIPPET = r"""
import statistics, time, torch, torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
x = torch.ones(1)
for _ in range(500): dist.all_reduce(x)
ts = []
for _ in range(5000):
    t0 = time.perf_counter(); dist.all_reduce(x); ts.append(time.perf_counter() - t0)
print(statistics.median(ts) * 1e6)
"""


def torch_floor(python):
    """p50 of dist.all_reduce on torch's "fake" backend (which does nothing):
    torch's own Python and dispatcher cost per call; None where torch has no
    fake backend (1.13)."""
    p = subprocess.run([python, "-c", FLOOR_SNIPPET], stdout=subprocess.PIPE,
                       stderr=subprocess.DEVNULL, text=True)
    return float(p.stdout.strip()) if p.returncode == 0 else None


def cpp_baseline(bin_dir, world, quick):
    """p50 of the C++ SDK's 4-byte all_reduce (muster-bench collectives)."""
    out = run_job(bin_dir, world, [str(bin_dir / "tools" / "muster-bench"), "collectives",
                                   "--op", "all_reduce", "--bytes", "4",
                                   "--iters", "200" if quick else "2000", "--json"], {})
    for line in out.splitlines():
        _, sep, rest = line.partition("{")
        if sep:
            rec = json.loads("{" + rest)
            if rec.get("op") == "all_reduce":
                return float(rec["p50_us"])
    raise SystemExit("bench_torch_backend: no all_reduce line from muster-bench:\n" + out)


def median_records(passes):
    """One record per (kind, op, bytes, world): the median of each side."""
    groups = {}
    for r in passes:
        groups.setdefault((r["kind"], r.get("op"), r.get("bytes"), r["world"]), []).append(r)
    out = []
    for rs in groups.values():
        m = dict(rs[0])
        for side in ("muster_p50_us", "gloo_p50_us"):
            m[side] = round(statistics.median(r[side] for r in rs), 2)
        m["ratio"] = round(m["gloo_p50_us"] / m["muster_p50_us"], 2)
        m["passes"] = len(rs)
        out.append(m)
    return out


def table(records, baselines, torch_version, cmdline, floor=None):
    lines = [f"`{cmdline}` on {os.uname().nodename} ({os.cpu_count()} CPUs), torch "
             f"{torch_version}, -c opt binaries, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
             "",
             "| op | world | bytes | muster p50 µs | gloo p50 µs | gloo/muster | target | met |",
             "|---|---|---|---|---|---|---|---|"]
    met_all = True
    for r in sorted([r for r in records if r["kind"] == "op"],
                    key=lambda r: (r["world"], r["op"], r["bytes"])):
        if r["world"] < 2:
            target = None  # world 1 is here for the torch layer's cost only
        elif r["op"] == "barrier":
            target = 10.0
        elif r["bytes"] <= 4096:
            target = 10.0
        elif r["bytes"] >= 4 << 20:
            target = 3.0
        else:
            target = None
        met = "" if target is None else ("yes" if r["ratio"] >= target else "no")
        met_all &= met != "no"
        lines.append(f"| {r['op']} | {r['world']} | "
                     f"{'-' if r['op'] == 'barrier' else fmt_size(r['bytes'])} | "
                     f"{r['muster_p50_us']} | {r['gloo_p50_us']} | {r['ratio']}x | "
                     f"{'' if target is None else f'≥ {target:g}x'} | {met} |")
    lines += ["", "| DDP step (examples/torch_ddp.py model) | world | muster p50 ms | "
              "gloo p50 ms | gloo/muster | faster |", "|---|---|---|---|---|---|"]
    for r in sorted([r for r in records if r["kind"] == "ddp"], key=lambda r: r["world"]):
        faster = "yes" if r["ratio"] > 1 else "no"
        if r["world"] < 2:
            faster += " (world 1: not a target)"
        else:
            met_all &= faster == "yes"
        lines.append(f"| {r['steps']} steps | {r['world']} | {r['muster_p50_us'] / 1000:.2f} | "
                     f"{r['gloo_p50_us'] / 1000:.2f} | {r['ratio']}x | {faster} |")
    floor_text = "n/a (no fake backend)" if floor is None else f"{floor:.2f}"
    lines += ["", "| torch layer at 4 B all_reduce | world | torch \"muster\" p50 µs | C++ SDK "
              "p50 µs | added µs | target ≤ 5 µs | torch's own floor (\"fake\" backend) µs |",
              "|---|---|---|---|---|---|---|"]
    for world, cpp in sorted(baselines.items()):
        mine = [r for r in records if r["kind"] == "op" and r["op"] == "all_reduce"
                and r["bytes"] == 4 and r["world"] == world]
        if not mine:
            continue
        added = mine[0]["muster_p50_us"] - cpp
        ok = "yes" if added <= 5 else "no"
        met_all &= ok == "yes"
        lines.append(f"| | {world} | {mine[0]['muster_p50_us']} | {cpp:.2f} | {added:.2f} | "
                     f"{ok} | {floor_text} |")
    lines += ["", f"All targets met: {'yes' if met_all else 'no'}."]
    return "\n".join(lines)


def write_doc(text, torch_version):
    """Replaces this torch major version's block (torch 1 and 2 each have one)."""
    major = torch_version.split(".")[0]
    begin = f"<!-- bench_torch_backend torch{major}: begin -->"
    end = f"<!-- bench_torch_backend torch{major}: end -->"
    doc = ROOT / "docs" / "benchmarks.md"
    body = doc.read_text() if doc.exists() else "# Benchmarks\n"
    block = f"{begin}\n### torch {major}.x\n\n{text}\n{end}"
    if begin in body and end in body:
        head, rest = body.split(begin, 1)
        body = head + block + rest.split(end, 1)[1]
    elif SECTION in body:
        head, rest = body.split(SECTION, 1)
        body = head + SECTION + "\n\n" + block + "\n" + rest
    else:
        body = body.rstrip("\n") + f"\n\n{SECTION}\n\n{block}\n"
    doc.write_text(body)
    say(f"wrote the table into {doc}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n", 1)[1])
    ap.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--python", default=sys.executable, help="the python (with torch) of ranks")
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--sizes", default="4,4K,256K,4M,64M")
    ap.add_argument("--ops", default="all_reduce,all_gather_into_tensor,broadcast,barrier")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--no-doc", action="store_true")
    ap.add_argument("--quick", action="store_true", help="few iterations, no doc")
    ap.add_argument("--bin", default=str(OPT_BIN), help="binary tree (default: the -c opt one)")
    args = ap.parse_args()
    args.sizes = [parse_size(s) for s in args.sizes.split(",") if s]
    args.ops = [o for o in args.ops.split(",") if o]
    if args.rank:
        return rank_main(args)

    cmdline = "tools/bench_torch_backend.py" + "".join(f" {a}" for a in sys.argv[1:])
    bin_dir = Path(args.bin)
    if not args.no_build:
        say("building -c opt binaries")
        subprocess.run(["bazel", "build", "-c", "opt", "//tools:muster-run", "//daemon:musterd",
                        "//tools:muster-bench", "//client:libmuster.so"], cwd=ROOT, check=True)
    env = {"MUSTER_LIBRARY": str(bin_dir / "client" / "libmuster.so"),
           "PYTHONPATH": str(ROOT / "python")}
    torch_version = subprocess.run([args.python, "-c", "import torch; print(torch.__version__)"],
                                   stdout=subprocess.PIPE, text=True, check=True).stdout.strip()
    say(f"building the torch backend for torch {torch_version}")
    subprocess.run([args.python, "-c", "import muster.torch as m; m.build()"], check=True,
                   env=dict(os.environ, **env))
    passes, cpp = [], {}
    worlds = [int(w) for w in args.worlds.split(",")]
    for rep in range(1 if args.quick else args.repeats):
        for world in worlds:
            say(f"pass {rep + 1}, world {world}: C++ SDK baseline")
            cpp.setdefault(world, []).append(cpp_baseline(bin_dir, world, args.quick))
            say(f"C++ SDK all_reduce 4 B p50 {cpp[world][-1]} us")
            say(f"pass {rep + 1}, world {world}: torch, muster vs gloo")
            out = run_job(bin_dir, world, [args.python, str(Path(__file__).resolve()), "--rank",
                                           "--sizes", ",".join(map(str, args.sizes)),
                                           "--ops", ",".join(args.ops)]
                          + (["--quick"] if args.quick else []), env)
            for line in out.splitlines():
                _, sep, rest = line.partition("BENCH ")
                if sep:
                    passes.append(json.loads(rest))
                    say(rest)
    records = median_records(passes)
    baselines = {w: statistics.median(v) for w, v in cpp.items()}
    floor = torch_floor(args.python)
    text = table(records, baselines, torch_version, cmdline, floor)
    print(text)
    if not args.no_doc and not args.quick:
        write_doc(text, torch_version)
    return 0


if __name__ == "__main__":
    sys.exit(main())
