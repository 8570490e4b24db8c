"""DistributedDataParallel on the torch backend "muster": 20 steps on 4 ranks
end with the same parameters as the same run on gloo (in the same job, over a
gloo group of the same ranks), equal on every rank; and
examples/torch_ddp.py runs as a plain script under muster-run (with torch's
debug wrapper around the backend)."""
import math
import re

import pytest

from conftest import REPO, TESTS, run_job

WORLD = 4
STEPS = 20


@pytest.fixture(scope="module")
def ddp(torch_backend):
    j = run_job(WORLD, TESTS / "torch_ranks.py", args=["ddp", STEPS], timeout=150)
    assert j.returncode == 0, j.output
    got = {r["rank"]: r for r in j.results if r["check"] == "ddp"}
    assert sorted(got) == list(range(WORLD)), j.output
    return got


def test_final_parameters_match_gloo(ddp):
    for r in ddp.values():
        assert r["steps"] == STEPS
        m, g = r["muster_params"], r["gloo_params"]
        assert len(m) == len(g) == 16 * 32 + 32 + 32 * 4 + 4
        assert max(abs(a - b) for a, b in zip(m, g)) < 1e-5, r["rank"]
        assert r["muster_moved"] > 1e-3  # training did change them


def test_parameters_equal_on_every_rank(ddp):
    first = ddp[0]["muster_params"]
    for r in ddp.values():
        assert r["muster_params"] == first, r["rank"]


def test_losses_match_gloo(ddp):
    for r in ddp.values():
        assert len(r["muster_losses"]) == STEPS
        assert all(math.isfinite(x) for x in r["muster_losses"])
        for a, b in zip(r["muster_losses"], r["gloo_losses"]):
            assert a == pytest.approx(b, rel=1e-5, abs=1e-6)


def test_example_script_runs_under_muster_run(torch_backend):
    # TORCH_DISTRIBUTED_DEBUG=DETAIL: torch 2.x wraps the backend in its
    # collective-checking wrapper (1.13 wraps only gloo and nccl).
    j = run_job(2, REPO / "examples" / "torch_ddp.py", args=["--steps", "6"], timeout=120,
                env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    assert j.returncode == 0, j.output
    losses = re.findall(r"\[rank 0\] step +(\d+)  loss ([0-9.]+)", j.output)
    assert [int(s) for s, _ in losses] == [0, 5], j.output
    sums = re.findall(r"rank (\d)/2: parameter checksum (-?[0-9.]+)", j.output)
    assert sorted(r for r, _ in sums) == ["0", "1"], j.output
    assert len({c for _, c in sums}) == 1, j.output  # the same parameters on both ranks
