"""The torch.distributed backend "muster".

    import muster.torch  # registers the backend "muster"
    torch.distributed.init_process_group("muster")

Every torch group becomes a muster group of the same name (the default group
is muster's world group), so `musterctl groups` shows a torch job's groups,
and a dead rank, a desynchronized collective or a group that never forms is
an error naming the ranks instead of a hang.

Works with torch 1.13 (Debian's; CPU only) and torch 2.x (CPU and CUDA
tensors). The C++ part is compiled on first import, once per torch version
and Python, into ~/.cache/muster/torch-<torch version>-<python tag>
(MUSTER_TORCH_BUILD_DIR replaces ~/.cache/muster), with torch.utils.cpp_extension and ninja;
no Bazel is needed, only libmuster.so (MUSTER_LIBRARY, or bazel-bin/client/)
and muster.h from this source tree (MUSTER_INCLUDE_DIR overrides). See
_build.py and USAGE.md.

Launch with muster-run, or with torchrun next to a running musterd (see
_options.py for how the job's store is found).

Semantics worth knowing:
  * Non-contiguous input tensors are copied; non-contiguous output (or
    in-place) tensors are an error.
  * Per-call timeouts in c10d options are ignored: muster applies the group's
    timeout (the one given to init_process_group / new_group).
  * recv without a source (recv from any rank) is not supported.
  * torch.distributed.monitored_barrier only runs on gloo; use
    muster.torch.monitored_barrier.
  * The default group should use "muster" (muster's world is joined by every
    rank when the default group is created).
"""

import datetime
import os

import torch
import torch.distributed as dist

from muster.torch import _build
from muster.torch import _options

__all__ = ["build", "monitored_barrier", "muster_group", "BACKEND_NAME"]

BACKEND_NAME = "muster"
_TORCH_MAJOR = int(torch.__version__.split(".")[0])


def build():
    """Builds the C++ extension if needed and loads it; returns the module."""
    return _build.load()


def _daemon_store_port(socket):
    return build().daemon_store_port(socket or "")


def _group_name(pg):
    if _TORCH_MAJOR >= 2:
        return pg.group_name
    return dist.distributed_c10d._pg_names[pg]


def _timeout_seconds(timeout):
    if isinstance(timeout, datetime.timedelta):
        return timeout.total_seconds()
    return float(timeout)


def _create_backend(opts, pg_options=None):
    """torch's creator for "muster" (extended_api: gets DistributedBackendOptions)."""
    ext = build()
    ranks = [int(r) for r in opts.global_ranks_in_group]
    timeout_s = _timeout_seconds(opts.timeout)
    if not ranks:  # the default group
        rank, size, world_name = opts.group_rank, opts.group_size, opts.group_id
    else:
        default = dist.distributed_c10d._get_default_group()
        rank, size, world_name = dist.get_rank(), dist.get_world_size(), _group_name(default)
    world = {}
    if ranks and not ext.world_joined():
        # muster's world is joined with the default group by every rank; a
        # subgroup alone would wait for non-members that never come.
        raise RuntimeError(
            "muster: a group on backend 'muster' needs the default group on 'muster' too "
            "(init_process_group(\"muster\") or \"cpu:muster,cuda:...\"); the default group "
            "here uses '%s'" % dist.get_backend())
    if not ext.world_joined():
        world = _options.world_init_options(rank, size, world_name, timeout_s, os.environ,
                                            _daemon_store_port)
    backend = ext.create_backend(opts.group_rank, opts.group_size, str(opts.group_id), ranks,
                                 timeout_s, world)
    if _TORCH_MAJOR < 2 and ext.epoch() > 0:
        _rejoin_store_barrier(opts.store, size)
    return backend


def _rejoin_store_barrier(store, world_size):
    """torch 1.13 ends init_process_group and new_group with a store-based
    barrier that waits until the group's counter equals the world size. A
    process that replaced a failed rank (muster epoch > 0) creates groups the
    survivors passed that barrier for long ago: it would count to
    world size + 1 and wait forever. Take one count back first, so that its
    own makes the world size again. A barrier the survivors have not all
    passed (a group new to every rank) is left alone. (Two replacements of
    one torch 1.13 job creating the same group at once can still disagree.)"""
    c10d = dist.distributed_c10d
    key = f"{c10d.STORE_BASED_BARRIER_PREFIX}:{c10d._group_count}"
    base = getattr(store, "underlying_store", store)
    for _ in range(100):
        count = base.add(key, 0)
        if count < world_size:
            return
        now = base.compare_set(key, str(count), str(count - 1))
        if int(now) == count - 1:
            return


def _backend(group):
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if pg is None or pg == dist.GroupMember.NON_GROUP_MEMBER:
        raise ValueError("muster: this rank is not a member of the group")
    backend = pg._get_backend(torch.device("cpu")) if _TORCH_MAJOR >= 2 else pg
    # TORCH_DISTRIBUTED_DEBUG=DETAIL wraps backends in a checking wrapper.
    while hasattr(backend, "wrapped_pg"):
        backend = backend.wrapped_pg
    return backend


def muster_group(group=None):
    """The muster.Group of a torch group (default: the default group)."""
    import muster
    handle = build().group_handle(_backend(group))  # a new reference: the Group adopts it
    return muster.Group(handle)


def monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
    """c10d's monitored_barrier on a "muster" group.

    Raises RuntimeError (DEADLINE_EXCEEDED) naming every rank that did not
    arrive within `timeout` (a timedelta; default: the group's timeout).
    muster always names all missing ranks, so wait_all_ranks is ignored.
    """
    del wait_all_ranks
    timeout_s = 0.0 if timeout is None else _timeout_seconds(timeout)
    build().monitored_barrier(_backend(group), timeout_s)


def epoch():
    """The job epoch this process is in: 0 at start, +1 per reconfigure; a
    process that replaced a failed rank starts past 0 (-1 before joining)."""
    return build().epoch()


def reconfigure(timeout=None):
    """Elastic jobs with the "muster" backend: after a member died (a
    collective raised), the survivors call this, and a replacement process
    (same RANK) does the same inside init_process_group; every rank joins
    the job's next epoch and every muster group is formed again under it,
    so torch's group objects stay valid. Returns the new epoch.
    `timeout`: a timedelta (default: the world's timeout)."""
    timeout_s = 0.0 if timeout is None else _timeout_seconds(timeout)
    return build().reconfigure(timeout_s)


def _register():
    if BACKEND_NAME.upper() in getattr(dist.Backend, "_plugins", {}):
        return
    if _TORCH_MAJOR >= 2:
        dist.Backend.register_backend(BACKEND_NAME, _create_backend, extended_api=True,
                                      devices=["cpu", "cuda"])
    else:
        dist.Backend.register_backend(BACKEND_NAME, _create_backend, extended_api=True)


build()
_register()
