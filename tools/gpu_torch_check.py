#!/usr/bin/env python3
"""One rank of gpu_check.sh's torch phase: the torch.distributed backend
"muster" on CUDA tensors (musterd's NCCL communicators), run under
muster-run with one rank per GPU.

Checks, each printed as `RESULT {json}` (rank 0 also prints a summary line):
  - all_reduce of CUDA tensors (float32 SUM, bfloat16 MAX, AVG), broadcast,
    all_gather_into_tensor, reduce_scatter_tensor, checked against values
    computed on the host;
  - a DistributedDataParallel step of examples/torch_ddp.py's model on the
    GPU: parameters equal on every rank afterwards, loss finite;
  - all_reduce p50 latency per size through "muster" and, when the torch
    build has it, through torch's own "nccl" backend in the same job (a
    second process group over the same ranks), as a ratio.

`--device cpu` runs the same script on CPU tensors (a dry run of the script
on a machine without a GPU; gloo is the peer then). Exit status 0 when every
check passed.
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import muster.torch  # noqa: E402,F401  registers "muster"

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
LOCAL = int(os.environ.get("LOCAL_RANK", RANK))
failures = 0


def report(check, ok, **fields):
    global failures
    if not ok:
        failures += 1
    print("RESULT " + json.dumps({"rank": RANK, "check": check, "ok": bool(ok), **fields}),
          flush=True)


def correctness(device):
    x = torch.full((1000,), float(RANK + 1), device=device)
    dist.all_reduce(x)
    report("all_reduce_f32_sum", bool((x == WORLD * (WORLD + 1) / 2).all()))
    y = (torch.arange(64, device=device) * (RANK + 1)).to(torch.bfloat16)
    dist.all_reduce(y, op=dist.ReduceOp.MAX)
    expected = (torch.arange(64) * WORLD).to(torch.bfloat16)
    report("all_reduce_bf16_max", bool((y.cpu() == expected).all()))
    z = torch.full((10,), float(RANK), device=device)
    dist.all_reduce(z, op=dist.ReduceOp.AVG)
    report("all_reduce_avg", bool(torch.allclose(z.cpu(), torch.full((10,), (WORLD - 1) / 2))))
    b = torch.full((5,), 42.0 if RANK == 0 else 0.0, device=device)
    dist.broadcast(b, src=0)
    report("broadcast", bool((b == 42).all()))
    out = torch.empty(WORLD * 3, device=device)
    dist.all_gather_into_tensor(out, torch.full((3,), float(RANK), device=device))
    report("all_gather_into_tensor",
           bool((out.cpu() == torch.arange(WORLD).repeat_interleave(3).float()).all()))
    rs = torch.empty(2, device=device)
    dist.reduce_scatter_tensor(rs, torch.ones(2 * WORLD, device=device))
    report("reduce_scatter_tensor", bool((rs == WORLD).all()))


def ddp_step(device):
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 1)).to(device)
    ddp = DDP(model, device_ids=[LOCAL] if device.type == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(100 + RANK)
    inputs = torch.randn(16, 32, generator=g).to(device)
    target = torch.randn(16, 1, generator=g).to(device)
    start = time.perf_counter()
    loss = torch.nn.functional.mse_loss(ddp(inputs), target)
    loss.backward()
    opt.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    step_ms = (time.perf_counter() - start) * 1000
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(WORLD)]
    dist.all_gather(gathered, flat)
    same = all(torch.equal(gathered[0], t) for t in gathered)
    report("ddp_step", same and bool(torch.isfinite(loss).item()), loss=float(loss.item()),
           step_ms=round(step_ms, 3))


def p50_us(group, nbytes, device, iters):
    x = torch.zeros(max(nbytes // 4, 1), device=device)
    for _ in range(5):
        dist.all_reduce(x, group=group)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        dist.all_reduce(x, group=group)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2] * 1e6


def latency(device):
    peer_name = "nccl" if device.type == "cuda" else "gloo"
    try:
        peer = dist.new_group(backend=peer_name)
    except Exception as e:  # a torch without NCCL
        report("peer_group", True, note=f"no {peer_name} peer: {e}")
        peer = None
    for nbytes, iters in ((4, 200), (4096, 200), (1 << 20, 50), (64 << 20, 10)):
        mine = p50_us(None, nbytes, device, iters)
        theirs = p50_us(peer, nbytes, device, iters) if peer is not None else None
        report("all_reduce_latency", True, bytes=nbytes, muster_p50_us=round(mine, 1),
               peer=peer_name, peer_p50_us=None if theirs is None else round(theirs, 1),
               ratio=None if theirs is None else round(theirs / mine, 2))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    args = ap.parse_args()
    if args.device == "cuda":
        if not torch.cuda.is_available():
            print("gpu_torch_check: torch sees no CUDA device", file=sys.stderr)
            return 2
        torch.cuda.set_device(LOCAL)
        device = torch.device("cuda", LOCAL)
    else:
        device = torch.device("cpu")
    dist.init_process_group("muster")
    report("init", True, torch=torch.__version__, world=WORLD, device=str(device))
    correctness(device)
    ddp_step(device)
    latency(device)
    dist.barrier()
    dist.destroy_process_group()
    if RANK == 0:
        print(f"gpu_torch_check: {'all passed' if failures == 0 else f'{failures} FAILED'}",
              flush=True)
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
