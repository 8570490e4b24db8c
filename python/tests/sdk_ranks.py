"""A rank of test_sdk.py: the Python SDK (no torch) on numpy arrays,
bytearrays and memoryviews. Prints one `RESULT {json}` line per check with
what it got; test_sdk.py holds the expectations."""
import array
import json
import sys

import numpy as np

import muster


def report(check_name, **values):
    print("RESULT " + json.dumps({"rank": world.rank, "check": check_name, **values}), flush=True)


def error_of(fn):
    try:
        fn()
    except muster.MusterError as e:
        return {"type": type(e).__name__, "code": e.code_name, "message": e.message}
    return None


world = muster.init(world_group_name="py-world")
g = world.group
r, n = world.rank, world.size
report("world", size=n, group=g.name, ranks=g.ranks, job=world.job_id, version=muster.version())

for dt in ("float32", "float64", "int32", "int64", "int8", "uint8", "float16"):
    x = np.arange(5, dtype=dt) + r
    g.all_reduce(x)
    report("all_reduce_sum", dtype=dt, value=x.tolist())
x = np.array([r + 1.0, -r, 3.0], dtype=np.float64)
g.all_reduce(x, op="max")
report("all_reduce_max", value=x.tolist())
x = np.array([r + 1.0, 2.0], dtype=np.float32)
g.all_reduce(x, op=muster.ReduceOp.PRODUCT)
report("all_reduce_product", value=x.tolist())
x = np.array([r + 1.0, 2.0], dtype=np.float32)
g.all_reduce(x, op=muster.ReduceOp.AVG)
report("all_reduce_avg", value=x.tolist())
x = np.array([0b1010 | r, 0b0110], dtype=np.int32)
g.all_reduce(x, op="bxor")
report("all_reduce_bxor", value=x.tolist())
b = np.array([True, r == 0])
g.all_reduce(b, op="bor")
report("all_reduce_bool_bor", value=b.tolist())

ba = bytearray([r, 1, 2])
g.all_reduce(ba)
report("bytearray", value=list(ba))
arr = array.array("i", [r, 10])
g.all_reduce(memoryview(arr))
report("memoryview", value=list(arr))

x = np.full(3, 7 if r == n - 1 else 0, dtype=np.int64)
g.broadcast(x, root=n - 1)
report("broadcast", value=x.tolist())
x = np.array([r + 1], dtype=np.int32)
g.reduce(x, root=0)
report("reduce", value=x.tolist())

out = [np.zeros(2, dtype=np.float32) for _ in range(n)]
g.all_gather(out, np.array([r, r * 10], dtype=np.float32))
report("all_gather", value=[o.tolist() for o in out])
flat = np.zeros(2 * n, dtype=np.int32)
g.all_gather_into(flat, np.array([r, -r], dtype=np.int32))
report("all_gather_into", value=flat.tolist())
outs = [np.zeros(1, dtype=np.int32) for _ in range(n)] if r == 0 else None
g.gather(np.array([r * 3], dtype=np.int32), outs, root=0)
if r == 0:
    report("gather", value=[o.tolist() for o in outs])
mine = np.zeros(2, dtype=np.int64)
ins = [np.array([i, 100 + i], dtype=np.int64) for i in range(n)] if r == 0 else None
g.scatter(mine, ins, root=0)
report("scatter", value=mine.tolist())
o = np.zeros(2, dtype=np.float32)
g.reduce_scatter(o, [np.array([i, r], dtype=np.float32) for i in range(n)])
report("reduce_scatter", value=o.tolist())
o = np.zeros(1, dtype=np.float64)
g.reduce_scatter_into(o, np.arange(n, dtype=np.float64) * (r + 1))
report("reduce_scatter_into", value=o.tolist())
outs = [np.zeros(1, dtype=np.int32) for _ in range(n)]
g.all_to_all(outs, [np.array([10 * r + i], dtype=np.int32) for i in range(n)])
report("all_to_all", value=[x.tolist() for x in outs])
# Uneven splits: rank r sends r + 1 elements to every rank.
in_splits = [r + 1] * n
out_splits = [i + 1 for i in range(n)]
src = np.full(sum(in_splits), r, dtype=np.int32)
dst = np.zeros(sum(out_splits), dtype=np.int32)
g.all_to_all_single(dst, src, out_splits, in_splits)
report("all_to_all_single", value=dst.tolist())

report("broadcast_bytes", value=g.broadcast_bytes(b"root-data" if r == 0 else None, 0).decode())
report("all_gather_bytes", value=[x.decode() for x in g.all_gather_bytes(b"x" * (r + 1))])
got = g.gather_bytes(f"g{r}".encode(), root=0)
report("gather_bytes", value=None if got is None else [x.decode() for x in got])
report("scatter_bytes", value=g.scatter_bytes(
    [f"to{i}".encode() for i in range(n)] if r == 0 else None, 0).decode())

# Point to point around a ring, asynchronous, then a batch.
right, left = (r + 1) % n, (r - 1) % n
got = np.zeros(1, dtype=np.int64)
works = [g.isend(np.array([r], dtype=np.int64), right, tag=3), g.irecv(got, left, tag=3)]
for w in works:
    w.wait(timeout=30)
report("ring", value=int(got[0]))
got2 = np.zeros(2, dtype=np.float32)
ws = g.batch_isend_irecv([("send", np.array([r, r], dtype=np.float32), right),
                          ("recv", got2, left)])
for w in ws:
    w.wait()
report("batch", value=got2.tolist())

# Receives from any source (src=None) name their sender; tags match in any
# order.
if r == 0:
    senders = []
    for _ in range(n - 1):
        v = np.zeros(1, dtype=np.int64)
        senders.append(g.recv(v, None, tag=6))
        assert int(v[0]) == 100 + senders[-1], (v, senders)
    report("any_source", senders=sorted(senders))
else:
    a = g.isend(np.array([100 + r], dtype=np.int64), 0, tag=6)
    a.wait(timeout=30)
    report("any_source", senders=[])

# Async work handles.
x = np.ones(4, dtype=np.float32)
w = g.all_reduce(x, async_op=True)
w.wait(timeout=30)
report("async", completed=w.is_completed(), sequence=w.sequence, exception=w.exception(),
       value=x.tolist())

# A wait with a timeout gives up at it while a peer is late (the collective
# goes on and completes later).
import time
x = np.ones(2, dtype=np.float32)
if r == n - 1:
    time.sleep(1.5)
w = g.all_reduce(x, async_op=True)
t0 = time.monotonic()
err = error_of(lambda: w.wait(timeout=0.3)) if r == 0 else None
waited = time.monotonic() - t0
w.wait()
report("wait_timeout", error=err, waited=waited, value=x.tolist())

# Errors: bad arguments raise and the group still works.
report("err_band_float", error=error_of(lambda: g.all_reduce(np.ones(2, np.float32), op="band")))
report("err_splits", error=error_of(lambda: g.all_to_all_single(
    np.zeros(4, np.int32), np.zeros(4, np.int32), [1] * n, [3] * n)))
report("err_dtype", error=error_of(lambda: g.all_reduce(np.ones(2, np.uint16))))
report("err_readonly", error=error_of(lambda: g.all_reduce(bytes(4))))
report("err_root", error=error_of(lambda: g.broadcast(np.ones(1, np.float32), root=n + 5)))
report("err_op", error=error_of(lambda: g.all_reduce(np.ones(1, np.float32), op="median")))
report("err_not_buffer", error=error_of(lambda: g.all_reduce([1, 2, 3])))
x = np.ones(1, dtype=np.float32)
g.all_reduce(x)
report("after_errors", value=x.tolist())

# Groups: a named subgroup of the even ranks; everyone calls.
evens = world.new_group([i for i in range(n) if i % 2 == 0], name="py-evens")
report("subgroup", name=evens.name, group_rank=evens.rank, size=evens.size, ranks=evens.ranks)
if evens.rank >= 0:
    x = np.array([r], dtype=np.int64)
    evens.all_reduce(x)
    report("subgroup_sum", value=int(x[0]), global0=evens.global_rank(0))
mine_sub, all_subs = world.new_subgroups(2)
x = np.array([1], dtype=np.int32)
mine_sub.all_reduce(x)
report("subgroups", count=len(all_subs), my_ranks=mine_sub.ranks, value=int(x[0]))
report("err_group_rank", error=error_of(lambda: evens.global_rank(99)))
g.monitored_barrier(timeout=30)
g.barrier()

# The store.
s = world.store()
s.set(f"k{r}", f"v{r}")
s.wait([f"k{i}" for i in range(n)], timeout=30)
total = s.add("counter", r + 1)
g.barrier()
report("store", peer=s.get(f"k{(r + 1) % n}").decode(), counter=int(s.get("counter")),
       check=s.check(["k0", "nope"]), num_keys=s.num_keys() >= n + 1,
       keys=sorted(k for k in s.list_keys() if k.startswith("k")))
report("store_missing", error=error_of(lambda: s.get("never", timeout=0.3)))
if r == 0:
    s.append("app", "ab")
    s.append("app", "cd")
    report("store_ops", app=s.get("app").decode(),
           cas_new=s.compare_set("cas", "", "one").decode(),
           cas_wrong=s.compare_set("cas", "zzz", "two").decode(),
           cas_right=s.compare_set("cas", "one", "two").decode(),
           deleted=s.delete_key("app"), deleted_again=s.delete_key("app"))
g.barrier()
evens = mine_sub = all_subs = None
muster.destroy()
print(f"RANK {r} DONE", flush=True)
