"""The torch backend "muster" under torchrun (python -m torch.distributed.run
--standalone), next to a musterd started here: torchrun's MASTER_PORT is its
own TCPStore, so the backend finds musterd's store through MUSTER_SOCKET and
uses TORCHELASTIC_RUN_ID as the job id."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import TESTS, Job, binary, rank_env


def test_torchrun_with_a_running_musterd(torch_backend, musterd, tmp_path):
    sock, info = musterd
    env = rank_env({"MUSTER_SOCKET": sock})
    for k in ["MUSTER_JOB_ID", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE",
              "MUSTER_STORE_ADDR", "MUSTER_STORE_PORT", "TORCHELASTIC_RUN_ID"]:
        env.pop(k, None)
    # Debian's torch 1.13 on Python 3.11 cannot parse torchrun's default
    # --redirects/--tee 0 (enum.Flag iteration changed); 1 works on both.
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc_per_node", "2", "--redirects", "1", "--tee", "1",
           "--log_dir", str(tmp_path / "logs"),
           str(TESTS / "torch_ranks.py"), "torchrun", binary("tools/musterctl")]
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=120, stdin=subprocess.DEVNULL, cwd=str(tmp_path))
    assert p.returncode == 0, p.stdout
    j = Job(p.returncode, p.stdout)
    got = {r["rank"]: r for r in j.results if r["check"] == "torchrun"}
    assert sorted(got) == [0, 1], p.stdout
    run_id = got[0]["run_id"]
    assert run_id and got[1]["run_id"] == run_id
    for r in got.values():
        assert r["all_reduce"] == [3.0, 3.0]
        assert r["subgroup"] == [1]
    groups = json.loads(got[0]["musterctl"]["stdout"])
    # The job is musterd's, named after torchrun's run id, with torch's group names.
    mine = [g for g in groups if g["job"] == run_id]
    assert {g["name"] for g in mine} == set(got[0]["names"]), groups
    for g in mine:
        assert [m["global_rank"] for m in g["members"]] == [0, 1]
