#!/usr/bin/python3
"""One PyTorch rank that rendezvouses through musterd's TCP store.

Usage: torch_ranks.py MODE RANK WORLD PORT
  MODE  agent     every rank is a client through torchelastic's agent-store
                  path: TORCHELASTIC_USE_AGENT_STORE=True, env:// init
        explicit  the rank builds TCPStore(is_master=False) itself and passes
                  store= to init_process_group

PyTorch never binds PORT: the store server is musterd. Runs gloo all_reduce,
barrier, new_group([0, 1]) with an all_reduce among its members, broadcast, and
(rank 0 only) store semantics through the store object. Prints "RANK r OK" at
the end; any failure exits non-zero with a message on stderr.

Needs Debian's python3-torch 1.13 (run it with /usr/bin/python3).
"""
import os
import sys
import threading
import time
import traceback
from datetime import timedelta

HOST = "127.0.0.1"
STORE_TIMEOUT = timedelta(seconds=60)
ADDS_PER_RANK = 200


class CheckFailed(Exception):
    pass


def check(cond, what):
    if not cond:
        raise CheckFailed(what)


def log(rank, msg):
    now = time.time()
    stamp = time.strftime("%H:%M:%S", time.localtime(now)) + f".{int(now * 1000) % 1000:03d}"
    sys.stderr.write(f"[rank {rank} {stamp}] {msg}\n")
    sys.stderr.flush()


def init(dist, mode, rank, world, port):
    """Returns a store object that reaches musterd's store (un-prefixed for
    explicit mode, the agent-store wrapper's raw client otherwise)."""
    if mode == "agent":
        os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "True"
        os.environ["TORCHELASTIC_RESTART_COUNT"] = "0"
        os.environ["MASTER_ADDR"] = HOST
        os.environ["MASTER_PORT"] = str(port)
        os.environ["RANK"] = str(rank)
        os.environ["WORLD_SIZE"] = str(world)
        dist.init_process_group("gloo", init_method="env://",
                                timeout=timedelta(seconds=60))
        # The default group's store is PrefixStore("default_pg",
        # PrefixStore("/worker/attempt_0", TCPStore)); for the semantics
        # checks we open our own plain client on the same server.
        return dist.TCPStore(HOST, port, world, is_master=False,
                             timeout=STORE_TIMEOUT, wait_for_workers=False)
    if mode == "explicit":
        store = dist.TCPStore(HOST, port, world, is_master=False,
                              timeout=STORE_TIMEOUT)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                                timeout=timedelta(seconds=60))
        return store
    raise CheckFailed(f"unknown mode {mode!r} (agent or explicit)")


def collectives(torch, dist, rank, world):
    # all_reduce: sum of (rank + 1) * [1, 2, 3] over all ranks, exact ints.
    t = torch.tensor([1, 2, 3], dtype=torch.int64) * (rank + 1)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    s = world * (world + 1) // 2
    check(t.tolist() == [s, 2 * s, 3 * s], f"all_reduce: got {t.tolist()}, want {[s, 2 * s, 3 * s]}")

    f = torch.full((4,), float(rank))
    dist.all_reduce(f)
    check(f.tolist() == [float(world * (world - 1) // 2)] * 4, f"float all_reduce: got {f.tolist()}")

    dist.barrier()

    # new_group must be called by every rank, members or not.
    members = [0, 1]
    sub = dist.new_group(members)
    if rank in members:
        u = torch.tensor([10 ** rank], dtype=torch.int64)
        dist.all_reduce(u, group=sub)
        check(u.item() == 11, f"subgroup all_reduce: got {u.item()}, want 11")
        check(dist.get_world_size(sub) == 2, f"subgroup size {dist.get_world_size(sub)}")
        check(dist.get_rank(sub) == rank, f"subgroup rank {dist.get_rank(sub)}")
        dist.barrier(group=sub)

    # broadcast from the last rank.
    src = world - 1
    b = torch.arange(5, dtype=torch.int64) + 100 if rank == src else torch.zeros(5, dtype=torch.int64)
    dist.broadcast(b, src=src)
    check(b.tolist() == [100, 101, 102, 103, 104], f"broadcast: got {b.tolist()}")

    dist.barrier()


def expect_raises(what, fn):
    try:
        fn()
    except RuntimeError as e:  # 1.13 raises RuntimeError ("Socket Timeout", ...)
        return str(e)
    raise CheckFailed(f"{what} did not raise")


def store_semantics(dist, store, rank, world, port, mode):
    """Only rank 0. Keys live under a per-mode prefix so the two modes, which
    share one daemon, do not see each other's leftovers."""
    p = f"muster_compat_{mode}/"
    # set/get, overwrite, binary value.
    store.set(p + "k", "v1")
    check(store.get(p + "k") == b"v1", "get after set")
    store.set(p + "k", b"\x00\xffbin\n")
    check(store.get(p + "k") == b"\x00\xffbin\n", "get after overwrite with binary value")

    # add: missing key starts from the delta; stored as decimal text.
    check(store.add(p + "ctr", 5) == 5, "add on missing key")
    check(store.add(p + "ctr", -7) == -2, "add negative delta")
    check(store.add(p + "ctr", 0) == -2, "add 0 reads the counter")
    check(store.get(p + "ctr") == b"-2", f"counter as text: {store.get(p + 'ctr')!r}")

    # compare_set, the three cases of 1.13's server.
    check(store.compare_set(p + "cs", "", "first") == b"first", "compare_set create on missing key")
    check(store.get(p + "cs") == b"first", "compare_set created the key")
    check(store.compare_set(p + "cs", "first", "second") == b"second", "compare_set match swaps")
    check(store.compare_set(p + "cs", "nope", "third") == b"second",
          "compare_set mismatch returns current")
    check(store.get(p + "cs") == b"second", "compare_set mismatch leaves value")
    n_before = store.num_keys()
    check(store.compare_set(p + "cs_missing", "x", "y") == b"x",
          "compare_set on missing key with expected returns expected")
    check(store.num_keys() == n_before, "compare_set with expected created a missing key")

    # wait on present keys returns; num_keys; delete_key.
    store.wait([p + "k", p + "ctr"], timedelta(seconds=5))
    n0 = store.num_keys()
    check(store.delete_key(p + "cs") is True, "delete_key of a present key")
    check(store.delete_key(p + "cs") is False, "delete_key of a missing key")
    check(store.num_keys() == n0 - 1, f"num_keys after delete: {store.num_keys()} vs {n0 - 1}")

    # wait wakes when another client sets the key.
    other = dist.TCPStore(HOST, port, world, is_master=False, timeout=STORE_TIMEOUT,
                          wait_for_workers=False)
    t0 = time.monotonic()
    setter = threading.Timer(0.3, lambda: other.set(p + "late", "here"))
    setter.start()
    store.wait([p + "late"], timedelta(seconds=10))
    setter.join()
    check(store.get(p + "late") == b"here", "value set by another client")
    check(time.monotonic() - t0 < 9, "wait took the whole timeout")

    # A wait on several keys returns only once the last missing one is set
    # (one present already, the others set one by one, one of them by ADD).
    store.set(p + "m0", "0")
    def set_slowly():
        time.sleep(0.2)
        other.set(p + "m1", "1")
        time.sleep(0.2)
        other.add(p + "m2", 7)
    setter = threading.Thread(target=set_slowly)
    t0 = time.monotonic()
    setter.start()
    store.wait([p + "m0", p + "m1", p + "m2"], timedelta(seconds=10))
    took = time.monotonic() - t0
    setter.join()
    check(took >= 0.35, f"multi-key wait returned after {took:.2f}s, before its last key was set")
    check(store.get(p + "m2") == b"7", "key set by ADD from another client")

    # A 4 MiB binary value crosses many TCP segments both ways.
    big = bytes(range(256)) * (16 << 10)
    store.set(p + "big", big)
    check(other.get(p + "big") == big, "4 MiB value read back by another client")
    check(store.delete_key(p + "big") is True, "delete the 4 MiB value")

    # wait with a timeout on a key nobody sets must raise, after ~the timeout.
    # Done last, on a throw-away client: a timed-out 1.13 wait leaves a stale
    # registration that could desync that connection later (research §2.4).
    waiter = dist.TCPStore(HOST, port, world, is_master=False, timeout=STORE_TIMEOUT,
                           wait_for_workers=False)
    t0 = time.monotonic()
    msg = expect_raises("wait on a missing key",
                        lambda: waiter.wait([p + "never"], timedelta(milliseconds=500)))
    took = time.monotonic() - t0
    check(0.3 <= took < 10, f"timed-out wait took {took:.2f}s")
    log(rank, f"timed-out wait raised after {took:.2f}s: {msg}")
    del waiter
    del other


def main():
    if len(sys.argv) != 5:
        sys.stderr.write("usage: torch_ranks.py MODE RANK WORLD PORT\n")
        return 2
    mode, rank, world, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    try:
        import torch
        import torch.distributed as dist
        log(rank, f"torch {torch.__version__}, mode {mode}, world {world}, port {port}")
        store = init(dist, mode, rank, world, port)
        check(dist.get_rank() == rank and dist.get_world_size() == world, "rank/world after init")
        log(rank, "init_process_group done")
        collectives(torch, dist, rank, world)
        log(rank, "collectives done")
        # Every rank bumps one counter concurrently; rank 0 checks the total.
        shared = f"muster_compat_{mode}/shared"
        for _ in range(ADDS_PER_RANK):
            store.add(shared, 1)
        dist.barrier()
        if rank == 0:
            total = store.add(shared, 0)
            check(total == world * ADDS_PER_RANK,
                  f"concurrent adds: counter {total}, want {world * ADDS_PER_RANK}")
            store_semantics(dist, store, rank, world, port, mode)
            log(rank, "store semantics done")
        dist.barrier()
        dist.destroy_process_group()
    except CheckFailed as e:
        log(rank, f"CHECK FAILED: {e}")
        return 1
    except Exception:
        log(rank, "ERROR:\n" + traceback.format_exc())
        return 1
    print(f"RANK {rank} OK", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
