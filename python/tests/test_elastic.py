"""The Python SDK in an elastic job (no torch): under muster-run
--restart-policy rank, rank 1 of 3 dies by SIGKILL after step 4; only it is
restarted, the survivors call muster.reconfigure() and keep their
processes, and every rank ends with the same total in epoch 1."""
from conftest import TESTS, run_job


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
