#!/usr/bin/env python3
"""An unmodified PyTorch gloo script: nothing in it knows about muster.

Run it under muster-run (which sets RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT and TORCHELASTIC_USE_AGENT_STORE, so every rank is a client of
musterd's store):

    muster-run --nproc-per-node 4 -- /usr/bin/python3 examples/torch_gloo.py

or with plain torch (rank 0 hosts the store): set INIT_METHOD=tcp://HOST:PORT.
Prints one result line per rank and the time init_process_group took.
"""
import os
import sys
import time

import torch
import torch.distributed as dist


def main():
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    init_method = os.environ.get("INIT_METHOD", "env://")
    start_wall = time.time()
    start = time.perf_counter()
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    init_ms = (time.perf_counter() - start) * 1000
    end_wall = time.time()

    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    expected = world * (world + 1) / 2
    assert t.item() == expected, (t.item(), expected)

    b = torch.tensor([42 if rank == 0 else 0])
    dist.broadcast(b, src=0)
    assert b.item() == 42

    dist.barrier()
    evens = dist.new_group([r for r in range(world) if r % 2 == 0])
    if rank % 2 == 0:
        e = torch.tensor([1])
        dist.all_reduce(e, group=evens)
        assert e.item() == (world + 1) // 2
    dist.barrier()
    print(f"rank {rank}/{world}: all_reduce={t.item():g} broadcast={b.item()} "
          f"init_ms={init_ms:.1f} init_start={start_wall:.6f} init_end={end_wall:.6f}",
          flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
