"""The torch.distributed backend "muster" at world 2 and 4: every collective,
dtype and reduce op, checked element by element against values computed
here and against gloo running the same call over the same ranks in the same
job (where gloo has the op); subgroups (new_group with a non-member,
new_subgroups); object collectives; point to point; the Work and its future.

One job per world size (torch_ranks.py collectives); the ranks report, the
test computes what to expect."""
import math
from functools import reduce as fold

import pytest

from conftest import TESTS, run_job

FLOATS = ["float16", "bfloat16", "float32", "float64"]
INTS = ["int8", "uint8", "int32", "int64"]
COMPLEX = ["complex64", "complex128"]
DTYPES = FLOATS + INTS + ["bool"] + COMPLEX
OPS = ["SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM"]
BITS = {"int8": 8, "uint8": 8, "int32": 32, "int64": 64}


@pytest.fixture(scope="module", params=[2, 4])
def job(request, torch_backend):
    j = run_job(request.param, TESTS / "torch_ranks.py", args=["collectives"], timeout=150)
    assert j.returncode == 0, j.output
    return request.param, j


def rows(job, check, **match):
    n, j = job
    out = [r for r in j.results if r["check"] == check
           and all(r.get(k) == v for k, v in match.items())]
    return out


def by_rank(job, check, **match):
    got = {}
    for r in rows(job, check, **match):
        assert r["rank"] not in got, (check, match, r)
        got[r["rank"]] = r
    assert sorted(got) == list(range(job[0])), (check, match, sorted(got))
    return got


# ---- what the ranks computed on ----------------------------------------------


def values(rank, dtype, n=5, offset=0):
    """torch_ranks.values as plain Python (complex as [re, im])."""
    base = [rank + 1, 2 * rank, 3, 1 - rank, (rank * 5) % 7, rank + 2, 4 - rank][:n]
    base = [v + offset for v in base]
    if dtype == "uint8":
        return [abs(v) for v in base]
    if dtype == "bool":
        return [v % 2 == 1 for v in base]
    if dtype in COMPLEX:
        return [[float(v), float(rank - 1)] for v in base]
    if dtype in FLOATS:
        return [float(v) for v in base]
    return base


def valid(dtype, op):
    """torch's (and muster's) dtype x op rules."""
    bitwise = op in ("BAND", "BOR", "BXOR")
    floating_only = op in ("AVG", "PREMUL_SUM")
    if dtype in FLOATS:
        return not bitwise
    if dtype in COMPLEX:
        return op in ("SUM", "AVG", "PREMUL_SUM")
    return not floating_only


def wrap(v, dtype):
    bits = BITS[dtype]
    if dtype == "uint8":
        return v % 256
    return ((v + (1 << (bits - 1))) % (1 << bits)) - (1 << (bits - 1))


def combine(op, xs, dtype):
    """Reduces the contributions xs (one per rank) of one element."""
    n = len(xs)
    if dtype == "bool":
        return {"SUM": any(xs), "MAX": any(xs), "BOR": any(xs), "PRODUCT": all(xs),
                "MIN": all(xs), "BAND": all(xs), "BXOR": sum(xs) % 2 == 1}[op]
    if dtype in COMPLEX:
        return [combine(op, [x[0] for x in xs], "float64"),
                combine(op, [x[1] for x in xs], "float64")]
    if op == "SUM":
        v = sum(xs)
    elif op == "AVG":
        v = sum(xs) / n
    elif op == "PREMUL_SUM":
        v = sum(0.5 * x for x in xs)
    elif op == "PRODUCT":
        v = fold(lambda a, b: a * b, xs)
    elif op == "MIN":
        v = min(xs)
    elif op == "MAX":
        v = max(xs)
    elif op == "BAND":
        v = fold(lambda a, b: a & b, xs)
    elif op == "BOR":
        v = fold(lambda a, b: a | b, xs)
    else:
        v = fold(lambda a, b: a ^ b, xs)
    return wrap(v, dtype) if dtype in INTS else v


def reduced(op, per_rank, dtype):
    return [combine(op, list(xs), dtype) for xs in zip(*per_rank)]


def same(a, b):
    """Nested equality, floats compared to 1e-6 (the values are exact)."""
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        return (isinstance(a, (int, float)) and isinstance(b, (int, float))
                and math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9))
    return a == b


def check_value(r, expected):
    assert "value" in r["muster"], r
    assert same(r["muster"]["value"], expected), (r, expected)
    if "value" in r["gloo"]:
        assert r["muster"]["value"] == r["gloo"]["value"], r


# ---- the tests ------------------------------------------------------------------


def test_job_ran(job):
    n, j = job
    assert len(by_rank(job, "done")) == n
    init = by_rank(job, "init")
    assert all(r["backend"] == "muster" and r["world"] == n for r in init.values())


def test_all_reduce_every_dtype_and_op(job):
    n, _ = job
    refused = 0
    for dtype in DTYPES:
        for op in OPS:
            got = by_rank(job, "all_reduce", dtype=dtype, op=op)
            if not valid(dtype, op):
                refused += 1
                for r in got.values():
                    assert "error" in r["muster"], r
                    assert "does not support" in r["muster"]["error"], r
                continue
            expected = reduced(op, [values(k, dtype) for k in range(n)], dtype)
            for rank, r in got.items():
                assert r["input"] == values(rank, dtype), r
                check_value(r, expected)
    assert refused == 4 * 3 + 5 * 2 + 2 * 6
    for r in by_rank(job, "all_reduce", op="PREMUL_SUM_TENSOR").values():
        check_value(r, reduced("PREMUL_SUM", [values(k, "float32") for k in range(n)],
                               "float32"))
    # Refused combinations left the group working.
    assert all(r["value"] == [float(n)] * 3 for r in by_rank(job, "after_reduce_errors").values())


def test_all_reduce_agrees_with_gloo_where_gloo_has_the_op(job):
    compared = 0
    for r in rows(job, "all_reduce"):
        if "value" in r["gloo"]:
            assert r["muster"] == r["gloo"], r
            compared += 1
    # gloo has SUM, PRODUCT, MIN, MAX (and bitwise ops on integers) for most dtypes.
    assert compared >= job[0] * 30


def test_broadcast(job):
    n, _ = job
    for dtype in DTYPES:
        for r in by_rank(job, "broadcast", dtype=dtype).values():
            assert r["src"] == n - 1
            check_value(r, values(n - 1, dtype))


def test_reduce(job):
    n, _ = job
    cases = {(r["dtype"], r["op"]) for r in rows(job, "reduce")}
    assert len(cases) == 7
    for dtype, op in cases:
        for rank, r in by_rank(job, "reduce", dtype=dtype, op=op).items():
            if rank == 0:
                check_value(r, reduced(op, [values(k, dtype) for k in range(n)], dtype))
            else:
                assert r["muster"] == {"value": None}, r


def test_all_gather(job):
    n, _ = job
    for dtype in DTYPES:
        for r in by_rank(job, "all_gather", dtype=dtype).values():
            check_value(r, [values(k, dtype) for k in range(n)])
    for dtype in ["float32", "int64", "bool", "complex64", "float16", "int32"]:
        for r in by_rank(job, "all_gather_into_tensor", dtype=dtype).values():
            check_value(r, [x for k in range(n) for x in values(k, dtype)])
    for r in by_rank(job, "all_gather_coalesced").values():
        check_value(r, [[values(k, "float32", n=3), values(k, "float32", n=2, offset=10)]
                        for k in range(n)])


def test_gather_and_scatter(job):
    n, _ = job
    for dtype in ["float32", "int32"]:
        for rank, r in by_rank(job, "gather", dtype=dtype).items():
            if rank == n - 1:
                check_value(r, [values(k, dtype) for k in range(n)])
            else:
                assert r["muster"] == {"value": None}, r
        for rank, r in by_rank(job, "scatter", dtype=dtype).items():
            check_value(r, values(rank, dtype, offset=10))


def test_reduce_scatter(job):
    n, _ = job
    cases = {(r["dtype"], r["op"]) for r in rows(job, "reduce_scatter")}
    assert len(cases) == 7
    for check in ["reduce_scatter", "reduce_scatter_tensor"]:
        for dtype, op in cases:
            for rank, r in by_rank(job, check, dtype=dtype, op=op).items():
                check_value(r, reduced(op, [values(k, dtype, offset=10 * rank)
                                            for k in range(n)], dtype))


def test_all_to_all(job):
    n, _ = job
    for rank, r in by_rank(job, "all_to_all").items():
        check_value(r, [[100 * i + 10 * rank + k for k in range(rank + 1)] for i in range(n)])
    for rank, r in by_rank(job, "all_to_all_single_equal").items():
        check_value(r, [float(100 * i + 2 * rank + k) for i in range(n) for k in range(2)])
    for rank, r in by_rank(job, "all_to_all_single_uneven").items():
        check_value(r, [[float(1000 * i + 10 * rank + k)] * 3
                        for i in range(n) for k in range(rank + 1)])


def test_point_to_point(job):
    n, _ = job
    for rank, r in by_rank(job, "send_recv").items():
        prv = (rank - 1) % n
        check_value(r, [prv, 10 * prv, 7])
    for rank, r in by_rank(job, "isend_irecv").items():
        check_value(r, [(rank - 1) % n + 0.5] * 4)
    for rank, r in by_rank(job, "batch_isend_irecv").items():
        check_value(r, [[100.0 + (rank - 1) % n] * 3, [200.0 + (rank + 1) % n] * 2])
    for rank, r in by_rank(job, "tag_order").items():
        prv = (rank - 1) % n
        check_value(r, [[prv * 10 + 1.0], [prv * 10 + 2.0]])
    for rank, r in by_rank(job, "recv_any_source").items():
        check_value(r, [[s, 100 + s] for s in range(1, n)] if rank == 0 else None)


def test_object_collectives(job):
    n, _ = job
    for r in by_rank(job, "broadcast_object_list").values():
        check_value(r, [{"from": n - 1, "list": list(range(n + 2))}, "x" * n])
    for r in by_rank(job, "all_gather_object").values():
        check_value(r, [{"rank": k, "pad": "y" * (10 * k)} for k in range(n)])
    for rank, r in by_rank(job, "gather_object").items():
        check_value(r, [["g", k] for k in range(n)] if rank == 0 else None)
    for rank, r in by_rank(job, "scatter_object_list").items():
        check_value(r, {"to": rank, "blob": "z" * rank})


def test_barrier_work_and_future(job):
    n, _ = job
    assert all(r["ok"] for r in by_rank(job, "barrier").values())
    for r in by_rank(job, "work_wait").values():
        assert r["returned"] is True and r["completed"] is True
        assert r["value"] == [n * (n + 1) / 2] * 3
    for r in by_rank(job, "get_future").values():
        total = float(sum(range(n)))
        assert r["value"] == [[total] * 2]
        assert r["chained"] == [[2 * total] * 2]
        assert r["same_tensor"] is True  # the future's value is the tensor itself


def test_all_reduce_coalesced(job):
    n, _ = job
    for op in ["SUM", "MAX", "AVG", "PREMUL_SUM"]:
        for r in by_rank(job, "all_reduce_coalesced", op=op).values():
            check_value(r, [reduced(op, [values(k, "float32", n=3) for k in range(n)],
                                    "float32"),
                            reduced(op, [values(k, "float32", n=5, offset=1) for k in range(n)],
                                    "float32")])


def test_premul_sum_reduce_changes_the_root_tensor_only(job):
    n, _ = job
    got = by_rank(job, "premul_reduce_tensors")
    assert len(got) == n
    total = [sum(col) for col in zip(*(got[r]["input"] for r in range(n)))]
    assert got[0]["value"] == pytest.approx([0.5 * v for v in total])
    for r in range(1, n):
        assert got[r]["value"] == got[r]["input"]


def test_a_dropped_async_work_keeps_its_tensors(job):
    n, _ = job
    for r in by_rank(job, "dropped_work").values():
        assert r["value"] == [[100.0 * k + 2 * i for i in range(5)] for k in range(n)]


def test_non_contiguous_input_is_copied(job):
    n, _ = job
    for r in by_rank(job, "non_contiguous_input").values():
        assert r["value"] == [[10.0 * k + 2 * i + 1 for i in range(5)] for k in range(n)]


def test_torch2_coalesced_collectives(job):
    n, j = job
    got = rows(job, "allgather_into_tensor_coalesced")
    init = by_rank(job, "init")[0]
    if int(init["torch"].split(".")[0]) < 2:
        assert got == []  # torch 1.13 has no such ops
        return
    assert len(got) == n
    for r in got:
        assert r["value"] == [[x for k in range(n) for x in values(k, "float32", n=3)],
                              [x for k in range(n) for x in values(k, "int64", n=2)]]
    for rank, r in by_rank(job, "reduce_scatter_tensor_coalesced").items():
        assert same(r["value"], [
            reduced("SUM", [values(k, "float32", n=3, offset=10 * rank) for k in range(n)],
                    "float32"),
            reduced("SUM", [values(k, "float64", n=2, offset=10 * rank) for k in range(n)],
                    "float64")])


def test_subgroups(job):
    n, _ = job
    for kind in ["new_group", "new_subgroups"]:
        got = by_rank(job, "subgroup", kind=kind)
        for rank, r in got.items():
            if kind == "new_group":
                ranks = list(range(1, n))
            else:
                ranks = [rank // 2 * 2, rank // 2 * 2 + 1]
            assert r["ranks"] == ranks
            if not r["member"]:
                assert rank == 0 and r["not_member"] is True
                continue
            me = ranks.index(rank)
            assert r["group_rank"] == me and r["group_size"] == len(ranks)
            expected = {
                "all_reduce": reduced("SUM", [values(k, "float32") for k in ranks], "float32"),
                "broadcast": values(ranks[-1], "int64"),
                "all_gather_into_tensor": [x for k in ranks for x in values(k, "float64")],
                "all_to_all_single": [float(100 * k + 2 * me + i) for k in ranks
                                      for i in range(2)],
                "all_gather_object": ranks,
            }
            if len(ranks) > 1:
                expected["ring"] = [float(ranks[(me - 1) % len(ranks)])] * 2
            assert sorted(r["muster"]) == sorted(expected), r
            for op, value in expected.items():
                assert r["muster"][op] == {"value": r["muster"][op].get("value")}, (op, r)
                assert same(r["muster"][op]["value"], value), (op, r)
                if "value" in r["gloo"][op]:
                    assert r["muster"][op] == r["gloo"][op], (op, r)
