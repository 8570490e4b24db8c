"""The Python SDK in an elastic job (no torch): under muster-run
--restart-policy rank, rank 1 of 3 dies by SIGKILL after step 4; only it is
restarted, the survivors call muster.reconfigure() and keep their
processes, and every rank ends with the same total in epoch 1."""
import json
import subprocess
import sys
import time

from conftest import TESTS, rank_env, run_job


def test_a_killed_rank_rejoins_and_the_survivors_reconfigure():
    job = run_job(3, TESTS / "elastic_ranks.py", args=(12, 1, 4),
                  launcher_args=["--restart-policy", "rank", "--max-restarts", "1"])
    assert job.returncode == 0, job.output
    by = job.by_rank()
    expected = sum(s * 6 for s in range(1, 13))  # step * (1 + 2 + 3)
    for rank in range(3):
        final = [r for r in by[rank] if r["check"] == "final"]
        assert len(final) == 1, job.output
        assert final[0]["total"] == expected and final[0]["epoch"] == 1, job.output
        starts = {r["pid"] for r in by[rank] if r["check"] == "start"}
        assert len(starts) == (2 if rank == 1 else 1), job.output
        assert final[0]["pid"] in starts
    for rank in (0, 2):
        assert {"rank": rank, "check": "reconfigured", "epoch": 1} in by[rank], job.output
        assert any(r["check"] == "failed" and r["code"] == "ABORTED" for r in by[rank])
    replacement = [r for r in by[1] if r["check"] == "start"]
    assert replacement[-1]["epoch"] == 1, job.output


def test_the_survivors_shrink_and_a_new_process_grows_the_world_back(musterd, tmp_path):
    """Without replacements (no muster-run here): rank 2 of 3 dies, the
    others reconfigure with allow_shrink and go on as a world of 2 (dense
    ranks, a new size); a process started later for rank 2 is seen by
    pending_joins() and admitted: the world is 3 again."""
    sock, info = musterd
    marker = tmp_path / "shrunk"

    def start(rank, extra):
        env = rank_env({"RANK": str(rank), "WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": str(info["store_port"]), "MUSTER_SOCKET": sock,
                        "MUSTER_JOB_ID": "pyshrink", "SHRUNK_MARKER": str(marker), **extra})
        return subprocess.Popen([sys.executable, str(TESTS / "shrink_ranks.py")], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                stdin=subprocess.DEVNULL)

    survivors = [start(0, {}), start(1, {})]
    victim = start(2, {"DIE": "1"})
    victim.wait(timeout=60)
    deadline = time.monotonic() + 60
    while not marker.exists():  # the survivors shrank: only then does rank 2 come back
        assert time.monotonic() < deadline, "the survivors never shrank"
        time.sleep(0.05)
    newcomer = start(2, {"MUSTER_RESTART_COUNT": "1"})
    results = []
    for p in survivors + [newcomer]:
        out = p.communicate(timeout=90)[0]
        assert p.returncode == 0, out
        results += [json.loads(line.split("RESULT ", 1)[1]) for line in out.splitlines()
                    if "RESULT " in line]
    shrunk = [r for r in results if r["check"] == "shrunk"]
    assert sorted(r["rank"] for r in shrunk) == [0, 1], results
    assert all(r["size"] == 2 and r["sum"] == 3.0 and r["epoch"] == 1 for r in shrunk), results
    grown = [r for r in results if r["check"] == "grown"]
    assert len(grown) == 3 and all(r["size"] == 3 and r["sum"] == 6.0 for r in grown), results
    assert {r["epoch"] for r in grown} == {2}, results
    failed = [r for r in results if r["check"] == "failed"]
    assert len(failed) == 2 and all(r["code"] == "ABORTED" for r in failed), results
