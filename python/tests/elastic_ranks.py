"""A rank of test_elastic.py: the Python SDK's muster.reconfigure(). Runs
STEPS all_reduce steps; rank KILL_RANK kills itself with SIGKILL after step
KILL_STEP in its first process; on a failed step every survivor calls
muster.reconfigure(), the replacement joins the same epoch inside
muster.init(), the rank that got furthest broadcasts its total and step
count, and the step is redone. Prints `RESULT {json}` lines."""
import json
import os
import signal
import sys

import numpy as np

import muster

steps, kill_rank, kill_step = (int(a) for a in sys.argv[1:4])
first_process = os.environ.get("MUSTER_RESTART_COUNT", "0") == "0"
world = muster.init()
rank = world.rank
print("RESULT " + json.dumps({"rank": rank, "check": "start", "pid": os.getpid(),
                              "epoch": world.epoch}), flush=True)
total, done = 0.0, 0


def resynchronize():
    global total, done
    progress = np.zeros(world.size, dtype=np.int64)
    world.group.all_gather_into(progress, np.array([done], dtype=np.int64))
    root = int(np.argmax(progress))
    state = np.array([total, float(progress[root])])
    world.group.broadcast(state, root)
    total, done = float(state[0]), int(state[1])


if world.epoch > 0:
    resynchronize()
while done < steps:
    step = done + 1
    x = np.full(16, step * (rank + 1), dtype=np.float32)
    try:
        world.group.all_reduce(x)
    except muster.MusterError as e:
        print("RESULT " + json.dumps({"rank": rank, "check": "failed", "code": e.code_name}),
              flush=True)
        epoch = muster.reconfigure()
        print("RESULT " + json.dumps({"rank": rank, "check": "reconfigured", "epoch": epoch}),
              flush=True)
        resynchronize()
        continue
    total += float(x[0])
    done = step
    if rank == kill_rank and step == kill_step and first_process:
        os.kill(os.getpid(), signal.SIGKILL)
print("RESULT " + json.dumps({"rank": rank, "check": "final", "total": total, "steps": done,
                              "epoch": world.epoch, "pid": os.getpid()}), flush=True)
