"""The flight recorder of a torch job through the backend "muster":
`musterctl trace --json` lists the collectives the ranks issued (op, dtype,
count, root, under consecutive sequence numbers, the same on every member)
under torch's own group names, for the default group and a subgroup.

One job of 3 ranks (torch_ranks.py trace)."""
import json

import pytest

from conftest import TESTS, binary, run_job

WORLD = 3

# What torch_ranks.mode_trace issues, in order, per group: (op, dtype, count, root).
DEFAULT_OPS = [("all_reduce", "float32", 5, -1), ("broadcast", "int64", 3, 1),
               ("all_reduce", "int32", 6, -1)]
SUB_OPS = [("all_reduce", "float64", 4, -1), ("broadcast", "int8", 2, 1)]


@pytest.fixture(scope="module")
def trace(torch_backend):
    j = run_job(WORLD, TESTS / "torch_ranks.py", args=["trace", binary("tools/musterctl")],
                timeout=150)
    assert j.returncode == 0, j.output
    (r,) = [x for x in j.results if x["check"] == "trace"]
    assert r["returncode"] == 0, r
    records = [json.loads(line) for line in r["stdout"].splitlines() if line.startswith("{")]
    return r, records


def calls(records, group, rank):
    """(seq, (op, dtype, count, root)) of `rank` on `group`, by sequence number."""
    mine = [x for x in records if x["group"] == group and x["rank"] == rank and x["seq"] > 0]
    return [(x["seq"], (x["op"], x["dtype"], x["count"], x["root"])) for x in
            sorted(mine, key=lambda x: x["seq"])]


def find_run(seq_calls, expected):
    """The sequence number where `expected` starts as consecutive calls."""
    for i in range(len(seq_calls) - len(expected) + 1):
        window = seq_calls[i:i + len(expected)]
        if [c for _, c in window] == expected and all(
                window[k][0] == window[0][0] + k for k in range(len(window))):
            return window[0][0]
    return None


def test_trace_shows_torch_group_names(trace):
    r, records = trace
    names = {x["group"] for x in records}
    assert r["default_name"] in names, (r["default_name"], names)
    assert r["sub_name"] in names, (r["sub_name"], names)


@pytest.mark.parametrize("which,ops,members", [("default_name", DEFAULT_OPS, [0, 1, 2]),
                                               ("sub_name", SUB_OPS, [0, 1])])
def test_trace_lists_the_ops_issued(trace, which, ops, members):
    r, records = trace
    group = r[which]
    starts = {}
    for rank in members:
        seq_calls = calls(records, group, rank)
        starts[rank] = find_run(seq_calls, ops)
        assert starts[rank] is not None, (group, rank, seq_calls)
        for seq in range(starts[rank], starts[rank] + len(ops)):
            x = next(x for x in records if x["group"] == group and x["rank"] == rank
                     and x["seq"] == seq)
            assert x["state"] == "completed", x
            assert x["device"] == "cpu", x
    # Aligned: every member issued them under the same sequence numbers.
    assert len(set(starts.values())) == 1, starts
    # Non-members have no records of the subgroup.
    assert {x["rank"] for x in records if x["group"] == group} == set(members)
