#!/usr/bin/env python3
"""DistributedDataParallel training on the torch.distributed backend "muster".

A small MLP learns a fixed random linear map; each rank trains on its own
batches and DDP averages the gradients through muster. Run it under
muster-run (or torchrun next to a running musterd, see
python/muster/torch/USAGE.md):

    muster-run --nproc-per-node 4 -- python3 examples/torch_ddp.py --steps 20

Prints the loss every few steps on rank 0 and, at the end, a checksum of the
parameters (equal on every rank).
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

try:
    import muster.torch  # noqa: F401  registers the backend "muster"
except ImportError:  # running from a source tree
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    import muster.torch  # noqa: F401

IN_FEATURES, HIDDEN, OUT_FEATURES, BATCH = 16, 32, 4, 8


def make_model(seed=0):
    """The MLP, with the same initial parameters wherever it is built."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(IN_FEATURES, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, OUT_FEATURES),
    )


def batch(rank, step):
    """Rank `rank`'s batch of step `step`: inputs and targets of a fixed map."""
    g = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randn(BATCH, IN_FEATURES, generator=g)
    w = torch.randn(IN_FEATURES, OUT_FEATURES, generator=torch.Generator().manual_seed(7)) / 4
    return x, x @ w


def train(ddp_model, rank, steps, lr=0.1, log_every=0):
    """Plain SGD on MSE; returns the losses."""
    opt = torch.optim.SGD(ddp_model.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        x, y = batch(rank, step)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp_model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if log_every and rank == 0 and (step % log_every == 0 or step == steps - 1):
            print(f"step {step:3d}  loss {loss.item():.5f}", flush=True)
    return losses


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--backend", default="muster")
    args = parser.parse_args()
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    model = DDP(make_model())
    train(model, rank, args.steps, log_every=5)
    checksum = sum(p.detach().double().sum().item() for p in model.parameters())
    print(f"rank {rank}/{world}: parameter checksum {checksum:.9f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
