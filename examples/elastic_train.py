#!/usr/bin/env python3
"""Elastic training with the "muster" backend: a rank that dies is replaced
while the others keep running, and no step is lost.

    muster-run --nproc-per-node 4 --restart-policy rank --max-restarts 1 -- \
        /usr/bin/python3 examples/elastic_train.py

A small model is trained with a gradient all_reduce loop. When a collective
fails (a member died), the survivors call muster.torch.reconfigure(); the
process muster-run starts in the dead rank's place joins the same epoch
inside init_process_group. Then the rank that completed the most steps
broadcasts the model, the optimizer's state and its step count, and the
failed step is redone. Every rank prints `FINAL <sha256 of the parameters>`:
the same digest as a run where nothing failed.

ELASTIC_KILL_RANK=R and ELASTIC_KILL_STEP=S make rank R kill itself with
SIGKILL after step S (in its first process only), ELASTIC_STEPS the number
of steps (default 20), ELASTIC_DEVICE=cuda trains on the rank's GPU
(LOCAL_RANK; the all_reduces then run on musterd's NCCL communicators, which
are made anew for the new epoch).
"""
import hashlib
import json
import os
import signal
import time

import torch
import torch.distributed as dist

import muster.torch as mt


DEVICE = os.environ.get("ELASTIC_DEVICE", "cpu")


def device():
    if DEVICE == "cuda":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def batch(step, rank):
    g = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(16, 8, generator=g)
    return x.to(device()), (x @ torch.arange(32.0).reshape(8, 4) / 32).to(device())


def digest(model):
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().numpy().tobytes())
    return h.hexdigest()


def synchronize(model, optimizer, done):
    """After a reconfiguration: every rank takes the state of the one that
    completed the most steps. Returns the step count to resume after."""
    world = dist.get_world_size()
    steps = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    steps = [s.to(device()) for s in steps]
    dist.all_gather(steps, torch.tensor([done], dtype=torch.int64, device=device()))
    root = max(range(world), key=lambda r: steps[r].item())
    for p in model.parameters():
        dist.broadcast(p.data, src=root)
        state = optimizer.state[p]
        if "momentum_buffer" not in state or state["momentum_buffer"] is None:
            state["momentum_buffer"] = torch.zeros_like(p.data)
        dist.broadcast(state["momentum_buffer"], src=root)
    return steps[root].item(), root


def main():
    print(f"BOOT rank={os.environ.get('RANK')} pid={os.getpid()} t_us={time.time_ns() // 1000}",
          flush=True)
    steps = int(os.environ.get("ELASTIC_STEPS", "20"))
    kill_rank = int(os.environ.get("ELASTIC_KILL_RANK", "-1"))
    kill_step = int(os.environ.get("ELASTIC_KILL_STEP", "-1"))
    restarts = int(os.environ.get("MUSTER_RESTART_COUNT", "0"))
    first_process = restarts == 0 and int(os.environ.get("MUSTER_GENERATION", "0")) == 0
    dist.init_process_group("muster")
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"START rank={rank} pid={os.getpid()} epoch={mt.epoch()} restarts={restarts} "
          f"t_us={time.time_ns() // 1000}", flush=True)

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4).to(device())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for p in model.parameters():  # the buffers exist from the start (broadcast needs them)
        optimizer.state[p]["momentum_buffer"] = torch.zeros_like(p.data)
    done = 0
    reconfigurations = 0
    if mt.epoch() > 0:  # this process replaced a failed rank
        done, root = synchronize(model, optimizer, done)
        print(f"RESUME rank={rank} after step {done} from rank {root}", flush=True)

    while done < steps:
        step = done + 1
        try:
            optimizer.zero_grad()
            x, y = batch(step, rank)
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= world
        except RuntimeError as e:
            reconfigurations += 1
            if reconfigurations > 3:
                raise
            print(f"FAILED rank={rank} step={step}: {str(e).splitlines()[0]}", flush=True)
            start = time.perf_counter()
            epoch = mt.reconfigure()
            ms = (time.perf_counter() - start) * 1000
            print(f"RECONFIGURED rank={rank} epoch={epoch} took_ms={ms:.0f} "
                  f"t_us={time.time_ns() // 1000}", flush=True)
            done, root = synchronize(model, optimizer, done)
            print(f"RESUME rank={rank} after step {done} from rank {root}", flush=True)
            continue
        optimizer.step()
        done = step
        if rank == kill_rank and step == kill_step and first_process:
            print(f"KILL rank={rank} step={step} t_us={time.time_ns() // 1000}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    d = digest(model)
    print(f"FINAL {d}", flush=True)
    print("RESULT " + json.dumps({"rank": rank, "check": "elastic", "digest": d,
                                  "pid": os.getpid(), "epoch": mt.epoch(),
                                  "restarts": restarts}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
