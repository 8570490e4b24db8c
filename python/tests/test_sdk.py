"""The Python SDK (import muster) on real ranks under muster-run, world 2
and 4: every collective on numpy arrays, bytearray and memoryview, byte
blobs, point to point, groups, the store, and errors that name the problem
without breaking the group."""
import pytest

from conftest import TESTS, run_job


@pytest.fixture(scope="module", params=[2, 4])
def job(request):
    j = run_job(request.param, TESTS / "sdk_ranks.py", timeout=120)
    assert j.returncode == 0, j.output
    return request.param, j


def results(job, check):
    n, j = job
    got = {r["rank"]: r for r in j.results if r["check"] == check}
    return n, got


def test_every_rank_finished(job):
    n, j = job
    for r in range(n):
        assert f"RANK {r} DONE" in j.output, j.output
    _, w = results(job, "world")
    assert w[0]["size"] == n and w[0]["group"] == "py-world" and w[0]["ranks"] == list(range(n))


def test_all_reduce_every_dtype(job):
    n, j = job
    sums = [r for r in j.results if r["check"] == "all_reduce_sum"]
    assert len(sums) == 7 * n
    for r in sums:
        expected = [n * i + n * (n - 1) // 2 for i in range(5)]
        if r["dtype"] == "int8":
            expected = [((v + 128) % 256) - 128 for v in expected]
        if r["dtype"] == "uint8":
            expected = [v % 256 for v in expected]
        assert r["value"] == expected, r


def test_reduce_ops(job):
    n, got = results(job, "all_reduce_max")
    assert all(v["value"] == [float(n), 0.0, 3.0] for v in got.values())
    _, got = results(job, "all_reduce_product")
    fact = 1
    for i in range(1, n + 1):
        fact *= i
    assert all(v["value"] == [float(fact), 2.0 ** n] for v in got.values())
    _, got = results(job, "all_reduce_avg")
    assert all(v["value"] == pytest.approx([(n + 1) / 2, 2.0]) for v in got.values())
    _, got = results(job, "all_reduce_bxor")
    x = 0
    for r in range(n):
        x ^= 0b1010 | r
    assert all(v["value"] == [x, 0 if n % 2 == 0 else 0b0110] for v in got.values())
    _, got = results(job, "all_reduce_bool_bor")
    assert all(v["value"] == [True, True] for v in got.values())


def test_other_buffer_types(job):
    n, got = results(job, "bytearray")
    assert all(v["value"] == [n * (n - 1) // 2, n, 2 * n] for v in got.values())
    _, got = results(job, "memoryview")
    assert all(v["value"] == [n * (n - 1) // 2, 10 * n] for v in got.values())


def test_rooted_and_gathering_collectives(job):
    n, j = job
    _, got = results(job, "broadcast")
    assert all(v["value"] == [7, 7, 7] for v in got.values())
    _, got = results(job, "reduce")
    assert got[0]["value"] == [n * (n + 1) // 2]
    _, got = results(job, "all_gather")
    assert all(v["value"] == [[r, 10 * r] for r in range(n)] for v in got.values())
    _, got = results(job, "all_gather_into")
    assert all(v["value"] == [x for r in range(n) for x in (r, -r)] for v in got.values())
    _, got = results(job, "gather")
    assert list(got) == [0] and got[0]["value"] == [[3 * r] for r in range(n)]
    _, got = results(job, "scatter")
    assert all(v["value"] == [r, 100 + r] for r, v in got.items())
    _, got = results(job, "reduce_scatter")
    assert all(v["value"] == [n * r, n * (n - 1) / 2] for r, v in got.items())
    _, got = results(job, "reduce_scatter_into")
    assert all(v["value"] == [r * n * (n + 1) / 2] for r, v in got.items())
    _, got = results(job, "all_to_all")
    assert all(v["value"] == [[10 * i + r] for i in range(n)] for r, v in got.items())
    _, got = results(job, "all_to_all_single")
    assert all(v["value"] == [i for i in range(n) for _ in range(i + 1)]
               for r, v in got.items())


def test_byte_blobs(job):
    n, got = results(job, "broadcast_bytes")
    assert all(v["value"] == "root-data" for v in got.values())
    _, got = results(job, "all_gather_bytes")
    assert all(v["value"] == ["x" * (i + 1) for i in range(n)] for v in got.values())
    _, got = results(job, "gather_bytes")
    assert got[0]["value"] == [f"g{i}" for i in range(n)]
    assert all(got[r]["value"] is None for r in range(1, n))
    _, got = results(job, "scatter_bytes")
    assert all(v["value"] == f"to{r}" for r, v in got.items())


def test_point_to_point_and_async(job):
    n, got = results(job, "ring")
    assert all(v["value"] == (r - 1) % n for r, v in got.items())
    _, got = results(job, "batch")
    assert all(v["value"] == [(r - 1) % n] * 2 for r, v in got.items())
    _, got = results(job, "any_source")
    assert got[0]["senders"] == list(range(1, n)), got
    _, got = results(job, "async")
    for v in got.values():
        assert v["completed"] and v["sequence"] >= 1 and v["exception"] is None
        assert v["value"] == [float(n)] * 4


def test_bad_arguments_raise_and_the_group_survives(job):
    n, j = job
    expect = {
        "err_band_float": ("InvalidArgumentError", "INVALID_ARGUMENT", "float32"),
        "err_splits": ("InvalidArgumentError", "INVALID_ARGUMENT", "split"),
        "err_dtype": ("InvalidArgumentError", "INVALID_ARGUMENT", "uint16"),
        "err_readonly": ("InvalidArgumentError", "INVALID_ARGUMENT", "read-only"),
        "err_root": ("InvalidArgumentError", "INVALID_ARGUMENT", "root"),
        "err_op": ("InvalidArgumentError", "INVALID_ARGUMENT", "median"),
        "err_not_buffer": ("InvalidArgumentError", "INVALID_ARGUMENT", "list"),
    }
    for check, (typ, code, word) in expect.items():
        _, got = results(job, check)
        assert len(got) == n, check
        for v in got.values():
            e = v["error"]
            assert e is not None, check
            assert (e["type"], e["code"]) == (typ, code), (check, e)
            assert word.lower() in e["message"].lower(), (check, e)
    _, got = results(job, "after_errors")
    assert all(v["value"] == [float(n)] for v in got.values())


def test_groups(job):
    n, got = results(job, "subgroup")
    evens = [r for r in range(n) if r % 2 == 0]
    for r, v in got.items():
        assert v["name"] == "py-evens" and v["size"] == len(evens) and v["ranks"] == evens
        assert v["group_rank"] == (evens.index(r) if r in evens else -1)
    _, got = results(job, "subgroup_sum")
    assert sorted(got) == evens
    assert all(v["value"] == sum(evens) and v["global0"] == 0 for v in got.values())
    _, got = results(job, "subgroups")
    for r, v in got.items():
        assert v["count"] == n // 2 and v["value"] == 2
        assert v["my_ranks"] == [r - r % 2, r - r % 2 + 1]
    _, got = results(job, "err_group_rank")
    assert all(v["error"]["type"] == "InvalidArgumentError" for v in got.values())


def test_store(job):
    n, got = results(job, "store")
    for r, v in got.items():
        assert v["peer"] == f"v{(r + 1) % n}"
        assert v["counter"] == n * (n + 1) // 2
        assert v["check"] is False and v["num_keys"] is True
        assert v["keys"] == sorted(f"k{i}" for i in range(n))
    _, got = results(job, "store_missing")
    assert all(v["error"]["type"] == "DeadlineExceededError" for v in got.values())
    _, got = results(job, "store_ops")
    v = got[0]
    assert v["app"] == "abcd"
    assert (v["cas_new"], v["cas_wrong"], v["cas_right"]) == ("one", "one", "two")
    assert (v["deleted"], v["deleted_again"]) == (True, False)


def test_wait_with_a_timeout_gives_up_while_a_peer_is_late(job):
    n, got = results(job, "wait_timeout")
    e = got[0]["error"]
    assert e is not None and e["type"] == "DeadlineExceededError", got[0]
    assert got[0]["waited"] < 1.0, got[0]  # the late peer came after 1.5 s
    assert all(v["value"] == [float(n)] * 2 for v in got.values())
