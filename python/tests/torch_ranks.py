#!/usr/bin/env python3
"""One rank of the torch backend tests (test_torch_*.py), run under muster-run
(or torchrun). Usage: torch_ranks.py MODE [ARGS]; modes:

  collectives  every collective, dtype and reduce op through "muster", next to
               the same call on a gloo group over the same ranks; subgroups
  ddp          DDP training (examples/torch_ddp.py's model) on muster and gloo
  errors       bad arguments, Work.wait(timeout), monitored_barrier, group
               formation timeout, musterctl visibility, desync (last)
  kill DIR     the last rank SIGKILLs itself; the others time their errors
               and write them to DIR/rank<R>.json at once
  torchrun     a short job under torchrun with a running musterd
  trace MUSTERCTL  a scripted sequence of collectives on the default group and
               a subgroup, then rank 0 reads `musterctl trace --json`

Each check prints `RESULT {json}` with the rank and check name; values are
lists (complex tensors as their real view). The tests compute what to expect.
"""
import datetime
import gc
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import warnings

import torch
import torch.distributed as dist

warnings.filterwarnings("ignore", message=".*deprecated.*")

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO / "examples"))
import muster.torch  # noqa: E402  registers "muster"

TORCH2 = int(torch.__version__.split(".")[0]) >= 2
RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])

DTYPES = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "int32": torch.int32,
    "int64": torch.int64,
    "bool": torch.bool,
    "complex64": torch.complex64,
    "complex128": torch.complex128,
}
OPS = ["SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM"]
PREMUL_FACTOR = 0.5


def report(check, **fields):
    print("RESULT " + json.dumps({"rank": RANK, "check": check, **fields}), flush=True)


def as_list(t):
    if t.is_complex():
        t = torch.view_as_real(t)
    if t.dtype in (torch.float16, torch.bfloat16):
        t = t.float()
    return t.tolist()


def attempt(fn):
    """{"value": fn()} or {"error": "<type>: <message>"}."""
    try:
        return {"value": fn()}
    except Exception as e:  # noqa: BLE001  the tests look at the message
        return {"error": f"{type(e).__name__}: {e}"}


def reduce_op(name, tensor_factor=False):
    if name == "PREMUL_SUM":
        if tensor_factor:
            f = torch.tensor([PREMUL_FACTOR], dtype=torch.float64)
            return dist._make_nccl_premul_sum(f if TORCH2 else [f])
        return dist._make_nccl_premul_sum(PREMUL_FACTOR)
    return getattr(dist.ReduceOp, name)


def values(rank, dtype_name, n=5, offset=0):
    """Rank `rank`'s input: small integers (exact in every dtype)."""
    base = [rank + 1, 2 * rank, 3, 1 - rank, (rank * 5) % 7, rank + 2, 4 - rank][:n]
    base = [v + offset for v in base]
    dtype = DTYPES[dtype_name]
    if dtype == torch.uint8:
        return torch.tensor([abs(v) for v in base], dtype=dtype)
    if dtype == torch.bool:
        return torch.tensor([v % 2 == 1 for v in base], dtype=dtype)
    if dtype.is_complex:
        return torch.tensor([complex(v, rank - 1) for v in base], dtype=dtype)
    return torch.tensor(base, dtype=dtype)


def both(check, make, run, group_pair, **fields):
    """Runs `run(tensors, group)` on muster and on gloo over fresh inputs from
    `make()`; reports the input and both outputs (or errors)."""
    mg, gg = group_pair
    inputs = make()
    out = attempt(lambda: run(make(), mg))
    ref = attempt(lambda: run(make(), gg))
    report(check, input=as_list(inputs) if isinstance(inputs, torch.Tensor) else None,
           muster=out, gloo=ref, **fields)


# ---- collectives -------------------------------------------------------------


def check_all_reduce(groups):
    for dn in DTYPES:
        for op in OPS:
            def run(t, g, op=op):
                dist.all_reduce(t, op=reduce_op(op), group=g)
                return as_list(t)
            both("all_reduce", lambda dn=dn: values(RANK, dn), run, groups, dtype=dn, op=op)
    # PREMUL_SUM with a tensor factor.
    def run_tf(t, g):
        dist.all_reduce(t, op=reduce_op("PREMUL_SUM", tensor_factor=True), group=g)
        return as_list(t)
    both("all_reduce", lambda: values(RANK, "float32"), run_tf, groups, dtype="float32",
         op="PREMUL_SUM_TENSOR")
    # The group still works after the combinations muster refused.
    t = torch.ones(3)
    dist.all_reduce(t)
    report("after_reduce_errors", value=as_list(t))


def check_broadcast_reduce(groups):
    src = WORLD - 1
    for dn in DTYPES:
        def run(t, g):
            dist.broadcast(t, src=src, group=g)
            return as_list(t)
        both("broadcast", lambda dn=dn: values(RANK, dn), run, groups, dtype=dn, src=src)
    for dn, op in [("float32", "SUM"), ("float32", "MAX"), ("float32", "AVG"),
                   ("float64", "PREMUL_SUM"), ("int64", "PRODUCT"), ("int32", "BXOR"),
                   ("bfloat16", "MIN")]:
        def run(t, g, op=op):
            dist.reduce(t, dst=0, op=reduce_op(op), group=g)
            return as_list(t) if RANK == 0 else None
        both("reduce", lambda dn=dn: values(RANK, dn), run, groups, dtype=dn, op=op, dst=0)


def check_gathers(groups):
    for dn in DTYPES:
        def run(t, g, dn=dn):
            out = [torch.zeros_like(t) for _ in range(WORLD)]
            dist.all_gather(out, t, group=g)
            return [as_list(o) for o in out]
        both("all_gather", lambda dn=dn: values(RANK, dn), run, groups, dtype=dn)
    for dn in ["float32", "int64", "bool", "complex64", "float16"]:
        def run(t, g):
            out = torch.zeros(WORLD * t.numel(), dtype=t.dtype)
            dist.all_gather_into_tensor(out, t, group=g)
            return as_list(out)
        both("all_gather_into_tensor", lambda dn=dn: values(RANK, dn), run, groups, dtype=dn)
    # 2-D output stacked along dim 0.
    def run2d(t, g):
        out = torch.zeros(WORLD, t.numel(), dtype=t.dtype)
        dist.all_gather_into_tensor(out, t, group=g)
        return as_list(out.flatten())
    both("all_gather_into_tensor", lambda: values(RANK, "int32"), run2d, groups, dtype="int32")

    def run_coalesced(_, g):
        ins = [values(RANK, "float32", n=3), values(RANK, "float32", n=2, offset=10)]
        outs = [[torch.zeros_like(t) for t in ins] for _ in range(WORLD)]
        dist.all_gather_coalesced(outs, ins, group=g)
        return [[as_list(t) for t in l] for l in outs]
    both("all_gather_coalesced", lambda: values(RANK, "float32", n=3), run_coalesced, groups)

    for dn in ["float32", "int32"]:
        dst = WORLD - 1

        def run(t, g):
            out = [torch.zeros_like(t) for _ in range(WORLD)] if RANK == dst else None
            dist.gather(t, gather_list=out, dst=dst, group=g)
            return [as_list(o) for o in out] if RANK == dst else None
        both("gather", lambda dn=dn: values(RANK, dn), run, groups, dtype=dn, dst=dst)

        def run_scatter(t, g, dn=dn):
            ins = [values(i, dn, offset=10) for i in range(WORLD)] if RANK == 0 else None
            dist.scatter(t, scatter_list=ins, src=0, group=g)
            return as_list(t)
        both("scatter", lambda dn=dn: torch.zeros(5, dtype=DTYPES[dn]), run_scatter, groups,
             dtype=dn, src=0)


def check_reduce_scatter(groups):
    # Rank r's input for destination j: values(r, offset=10*j).
    for dn, op in [("float32", "SUM"), ("float32", "MAX"), ("float64", "AVG"),
                   ("float32", "PREMUL_SUM"), ("int32", "BAND"), ("int64", "SUM"),
                   ("float16", "SUM")]:
        def run(_, g, dn=dn, op=op):
            ins = [values(RANK, dn, offset=10 * j) for j in range(WORLD)]
            out = torch.zeros_like(ins[0])
            dist.reduce_scatter(out, ins, op=reduce_op(op), group=g)
            return as_list(out)
        both("reduce_scatter", lambda: None, run, groups, dtype=dn, op=op)

        def run_tensor(_, g, dn=dn, op=op):
            inp = torch.cat([values(RANK, dn, offset=10 * j) for j in range(WORLD)])
            out = torch.zeros(5, dtype=inp.dtype)
            dist.reduce_scatter_tensor(out, inp, op=reduce_op(op), group=g)
            return as_list(out)
        both("reduce_scatter_tensor", lambda: None, run_tensor, groups, dtype=dn, op=op)


def check_all_to_all(groups):
    # Rank r sends j+1 elements 100*r + 10*j + k to rank j.
    def run_list(_, g):
        ins = [torch.tensor([100 * RANK + 10 * j + k for k in range(j + 1)]) for j in range(WORLD)]
        outs = [torch.zeros(RANK + 1, dtype=torch.int64) for _ in range(WORLD)]
        dist.all_to_all(outs, ins, group=g)
        return [as_list(o) for o in outs]
    both("all_to_all", lambda: None, run_list, groups)

    def run_equal(_, g):
        inp = torch.arange(WORLD * 2, dtype=torch.float32) + 100 * RANK
        out = torch.zeros(WORLD * 2)
        dist.all_to_all_single(out, inp, group=g)
        return as_list(out)
    both("all_to_all_single_equal", lambda: None, run_equal, groups)

    # Uneven, 2-D: rank r sends j+1 rows of 3 to rank j (row values
    # 1000*r + 10*j + row), so it receives r+1 rows from each rank.
    def run_uneven(_, g):
        in_splits = [j + 1 for j in range(WORLD)]
        rows = [[1000 * RANK + 10 * j + k] * 3 for j in range(WORLD) for k in range(j + 1)]
        inp = torch.tensor(rows, dtype=torch.float64)
        out_splits = [RANK + 1] * WORLD
        out = torch.zeros(sum(out_splits), 3, dtype=torch.float64)
        dist.all_to_all_single(out, inp, output_split_sizes=out_splits,
                               input_split_sizes=in_splits, group=g)
        return as_list(out)
    both("all_to_all_single_uneven", lambda: None, run_uneven, groups)


def check_p2p(groups):
    nxt, prv = (RANK + 1) % WORLD, (RANK - 1) % WORLD

    def run_blocking(_, g):
        send = torch.tensor([RANK, 10 * RANK, 7], dtype=torch.int32)
        recv = torch.zeros(3, dtype=torch.int32)
        if RANK % 2 == 0:
            dist.send(send, dst=nxt, group=g, tag=3)
            dist.recv(recv, src=prv, group=g, tag=3)
        else:
            dist.recv(recv, src=prv, group=g, tag=3)
            dist.send(send, dst=nxt, group=g, tag=3)
        return as_list(recv)
    both("send_recv", lambda: None, run_blocking, groups)

    def run_async(_, g):
        send = torch.full((4,), float(RANK) + 0.5)
        recv = torch.zeros(4)
        reqs = [dist.isend(send, dst=nxt, group=g), dist.irecv(recv, src=prv, group=g)]
        for r in reqs:
            r.wait()
        return as_list(recv)
    both("isend_irecv", lambda: None, run_async, groups)

    def run_batch(_, g):
        send = torch.full((3,), 100.0 + RANK, dtype=torch.float64)
        recv_prev = torch.zeros(3, dtype=torch.float64)
        send2 = torch.full((2,), 200.0 + RANK, dtype=torch.float64)
        recv_next = torch.zeros(2, dtype=torch.float64)
        ops = [dist.P2POp(dist.isend, send, nxt, group=g),
               dist.P2POp(dist.irecv, recv_prev, prv, group=g),
               dist.P2POp(dist.isend, send2, prv, group=g),
               dist.P2POp(dist.irecv, recv_next, nxt, group=g)]
        for r in dist.batch_isend_irecv(ops):
            r.wait()
        return [as_list(recv_prev), as_list(recv_next)]
    both("batch_isend_irecv", lambda: None, run_batch, groups)

    def run_tag_order(_, g):
        # Tags 1 and 2 to the next rank, received in the other order: c10d
        # matches messages by (peer, tag).
        a, b = torch.tensor([RANK * 10 + 1.0]), torch.tensor([RANK * 10 + 2.0])
        ra, rb = torch.zeros(1), torch.zeros(1)
        sends = [dist.isend(a, dst=nxt, group=g, tag=1), dist.isend(b, dst=nxt, group=g, tag=2)]
        dist.recv(rb, src=prv, group=g, tag=2)
        dist.recv(ra, src=prv, group=g, tag=1)
        for r in sends:
            r.wait()
        return [as_list(ra), as_list(rb)]
    both("tag_order", lambda: None, run_tag_order, groups)

    def run_any_source(_, g):
        # recv(src=None) returns the sender's rank.
        if RANK == 0:
            got = []
            for _ in range(WORLD - 1):
                t = torch.zeros(1, dtype=torch.int64)
                src = dist.recv(t, group=g, tag=4)
                got.append([src, int(t.item())])
            return sorted(got)
        dist.send(torch.tensor([100 + RANK]), dst=0, group=g, tag=4)
        return None
    both("recv_any_source", lambda: None, run_any_source, groups)


def check_objects(groups):
    def run_bcast(_, g):
        objs = [{"from": RANK, "list": list(range(RANK + 3))}, "x" * (RANK + 1)]
        dist.broadcast_object_list(objs, src=WORLD - 1, group=g)
        return objs
    both("broadcast_object_list", lambda: None, run_bcast, groups)

    def run_all(_, g):
        out = [None] * WORLD
        dist.all_gather_object(out, {"rank": RANK, "pad": "y" * (10 * RANK)}, group=g)
        return out
    both("all_gather_object", lambda: None, run_all, groups)

    def run_gather(_, g):
        out = [None] * WORLD if RANK == 0 else None
        dist.gather_object(["g", RANK], out, dst=0, group=g)
        return out
    both("gather_object", lambda: None, run_gather, groups)

    def run_scatter(_, g):
        out = [None]
        ins = [{"to": i, "blob": "z" * i} for i in range(WORLD)] if RANK == 0 else None
        dist.scatter_object_list(out, ins, src=0, group=g)
        return out[0]
    both("scatter_object_list", lambda: None, run_scatter, groups)


def check_misc(groups):
    mg, gg = groups
    dist.barrier()
    dist.barrier(group=gg)
    report("barrier", ok=True)

    t = torch.full((3,), float(RANK + 1))
    w = dist.all_reduce(t, async_op=True)
    ok = w.wait()
    report("work_wait", returned=ok, completed=w.is_completed(), value=as_list(t))

    t = torch.full((2,), float(RANK))
    fut = dist.all_reduce(t, async_op=True).get_future()
    chained = fut.then(lambda f: [x * 2 for x in f.value()])
    report("get_future", value=[as_list(x) for x in fut.wait()],
           chained=[as_list(x) for x in chained.wait()],
           same_tensor=fut.value()[0].data_ptr() == t.data_ptr())

    # all_reduce_coalesced: one collective over several tensors.
    for op in ["SUM", "MAX", "AVG", "PREMUL_SUM"]:
        def run(_, g, op=op):
            ts = [values(RANK, "float32", n=3), values(RANK, "float32", n=5, offset=1)]
            dist.all_reduce_coalesced(ts, op=reduce_op(op), group=g)
            return [as_list(x) for x in ts]
        both("all_reduce_coalesced", lambda: None, run, groups, op=op)

    # reduce with PREMUL_SUM changes the root's tensor only (as NCCL does).
    t = values(RANK, "float64")
    dist.reduce(t, dst=0, op=reduce_op("PREMUL_SUM"))
    report("premul_reduce_tensors", value=as_list(t), input=as_list(values(RANK, "float64")))

    # A Work dropped before it completed (async_op=True, handle discarded)
    # keeps its tensors (here the contiguous copy of a strided input) until
    # the collective is done; memory freed meanwhile is reused by junk.
    dropped_out = [torch.zeros(5) for _ in range(WORLD)]

    def issue():
        base = torch.arange(10, dtype=torch.float32).reshape(5, 2) + 100 * RANK
        dist.all_gather(dropped_out, base[:, 0], async_op=True)
    issue()
    gc.collect()
    junk = [torch.full((5,), -1.0) for _ in range(200)]
    dist.barrier()  # after the all_gather: a group's collectives run in order
    report("dropped_work", value=[as_list(o) for o in dropped_out], junk=len(junk))

    # A non-contiguous input is copied (send side of all_gather).
    base = torch.arange(10, dtype=torch.float32).reshape(5, 2) + 10 * RANK
    col = base[:, 1]
    out = [torch.zeros(5) for _ in range(WORLD)]
    dist.all_gather(out, col)
    report("non_contiguous_input", value=[as_list(o) for o in out])

    if TORCH2:
        from torch.distributed.distributed_c10d import _coalescing_manager
        cpu = torch.device("cpu")
        ins = [values(RANK, "float32", n=3), values(RANK, "int64", n=2)]
        outs = [torch.zeros(WORLD * 3), torch.zeros(WORLD * 2, dtype=torch.int64)]
        with _coalescing_manager(device=cpu, async_ops=True) as cm:
            for o, i in zip(outs, ins):
                dist.all_gather_into_tensor(o, i)
        cm.wait()
        report("allgather_into_tensor_coalesced", value=[as_list(o) for o in outs])
        ins = [torch.cat([values(RANK, "float32", n=3, offset=10 * j) for j in range(WORLD)]),
               torch.cat([values(RANK, "float64", n=2, offset=10 * j) for j in range(WORLD)])]
        outs = [torch.zeros(3), torch.zeros(2, dtype=torch.float64)]
        with _coalescing_manager(device=cpu, async_ops=True) as cm:
            for o, i in zip(outs, ins):
                dist.reduce_scatter_tensor(o, i)
        cm.wait()
        report("reduce_scatter_tensor_coalesced", value=[as_list(o) for o in outs])


def new_subgroups(size, backend=None):
    """dist.new_subgroups; torch 1.13's refuses without CUDA, so there the
    same new_group calls it would make."""
    try:
        return dist.new_subgroups(group_size=size, backend=backend)
    except ValueError as e:
        if TORCH2 or "CUDA" not in str(e):
            raise
    mine, all_groups = None, []
    for start in range(0, WORLD, size):
        g = dist.new_group(list(range(start, start + size)), backend=backend)
        all_groups.append(g)
        if start <= RANK < start + size:
            mine = g
    return mine, all_groups


def check_subgroups():
    """new_group over ranks 1.. (rank 0 is not a member) and new_subgroups of 2,
    each next to the gloo group of the same ranks."""
    cases = []
    members = list(range(1, WORLD))
    m = dist.new_group(members)
    g = dist.new_group(members, backend="gloo")
    cases.append(("new_group", members, m, g))
    size = 2
    msub, _ = new_subgroups(size)
    gsub, _ = new_subgroups(size, backend="gloo")
    start = RANK // size * size
    cases.append(("new_subgroups", list(range(start, start + size)), msub, gsub))
    for name, ranks, mg, gg in cases:
        if RANK not in ranks:
            report("subgroup", kind=name, ranks=ranks, member=False,
                   not_member=mg == dist.GroupMember.NON_GROUP_MEMBER)
            continue
        me = ranks.index(RANK)
        res = {"ranks": ranks, "group_rank": dist.get_rank(mg), "group_size":
               dist.get_world_size(mg)}

        def run_all(gr):
            """Each op's value or error (gloo 1.13 lacks some)."""
            out = {}

            def all_reduce():
                t = values(RANK, "float32")
                dist.all_reduce(t, group=gr)
                return as_list(t)

            def broadcast():
                t = values(RANK, "int64")
                dist.broadcast(t, src=ranks[-1], group=gr)
                return as_list(t)

            def all_gather_into_tensor():
                o = torch.zeros(len(ranks) * 5, dtype=torch.float64)
                dist.all_gather_into_tensor(o, values(RANK, "float64"), group=gr)
                return as_list(o)

            def all_to_all_single():
                inp = torch.arange(len(ranks) * 2, dtype=torch.float32) + 100 * RANK
                o = torch.zeros(len(ranks) * 2)
                dist.all_to_all_single(o, inp, group=gr)
                return as_list(o)

            def ring():
                peer = ranks[(me + 1) % len(ranks)]
                prev = ranks[(me - 1) % len(ranks)]
                r = torch.zeros(2)
                reqs = [dist.isend(torch.full((2,), float(RANK)), dst=peer, group=gr),
                        dist.irecv(r, src=prev, group=gr)]
                for q in reqs:
                    q.wait()
                return as_list(r)

            def all_gather_object():
                dist.barrier(group=gr)
                objs = [None] * len(ranks)
                dist.all_gather_object(objs, RANK, group=gr)
                return objs

            ops = [all_reduce, broadcast, all_gather_into_tensor, all_to_all_single,
                   all_gather_object] + ([ring] if len(ranks) > 1 else [])
            for op in ops:
                out[op.__name__] = attempt(op)
            return out
        report("subgroup", kind=name, member=True, muster=run_all(mg), gloo=run_all(gg), **res)


def mode_collectives():
    dist.init_process_group("muster", timeout=datetime.timedelta(seconds=60))
    gloo = dist.new_group(backend="gloo")
    groups = (None, gloo)
    report("init", world=WORLD, backend=dist.get_backend(), torch=torch.__version__)
    check_all_reduce(groups)
    check_broadcast_reduce(groups)
    check_gathers(groups)
    check_reduce_scatter(groups)
    check_all_to_all(groups)
    check_p2p(groups)
    check_objects(groups)
    check_misc(groups)
    check_subgroups()
    dist.barrier()
    report("done")
    dist.destroy_process_group()


# ---- DDP ---------------------------------------------------------------------


def mode_ddp(steps):
    from torch.nn.parallel import DistributedDataParallel as DDP

    import torch_ddp

    dist.init_process_group("muster", timeout=datetime.timedelta(seconds=60))
    gloo = dist.new_group(backend="gloo")
    results = {}
    initial = torch.cat([p.detach().flatten() for p in torch_ddp.make_model().parameters()])
    for name, group in [("muster", None), ("gloo", gloo)]:
        model = DDP(torch_ddp.make_model(), process_group=group)
        losses = torch_ddp.train(model, RANK, steps)
        params = torch.cat([p.detach().flatten() for p in model.parameters()])
        results[name] = (losses, params.tolist(), (params - initial).abs().max().item())
    report("ddp", steps=steps, muster_losses=results["muster"][0],
           gloo_losses=results["gloo"][0], muster_params=results["muster"][1],
           gloo_params=results["gloo"][1], muster_moved=results["muster"][2])
    dist.destroy_process_group()


# ---- failures ----------------------------------------------------------------


def timed(fn):
    start = time.monotonic()
    try:
        fn()
        return {"ok": True, "seconds": time.monotonic() - start}
    except Exception as e:  # noqa: BLE001
        return {"ok": False, "seconds": time.monotonic() - start,
                "error": f"{type(e).__name__}: {e}", "wall": time.time()}


def mode_kill(out_dir):
    out_dir = Path(out_dir)
    dist.init_process_group("muster", timeout=datetime.timedelta(seconds=60))
    t = torch.ones(4)
    dist.all_reduce(t)
    victim = WORLD - 1
    survivors = dist.new_group(list(range(WORLD - 1)))
    if RANK == victim:
        info = {"rank": RANK, "pid": os.getpid(), "host": socket.gethostname()}
        time.sleep(1.0)  # the others are waiting in their all_reduce by now
        info["killed_at"] = time.time()
        (out_dir / "victim.json").write_text(json.dumps(info))
        os.kill(os.getpid(), signal.SIGKILL)
    # muster-run stops the others once a rank died; report first.
    signal.signal(signal.SIGTERM, lambda *_: None)
    pending = dist.all_reduce(torch.ones(4), async_op=True)
    first = timed(pending.wait)
    second = timed(lambda: dist.all_reduce(torch.ones(4)))
    third = timed(lambda: dist.broadcast(torch.ones(2), src=0))
    # A group without the dead rank goes on working.
    s = torch.ones(2)
    fourth = timed(lambda: dist.all_reduce(s, group=survivors))
    fourth["value"] = as_list(s)
    result = {"rank": RANK, "pending": first, "next": second, "broadcast": third,
              "survivors_group": fourth}
    tmp = out_dir / f"rank{RANK}.json.tmp"
    tmp.write_text(json.dumps(result))
    tmp.rename(out_dir / f"rank{RANK}.json")
    report("kill", **result)
    os._exit(0)


def group_name(pg):
    pg = pg if pg is not None else dist.distributed_c10d._get_default_group()
    return pg.group_name if TORCH2 else dist.distributed_c10d._pg_names[pg]


def mode_errors(musterctl):
    dist.init_process_group("muster", timeout=datetime.timedelta(seconds=30))

    def works():
        t = torch.full((2,), float(RANK))
        dist.all_reduce(t)
        return as_list(t)

    # musterctl shows torch's group names while the job runs.
    sub = dist.new_group([0, 1])
    dist.barrier()
    def groups():
        p = subprocess.run([musterctl, "--socket", os.environ["MUSTER_SOCKET"], "--json",
                            "groups", "--job", os.environ["MUSTER_JOB_ID"]],
                           capture_output=True, text=True, timeout=30)
        return {"returncode": p.returncode, "stdout": p.stdout, "stderr": p.stderr}

    sub_name = group_name(sub) if sub != dist.GroupMember.NON_GROUP_MEMBER else None
    if RANK == 0:
        report("musterctl", torch_names=[group_name(None), sub_name],
               muster_group_name=muster.torch.muster_group().name, **groups())
    dist.barrier()
    # destroy_process_group(sub) destroys the muster group (1.13 drops the
    # backend with its last reference).
    if sub != dist.GroupMember.NON_GROUP_MEMBER:
        dist.destroy_process_group(sub)
    del sub
    gc.collect()
    dist.barrier()
    if RANK == 0:
        report("musterctl_after_destroy", name=sub_name, **groups())

    # Bad arguments: clear errors, and the group still works afterwards.
    bad = {
        "band_float": lambda: dist.all_reduce(torch.ones(3), op=dist.ReduceOp.BAND),
        "avg_int": lambda: dist.all_reduce(torch.ones(3, dtype=torch.int32),
                                           op=dist.ReduceOp.AVG),
        "unsupported_dtype": lambda: dist.all_reduce(torch.ones(3, dtype=torch.int16)),
        "non_contiguous_output": lambda: dist.all_reduce(torch.ones(4, 2).t()),
        # int64 split sizes whose sum wraps past 2^63 back to dim 0.
        "splits_wrap": lambda: dist.all_to_all_single(
            torch.zeros(WORLD * 2), torch.zeros(WORLD * 2),
            input_split_sizes=[2**63 - 1, 2**63 - 1, WORLD * 2 + 2] + [0] * (WORLD - 3),
            output_split_sizes=[2] * WORLD),
        "splits_do_not_add_up": lambda: dist.all_to_all_single(
            torch.zeros(WORLD * 2), torch.zeros(WORLD * 2),
            input_split_sizes=[1] * WORLD, output_split_sizes=[2] * WORLD),
        # Every rank's splits add up, but rank 0 sends rank 1 more than rank 1
        # expects from it.
        "splits_disagree": lambda: dist.all_to_all_single(
            torch.zeros(WORLD * 2), torch.zeros(WORLD * 2),
            input_split_sizes=([3, 1] + [2] * (WORLD - 2)) if RANK == 0 else [2] * WORLD,
            output_split_sizes=([3, 1] + [2] * (WORLD - 2)) if RANK == 0 else [2] * WORLD),
        "broadcast_root_outside": lambda: dist.broadcast(torch.ones(2), src=WORLD + 5),
        "send_to_rank_outside": lambda: dist.send(torch.ones(2), dst=WORLD + 5),
        "all_gather_wrong_count": lambda: dist.all_gather([torch.zeros(2)], torch.ones(2)),
        # The input overlaps the output, one element before it: not any
        # rank's own part (in place), so every rank refuses it.
        "all_gather_into_tensor_overlap": lambda: (lambda buf: dist.all_gather_into_tensor(
            buf[1:1 + 2 * WORLD], buf[:2]))(torch.zeros(2 * WORLD + 1)),
    }
    for name, fn in bad.items():
        r = attempt(fn)
        report("bad_argument", case=name, error=r.get("error"), after=attempt(works))
    # In place, the one overlap all_gather_into_tensor takes: the input is
    # this rank's part of the output.
    out = torch.full((2 * WORLD,), -1.0)
    out[2 * RANK:2 * RANK + 2] = RANK + 1.0
    r = attempt(lambda: dist.all_gather_into_tensor(out, out[2 * RANK:2 * RANK + 2]))
    report("all_gather_in_place", error=r.get("error"), got=out.tolist())

    # PREMUL_SUM scales the caller's tensors in place where muster's call
    # takes no factor (all_reduce_coalesced; reduce at the root). A call that
    # fails to launch (here: the group's muster group destroyed under torch's
    # group) leaves them as they were.
    gone = dist.new_group(list(range(WORLD)))
    dist.barrier()
    muster.torch.build().shutdown(muster.torch._backend(gone))
    coalesced = [torch.full((3,), RANK + 1.0), torch.full((2,), RANK + 3.0)]
    rooted = torch.full((3,), RANK + 1.0)
    launch_errors = [
        attempt(lambda: dist.all_reduce_coalesced(coalesced, op=reduce_op("PREMUL_SUM"),
                                                  group=gone)).get("error"),
        attempt(lambda: dist.reduce(rooted, dst=0, op=reduce_op("PREMUL_SUM"),
                                    group=gone)).get("error"),
    ]
    report("premul_launch_fails", errors=launch_errors, coalesced=[as_list(t) for t in coalesced],
           rooted=as_list(rooted))

    # Work.wait(timeout) while a peer is late; the collective goes on.
    dist.barrier()
    t = torch.full((3,), float(RANK + 1))
    if RANK == 1:
        time.sleep(2.0)
    w = dist.all_reduce(t, async_op=True)
    if RANK == 0:
        first = timed(lambda: w.wait(timeout=datetime.timedelta(milliseconds=300)))
        completed_after_timeout = w.is_completed()
        second = timed(w.wait)
        report("wait_timeout", first=first, completed_after_timeout=completed_after_timeout,
               second=second, value=as_list(t))
    else:
        w.wait()
    report("after_wait_timeout", value=works())

    # monitored_barrier: everyone arrives; then the last rank is late on a
    # group of its own (a barrier that timed out breaks its group).
    muster.torch.monitored_barrier(timeout=datetime.timedelta(seconds=10))
    mb = dist.new_group(list(range(WORLD)))
    dist.barrier()
    if RANK == WORLD - 1:
        time.sleep(3.0)
        report("monitored_barrier", late=True)
    else:
        r = timed(lambda: muster.torch.monitored_barrier(
            mb, timeout=datetime.timedelta(seconds=1)))
        report("monitored_barrier", late=False, **r)
    dist.barrier()
    report("after_monitored_barrier", value=works())

    # A collective that times out on one member fails on every member, the
    # late one too; the error reaches wait(), is_success() and the Work's
    # future (whose callbacks run with it).
    late = dist.new_group(list(range(WORLD)), timeout=datetime.timedelta(seconds=1))
    dist.barrier()
    if RANK == WORLD - 1:
        time.sleep(2.5)
    t = torch.full((2,), float(RANK))
    w = dist.all_reduce(t, group=late, async_op=True)
    fut = w.get_future()
    seen = []

    def callback(f):
        seen.append(f"{type(f).__name__}")
        return f.value()  # raises the collective's error
    chained = fut.then(callback)
    future = timed(fut.wait)
    report("future_error", future=future, wait=timed(w.wait), chained=timed(chained.wait),
           callback_ran=seen, completed=w.is_completed(), success=w.is_success(),
           exception=attempt(lambda: str(w.exception())))
    dist.barrier()
    report("after_future_error", value=works())

    # Group formation timeout: the last rank never creates the group.
    if RANK != WORLD - 1:
        r = timed(lambda: dist.new_group(list(range(WORLD)),
                                         timeout=datetime.timedelta(seconds=2)))
        report("formation_timeout", **r)
    else:
        time.sleep(4.0)
    dist.barrier()
    report("after_formation_timeout", value=works())

    # Desync (last: it breaks the world group): rank 0 all_reduces, the others
    # broadcast.
    if RANK == 0:
        r = timed(lambda: dist.all_reduce(torch.ones(4)))
    else:
        r = timed(lambda: dist.broadcast(torch.ones(4), src=0))
    report("desync", **r)
    report("done")
    os._exit(0)


def mode_torchrun(musterctl):
    assert "MUSTER_JOB_ID" not in os.environ
    dist.init_process_group("muster", timeout=datetime.timedelta(seconds=60))
    t = torch.full((2,), float(RANK + 1))
    dist.all_reduce(t)
    sub = dist.new_group(list(range(WORLD)))
    u = torch.tensor([RANK])
    dist.all_reduce(u, group=sub)
    dist.barrier()
    ctl = None
    if RANK == 0:
        p = subprocess.run([musterctl, "--socket", os.environ["MUSTER_SOCKET"], "--json",
                            "groups"], capture_output=True, text=True, timeout=30)
        ctl = {"returncode": p.returncode, "stdout": p.stdout, "stderr": p.stderr}
    dist.barrier()
    report("torchrun", all_reduce=as_list(t), subgroup=as_list(u),
           run_id=os.environ.get("TORCHELASTIC_RUN_ID"), musterctl=ctl,
           names=[group_name(None), group_name(sub)])
    dist.destroy_process_group()


def mode_gloo_default():
    """A "muster" subgroup under a gloo default group fails at once."""
    dist.init_process_group("gloo")
    t0 = time.monotonic()
    got = attempt(lambda: dist.new_group([0, 1], backend="muster"))
    report("muster_subgroup_of_gloo", error=got.get("error"), seconds=time.monotonic() - t0)
    dist.destroy_process_group()


def mode_trace(musterctl):
    """Collectives musterctl trace must show under torch's group names."""
    dist.init_process_group("muster", timeout=datetime.timedelta(seconds=60))
    sub = dist.new_group([0, 1])
    dist.all_reduce(torch.ones(5, dtype=torch.float32))
    dist.broadcast(torch.zeros(3, dtype=torch.int64), src=1)
    dist.all_reduce(torch.ones(6, dtype=torch.int32), op=dist.ReduceOp.MAX)
    if sub != dist.GroupMember.NON_GROUP_MEMBER:
        dist.all_reduce(torch.ones(4, dtype=torch.float64), group=sub)
        dist.broadcast(torch.ones(2, dtype=torch.int8), src=1, group=sub)
    dist.barrier()
    if RANK == 0:
        p = subprocess.run([musterctl, "--socket", os.environ["MUSTER_SOCKET"], "trace",
                            os.environ["MUSTER_JOB_ID"], "--json"],
                           capture_output=True, text=True, timeout=30)
        report("trace", returncode=p.returncode, stdout=p.stdout, stderr=p.stderr,
               default_name=group_name(None), sub_name=group_name(sub))
    dist.barrier()
    dist.destroy_process_group()


def main():
    mode = sys.argv[1]
    if mode == "collectives":
        mode_collectives()
    elif mode == "ddp":
        mode_ddp(int(sys.argv[2]))
    elif mode == "kill":
        mode_kill(sys.argv[2])
    elif mode == "errors":
        mode_errors(sys.argv[2])
    elif mode == "torchrun":
        mode_torchrun(sys.argv[2])
    elif mode == "trace":
        mode_trace(sys.argv[2])
    elif mode == "gloo_default":
        mode_gloo_default()
    else:
        sys.exit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
