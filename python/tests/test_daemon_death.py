"""A Python rank whose musterd is killed: the SDK raises UnavailableError
with the C API's code and message (naming the daemon's pid and socket), and
a rank that does not catch it exits non-zero instead of going on."""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from conftest import binary, rank_env

RANK = r"""
import sys
import numpy as np
import muster

w = muster.init()
x = np.ones(64, dtype=np.int32)
w.group.all_reduce(x)
print("RUNNING", flush=True)
if sys.argv[1] == "catch":
    try:
        while True:
            w.group.all_reduce(x)
    except muster.UnavailableError as e:
        print("CAUGHT", e.code_name, e.message, flush=True)
    try:
        w.group.barrier()
    except muster.UnavailableError as e:
        print("BARRIER", e.code_name, e.message, flush=True)
else:
    while True:  # an error nobody handles
        w.group.all_reduce(x)
"""


def wait_for(predicate, timeout, what):
    give_up = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > give_up:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_killed_musterd_raises_unavailable_and_an_uncaught_error_fails_the_rank():
    tmp = tempfile.mkdtemp(prefix="/tmp/muster-py-")  # short: a unix socket path
    sock, ready = os.path.join(tmp, "m.sock"), os.path.join(tmp, "ready.json")
    daemon = subprocess.Popen(
        [binary("daemon/musterd"), f"--socket={sock}", "--grpc-port=0", "--store-port=0",
         "--listen=127.0.0.1", f"--ready-file={ready}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    ranks, outs = [], []
    try:
        wait_for(lambda: os.path.exists(ready), 20, "musterd's ready file")
        with open(ready) as f:
            store_port = json.load(f)["store_port"]
        for r, mode in enumerate(["catch", "raise"]):
            env = rank_env({"RANK": str(r), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                            "MASTER_PORT": str(store_port), "MUSTER_SOCKET": sock,
                            "MUSTER_JOB_ID": "pydeath"})
            out = os.path.join(tmp, f"rank{r}.out")
            outs.append(out)
            with open(out, "w") as f:
                ranks.append(subprocess.Popen([sys.executable, "-c", RANK, mode], env=env,
                                              stdout=f, stderr=subprocess.STDOUT,
                                              stdin=subprocess.DEVNULL))

        def text(r):
            with open(outs[r]) as f:
                return f.read()

        wait_for(lambda: all("RUNNING" in text(r) or ranks[r].poll() is not None
                             for r in range(2)), 60, "both ranks in their loop")
        assert all(p.poll() is None for p in ranks), text(0) + text(1)
        daemon.send_signal(signal.SIGKILL)
        daemon.wait(10)
        for p in ranks:
            p.wait(30)
        gone = f"musterd (pid {daemon.pid}, unix:{sock}) is gone: the session stream ended"
        caught, raised = text(0), text(1)
        assert ranks[0].returncode == 0, caught
        assert "CAUGHT UNAVAILABLE " in caught and gone in caught, caught
        assert "BARRIER UNAVAILABLE " in caught and gone in caught, caught
        assert ranks[1].returncode != 0, raised
        assert "muster.UnavailableError: UNAVAILABLE: " in raised and gone in raised, raised
    finally:
        for p in ranks + [daemon]:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(tmp, ignore_errors=True)
