#!/usr/bin/python3
"""The torch.distributed (gloo) peer of `muster-bench collectives`.

Run with Debian's python3-torch (PyTorch 1.13), no muster involved:

    /usr/bin/python3 tools/bench_torch_collectives.py --world 2 \
        --op all_reduce,barrier --bytes 4,4096 --iters 1000,1000 [--verify]

starts WORLD processes (this script again, with --rank R) that join with
init_process_group("gloo", init_method="tcp://127.0.0.1:PORT") (rank 0
hosts the TCPStore) and run, for every op and size, `warmup` untimed and
`iters` timed iterations back to back (no barrier in between). Per iteration
the slowest rank's time counts (all_reduce MAX of every rank's times); rank
0 prints one JSON line per size with the fields of muster-bench collectives
(p50_us, busbw_gbps as nccl-tests defines it, ...). Sizes as in nccl-tests:
`bytes` is the whole buffer of all_reduce and broadcast, the gathered output
of all_gather and the input of reduce_scatter, rounded down to whole
elements (at least one per rank). Like torchrun, each rank gets
OMP_NUM_THREADS=1 unless it is set.

The single-tensor APIs (all_gather_into_tensor, reduce_scatter_tensor) are
tried first; where gloo lacks them (torch 1.13) the list APIs on views of
the same tensors are used, and "api" says which. An op gloo does not
implement at all (torch 1.13: reduce_scatter) is reported with
"unsupported": the error message, and null figures.
"""
import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import time

OPS = ["all_reduce", "broadcast", "all_gather", "reduce_scatter", "barrier"]
DTYPES = ["float32", "float64", "int32", "int64", "float16", "bfloat16", "int8", "uint8"]


def parse_sizes(text):
    out = []
    for part in text.split(","):
        part = part.strip().upper().replace("IB", "").rstrip("B")
        mult = 1
        if part and part[-1] in "KMG":
            mult = 1 << {"K": 10, "M": 20, "G": 30}[part[-1]]
            part = part[:-1]
        v = int(part)
        if v <= 0:
            raise ValueError("sizes must be positive")
        out.append(v * mult)
    return out


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", type=int, default=2, help="ranks to start")
    p.add_argument("--op", default=",".join(OPS))
    p.add_argument("--bytes", default="4,4K,256K,4M")
    p.add_argument("--iters", default="100", help="one count, or one per size")
    p.add_argument("--warmup", type=int, default=-1, help="-1: max(2, iters/10)")
    p.add_argument("--dtype", default="float32", choices=DTYPES)
    p.add_argument("--verify", action="store_true")
    p.add_argument("--timeout", type=float, default=600, help="seconds for the whole run")
    p.add_argument("--rank", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    a.ops = [o for o in a.op.split(",") if o]
    for o in a.ops:
        if o not in OPS:
            p.error("unknown op %r (known: %s)" % (o, ", ".join(OPS)))
    a.sizes = parse_sizes(a.bytes)
    a.iter_list = [int(x) for x in a.iters.split(",") if x]
    if len(a.iter_list) not in (1, len(a.sizes)) or min(a.iter_list) <= 0:
        p.error("--iters: one positive count, or one per --bytes size")
    return a


def launch(a):
    with socket.socket() as s:  # a free port for rank 0's TCPStore
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    procs = []
    for r in range(a.world):
        cmd = [sys.executable, os.path.abspath(__file__)] + sys.argv[1:] + [
            "--rank", str(r), "--port", str(port)]
        procs.append(subprocess.Popen(cmd, env=env))
    deadline = time.time() + a.timeout
    rc = 0
    try:
        for pr in procs:
            left = max(1.0, deadline - time.time())
            code = pr.wait(timeout=left)
            if code != 0:
                rc = 1
                print("bench_torch_collectives: a rank exited %d" % code, file=sys.stderr)
    except subprocess.TimeoutExpired:
        print("bench_torch_collectives: timed out after %.0f s" % a.timeout, file=sys.stderr)
        rc = 1
    finally:
        for pr in procs:
            if pr.poll() is None:
                pr.kill()
                pr.wait()
    return rc


def input_values(torch, rank, n_elems, start=0):
    # The same deterministic inputs as muster-bench: ((i + 3 rank) % 7) + 1.
    return (torch.arange(start, start + n_elems, dtype=torch.int64) + 3 * rank) % 7 + 1


def run_rank(a):
    import torch
    import torch.distributed as dist

    dtype = getattr(torch, a.dtype)
    es = torch.tensor([], dtype=dtype).element_size()
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % a.port,
                            rank=a.rank, world_size=a.world)
    n, rank = dist.get_world_size(), dist.get_rank()
    bus = {"all_reduce": 2.0 * (n - 1) / n, "all_gather": (n - 1) / n,
           "reduce_scatter": (n - 1) / n, "broadcast": 1.0, "barrier": 0.0}
    exit_code = 0
    for op in a.ops:
        sizes = [0] if op == "barrier" else a.sizes
        for si, req in enumerate(sizes):
            iters = a.iter_list[0] if len(a.iter_list) == 1 else a.iter_list[si]
            if op == "barrier":
                iters = max(a.iter_list)
            warmup = a.warmup if a.warmup >= 0 else max(2, iters // 10)
            api = None
            if op in ("all_reduce", "broadcast"):
                count = max(1, req // es)
                total = count * es
                buf = torch.zeros(count, dtype=dtype)
            elif op in ("all_gather", "reduce_scatter"):
                count = max(1, req // (es * n))
                total = count * es * n
                small = torch.zeros(count, dtype=dtype)
                big = torch.zeros(count * n, dtype=dtype)
            else:
                count, total = 0, 0

            def fill():
                if op == "all_reduce":
                    buf.copy_(input_values(torch, rank, count))
                elif op == "broadcast":
                    buf.copy_(input_values(torch, 0, count) if rank == 0 else
                              torch.zeros(count, dtype=torch.int64))
                elif op == "all_gather":
                    small.copy_(input_values(torch, rank, count))
                    big.zero_()
                elif op == "reduce_scatter":
                    big.copy_(input_values(torch, rank, count * n))
                    small.zero_()

            def check():
                if op == "all_reduce":
                    want = sum(input_values(torch, r, count) for r in range(n))
                    got = buf
                elif op == "broadcast":
                    want, got = input_values(torch, 0, count), buf
                elif op == "all_gather":
                    want = torch.cat([input_values(torch, r, count) for r in range(n)])
                    got = big
                elif op == "reduce_scatter":
                    want = sum(input_values(torch, r, count, rank * count) for r in range(n))
                    got = small
                else:
                    return 0
                return int((got.to(torch.float64) != want.to(dtype).to(torch.float64)).sum())

            # Pick the call: the single-tensor API if gloo implements it.
            if op == "all_reduce":
                call = lambda: dist.all_reduce(buf)
            elif op == "broadcast":
                call = lambda: dist.broadcast(buf, 0)
            elif op == "barrier":
                call = lambda: dist.barrier()
            elif op == "all_gather":
                views = list(big.chunk(n))
                call = lambda: dist.all_gather_into_tensor(big, small)
                api = "all_gather_into_tensor"
            else:
                call = lambda: dist.reduce_scatter_tensor(small, big)
                api = "reduce_scatter_tensor"
            unsupported = None
            fill()
            try:
                call()
            except (RuntimeError, ValueError):
                if op == "all_gather":
                    call = lambda: dist.all_gather(views, small)
                    api = "all_gather(list of views)"
                    call()
                else:
                    # reduce_scatter(output, list of inputs): gloo may lack it too.
                    ins = list(big.chunk(n))
                    call = lambda: dist.reduce_scatter(small, ins)
                    try:
                        call()
                        api = "reduce_scatter(list of views)"
                    except (RuntimeError, ValueError) as e2:
                        msg = str(e2).strip()
                        unsupported = msg.splitlines()[0] if msg else repr(e2)
                        api = "reduce_scatter_tensor, reduce_scatter"
            if unsupported is not None:
                if rank == 0:
                    print(json.dumps({
                        "system": "gloo", "op": op, "bytes": total, "world": n,
                        "dtype": a.dtype, "iters": 0, "warmup": 0, "p50_us": None,
                        "p99_us": None, "min_us": None, "mean_us": None, "algbw_gbps": None,
                        "busbw_gbps": None, "verified": None, "api": api,
                        "unsupported": unsupported}, separators=(",", ":")), flush=True)
                continue
            wrong = 0
            if a.verify:
                fill()
                call()
                wrong += check()
            fill()
            for _ in range(warmup):
                call()
            times = [0.0] * iters
            clock = time.perf_counter
            ru0 = resource.getrusage(resource.RUSAGE_SELF)
            for k in range(iters):
                t0 = clock()
                call()
                times[k] = (clock() - t0) * 1e6
            ru1 = resource.getrusage(resource.RUSAGE_SELF)
            t = torch.tensor(times, dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            csw = torch.tensor([ru1.ru_nvcsw - ru0.ru_nvcsw, ru1.ru_nivcsw - ru0.ru_nivcsw],
                               dtype=torch.int64)
            dist.all_reduce(csw)
            verified = None
            if a.verify:
                fill()
                call()
                wrong += check()
                w = torch.tensor([wrong], dtype=torch.int64)
                dist.all_reduce(w)
                verified = int(w[0]) == 0
                if not verified:
                    exit_code = 1
            if rank != 0:
                continue
            s = sorted(t.tolist())
            pick = lambda q: s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]
            p50 = pick(0.5)
            algbw = total / (p50 * 1e-6) / 1e9 if op != "barrier" and p50 > 0 else None
            row = {"system": "gloo", "op": op, "bytes": total, "world": n, "dtype": a.dtype,
                   "iters": iters, "warmup": warmup, "p50_us": round(p50, 3),
                   "p99_us": round(pick(0.99), 3), "min_us": round(s[0], 3),
                   "mean_us": round(sum(s) / len(s), 3),
                   "algbw_gbps": None if algbw is None else round(algbw, 6),
                   "busbw_gbps": None if algbw is None else round(algbw * bus[op], 6),
                   "verified": verified,
                   "vol_csw_per_iter": round(int(csw[0]) / iters, 4),
                   "invol_csw_per_iter": round(int(csw[1]) / iters, 4)}
            if api is not None:
                row["api"] = api
            print(json.dumps(row, separators=(",", ":")), flush=True)
    dist.destroy_process_group()
    return exit_code


def main():
    a = parse_args(sys.argv[1:])
    if a.rank < 0:
        return launch(a)
    return run_rank(a)


if __name__ == "__main__":
    sys.exit(main())
