"""Failures through the torch backend "muster" are errors that name the
problem, never hangs: a rank killed with SIGKILL, desynchronized collectives,
a group that never forms, a monitored barrier someone is late for, a wait
that times out, and bad arguments (which leave the group working). Also: the
job's groups are visible in musterctl under torch's names.

Two jobs of 3 ranks (torch_ranks.py errors, torch_ranks.py kill)."""
import json
import re

import pytest

from conftest import TESTS, binary, run_job

WORLD = 3


@pytest.fixture(scope="module")
def errors(torch_backend):
    j = run_job(WORLD, TESTS / "torch_ranks.py", args=["errors", binary("tools/musterctl")],
                timeout=150)
    assert j.returncode == 0, j.output
    return j


def by_rank(job, check, **match):
    got = {}
    for r in job.results:
        if r["check"] == check and all(r.get(k) == v for k, v in match.items()):
            assert r["rank"] not in got, r
            got[r["rank"]] = r
    return got


def works(value):
    """The check the ranks run after each failure: an all_reduce of the ranks."""
    return value == {"value": [float(sum(range(WORLD)))] * 2} or value == [
        float(sum(range(WORLD)))] * 2


def test_musterctl_shows_torch_group_names(errors):
    (r,) = by_rank(errors, "musterctl").values()
    assert r["returncode"] == 0, r
    groups = json.loads(r["stdout"])
    names = {g["name"] for g in groups}
    default_name, sub_name = r["torch_names"]
    assert {default_name, sub_name} <= names, (r["torch_names"], names)
    assert r["muster_group_name"] == default_name
    world = next(g for g in groups if g["name"] == default_name)
    assert [m["global_rank"] for m in world["members"]] == list(range(WORLD))
    assert world["backend"] == "cpu:gloo,cuda:nccl"
    sub = next(g for g in groups if g["name"] == sub_name)
    assert [m["global_rank"] for m in sub["members"]] == [0, 1]
    assert sub["local_synchronization"] is True
    assert sub["state"] == "ready"


def test_destroy_process_group_destroys_the_muster_group(errors):
    (r,) = by_rank(errors, "musterctl_after_destroy").values()
    assert r["returncode"] == 0, r
    groups = {g["name"]: g for g in json.loads(r["stdout"])}
    assert groups[r["name"]]["state"] == "destroyed", groups


EXPECTED_ERRORS = {
    "band_float": r"INVALID_ARGUMENT: reduce op BAND does not support dtype float32",
    "avg_int": r"INVALID_ARGUMENT: reduce op AVG does not support dtype int32",
    "unsupported_dtype": r"unsupported dtype Short",
    "non_contiguous_output": r"output tensors must be contiguous",
    "splits_do_not_add_up": r"input split sizes add up to 3 but the input tensor's dim 0 is 6",
    "splits_wrap": r"input split sizes add up to more than the input tensor's dim 0 \(6\)",
    "splits_disagree": r"INVALID_ARGUMENT: .*rank 1 sends 2 elements to rank 0, which expects 1",
    "broadcast_root_outside": r"root rank 8 is outside the group \(size 3\)",
    "send_to_rank_outside": r"rank 8 is outside the group \(size 3\)",
    "all_gather_wrong_count": r"expects 3 output tensors \(the group size\), got 1",
    "all_gather_into_tensor_overlap": r"INVALID_ARGUMENT: all_gather_into_tensor: the input "
    r"overlaps the output but is not this rank's part of it",
}


@pytest.mark.parametrize("case", sorted(EXPECTED_ERRORS))
def test_bad_arguments_raise_and_leave_the_group_working(errors, case):
    got = by_rank(errors, "bad_argument", case=case)
    assert sorted(got) == list(range(WORLD))
    for r in got.values():
        assert r["error"] is not None, r
        assert r["error"].startswith(("RuntimeError", "DistBackendError", "ValueError")), r
        assert re.search(EXPECTED_ERRORS[case], r["error"]), r
        assert works(r["after"]), r


def test_all_gather_into_tensor_in_place_is_not_an_overlap(errors):
    got = by_rank(errors, "all_gather_in_place")
    assert sorted(got) == list(range(WORLD))
    want = [float(k // 2 + 1) for k in range(2 * WORLD)]
    for r in got.values():
        assert r["error"] is None, r
        assert r["got"] == want, r


def test_premul_sum_launch_failure_leaves_the_tensors_unscaled(errors):
    got = by_rank(errors, "premul_launch_fails")
    assert sorted(got) == list(range(WORLD))
    for rank, r in got.items():
        assert len(r["errors"]) == 2, r
        for e in r["errors"]:
            assert e is not None and "the group was destroyed" in e, r
        assert r["coalesced"] == [[rank + 1.0] * 3, [rank + 3.0] * 2], r
        assert r["rooted"] == [rank + 1.0] * 3, r


def test_wait_timeout_while_a_peer_is_late(errors):
    (r,) = by_rank(errors, "wait_timeout").values()
    first = r["first"]
    assert not first["ok"], r
    assert "DEADLINE_EXCEEDED" in first["error"], r
    assert 0.25 <= first["seconds"] < 1.5, r  # the wait's 300 ms, not the peer's 2 s
    assert r["completed_after_timeout"] is False
    assert r["second"]["ok"], r  # the collective went on and completed
    assert r["value"] == [float(sum(range(1, WORLD + 1)))] * 3
    assert all(works(x["value"]) for x in by_rank(errors, "after_wait_timeout").values())


def test_monitored_barrier_names_the_late_rank(errors):
    got = by_rank(errors, "monitored_barrier")
    assert sorted(got) == list(range(WORLD))
    for rank, r in got.items():
        if rank == WORLD - 1:
            assert r["late"]
            continue
        assert not r["ok"], r
        assert re.search(r"(DEADLINE_EXCEEDED|ABORTED).*waiting for ranks 2 to arrive", r["error"]), r
        assert r["seconds"] < 2.5, r
    assert all(works(x["value"]) for x in by_rank(errors, "after_monitored_barrier").values())


def test_group_formation_timeout_names_missing_ranks(errors):
    got = by_rank(errors, "formation_timeout")
    assert sorted(got) == list(range(WORLD - 1))
    for r in got.values():
        assert not r["ok"], r
        assert "DEADLINE_EXCEEDED" in r["error"], r
        assert re.search(r"ranks that never arrived: 2\b", r["error"]), r
        assert 1.9 <= r["seconds"] < 4, r
    assert all(works(x["value"]) for x in by_rank(errors, "after_formation_timeout").values())


def test_a_timed_out_collective_fails_everywhere_through_wait_and_future(errors):
    got = by_rank(errors, "future_error")
    assert sorted(got) == list(range(WORLD))
    for rank, r in got.items():
        # No member gets a result: the early ones time out, the late one
        # fails at once with their reason.
        for how in ("future", "wait", "chained"):
            assert not r[how]["ok"], (how, r)
            assert re.search(r"(DEADLINE_EXCEEDED|ABORTED).*timed out waiting for ranks 2 to arrive",
                             r[how]["error"]), (how, r)
        if rank == WORLD - 1:
            assert r["future"]["seconds"] < 1.0, r  # at once, not after its own timeout
        assert r["callback_ran"], r
        assert r["completed"] is True and r["success"] is False, r
    assert all(works(x["value"]) for x in by_rank(errors, "after_future_error").values())


def test_desync_names_both_ranks_and_signatures(errors):
    got = by_rank(errors, "desync")
    assert sorted(got) == list(range(WORLD))
    for rank, r in got.items():
        assert not r["ok"], r
        assert r["seconds"] < 5, r  # an error, not a hang
        e = r["error"]
        assert "FAILED_PRECONDITION" in e and "do not match" in e, r
        assert re.search(r"rank 0 called all_reduce #\d+\(float32, count 4, SUM\)", e), r
        other = rank if rank != 0 else r"\d"
        assert re.search(rf"rank {other} called broadcast #\d+\(float32, count 4, root 0\)", e), r
    assert len(by_rank(errors, "done")) == WORLD


def test_sigkill_of_a_rank_fails_the_others_within_2s(torch_backend, tmp_path):
    j = run_job(WORLD, TESTS / "torch_ranks.py", args=["kill", tmp_path], timeout=120,
                launcher_args=["--stop-grace-seconds", "10"])
    assert j.returncode != 0, j.output  # muster-run reports the killed rank
    assert "rank 2" in j.output and "signal 9" in j.output, j.output
    victim = json.loads((tmp_path / "victim.json").read_text())
    dead = rf"rank 2 \(host {re.escape(victim['host'])}, pid {victim['pid']}\)"
    for rank in range(WORLD - 1):
        path = tmp_path / f"rank{rank}.json"
        assert path.exists(), j.output
        r = json.loads(path.read_text())
        pending = r["pending"]
        assert not pending["ok"], r
        assert re.search(dead, pending["error"]), r
        assert "ABORTED" in pending["error"], r
        assert 0 <= pending["wall"] - victim["killed_at"] < 2.0, r
        for later in ("next", "broadcast"):
            assert not r[later]["ok"], r
            assert re.search(dead, r[later]["error"]), r
            assert r[later]["seconds"] < 2.0, r
        # A group without the dead rank is unaffected.
        assert r["survivors_group"]["ok"] and r["survivors_group"]["value"] == [2.0, 2.0], r


def test_a_muster_subgroup_needs_a_muster_default_group(torch_backend):
    j = run_job(2, TESTS / "torch_ranks.py", args=["gloo_default"], timeout=90)
    assert j.returncode == 0, j.output
    got = by_rank(j, "muster_subgroup_of_gloo")
    assert sorted(got) == [0, 1], j.output
    for r in got.values():
        assert r["error"] is not None and "default group" in r["error"], r
        assert "gloo" in r["error"], r
        assert r["seconds"] < 10, r  # at once, not after a formation timeout
