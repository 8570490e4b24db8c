"""A rank of test_elastic.py's shrink-and-grow test: muster.World's
reconfigure(allow_shrink=True) and pending_joins(). With DIE=1 the rank
kills itself after one all_reduce; the survivors see the next one fail,
shrink, report, touch $SHRUNK_MARKER, wait until a process waits to join
(agreed by an all_reduce), and reconfigure again to admit it."""
import json
import os
import signal
import time

import numpy as np

import muster

w = muster.init()


def say(**kv):
    print("RESULT " + json.dumps({"rank": w.rank, **kv}), flush=True)


say(check="start", size=w.size, epoch=w.epoch)
if w.epoch == 0:
    w.group.all_reduce(np.ones(1, dtype=np.float32))
    if os.environ.get("DIE") == "1":
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        w.group.all_reduce(np.ones(1, dtype=np.float32))
        say(check="unexpected-ok")
    except muster.MusterError as e:
        say(check="failed", code=e.code_name)
    w.reconfigure(allow_shrink=True)
    x = np.array([w.rank + 1.0], dtype=np.float32)
    w.group.all_reduce(x)
    say(check="shrunk", size=w.size, epoch=w.epoch, sum=float(x[0]))
    if w.rank == 0:
        open(os.environ["SHRUNK_MARKER"], "w").close()
    deadline = time.time() + 60
    while time.time() < deadline:
        n = np.array([w.pending_joins()], dtype=np.int32)
        w.group.all_reduce(n, op="max")
        if n[0] > 0:
            break
        time.sleep(0.05)
    w.reconfigure(allow_shrink=True)
x = np.array([w.rank + 1.0], dtype=np.float32)
w.group.all_reduce(x)
say(check="grown", size=w.size, epoch=w.epoch, sum=float(x[0]))
