"""Elastic training with the torch backend "muster" (examples/elastic_train.py)
under muster-run --restart-policy rank: rank 2 of 4 kills itself with
SIGKILL after step 5, muster-run starts only it again, the survivors keep
their processes and reconfigure, the replacement receives the model and
optimizer state by broadcast, and the final parameters are bit for bit those
of a run where nothing failed."""
from conftest import REPO, run_job

EXAMPLE = REPO / "examples" / "elastic_train.py"


def finals(job):
    return {r["rank"]: r for r in job.results if r["check"] == "elastic"}


def test_a_killed_rank_is_replaced_and_training_ends_where_an_undisturbed_run_does(torch_backend):
    calm = run_job(4, EXAMPLE, env={"ELASTIC_STEPS": "12"})
    assert calm.returncode == 0, calm.output
    calm_finals = finals(calm)
    assert sorted(calm_finals) == [0, 1, 2, 3], calm.output
    assert len({r["digest"] for r in calm_finals.values()}) == 1, calm.output

    job = run_job(4, EXAMPLE, env={"ELASTIC_STEPS": "12", "ELASTIC_KILL_RANK": "2",
                                   "ELASTIC_KILL_STEP": "5"},
                  launcher_args=["--restart-policy", "rank", "--max-restarts", "1"])
    assert job.returncode == 0, job.output
    got = finals(job)
    assert sorted(got) == [0, 1, 2, 3], job.output
    for rank, r in got.items():
        assert r["digest"] == calm_finals[0]["digest"], (rank, job.output)
        assert r["epoch"] == 1, job.output
    assert got[2]["restarts"] == 1
    assert "KILL rank=2 step=5" in job.output
    assert "restarting it (restart 1 of 1), the other ranks keep running" in job.output
    # The survivors kept their processes: one START line each; rank 2 two.
    starts = {}
    for line in job.output.splitlines():
        if "START rank=" in line:
            fields = dict(f.split("=") for f in line.split("START ")[1].split())
            starts.setdefault(int(fields["rank"]), set()).add(int(fields["pid"]))
    assert {r: len(p) for r, p in starts.items()} == {0: 1, 1: 1, 2: 2, 3: 1}, job.output
    for rank in (0, 1, 3):
        assert got[rank]["pid"] in starts[rank]
        assert f"RECONFIGURED rank={rank} epoch=1" in job.output
    assert "RESUME rank=2 after step 5" in job.output
