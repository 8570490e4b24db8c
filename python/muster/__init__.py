"""muster for Python: join a job, form groups, run collectives, use the store.

    import muster, numpy as np
    world = muster.init()                      # RANK, WORLD_SIZE, ... as env://
    x = np.ones(4, dtype=np.float32)
    world.group.all_reduce(x)                  # in place, like c10d
    evens = world.new_group([0, 2], name="evens")
    store = world.store(); store.set("k", b"v")

Buffers are any C-contiguous buffer-protocol object (numpy arrays,
bytearray, array.array, memoryview) or a torch tensor (CPU; CUDA tensors
go through musterd's NCCL communicators). The dtype comes from the buffer:
numpy's dtype, the buffer format, or the torch dtype. Collectives are in
place on the buffers you pass; with async_op=True they return a Work and
the buffers must stay alive and untouched until it completed.

Errors are exceptions carrying muster's code and message (MusterError and
subclasses such as InvalidArgumentError, DeadlineExceededError,
AbortedError). For torch.distributed, `import muster.torch` registers the
backend "muster".

Thread-safety: every object may be used from several threads; collectives
of one group must be issued in the same order on every member.
"""
import ctypes
import datetime
import enum
import threading

from . import _capi
from ._capi import lib

__all__ = [
    "init", "world", "is_initialized", "destroy", "World", "Group", "Work", "Store",
    "connect_store", "daemon_store_port", "ReduceOp", "DType", "MusterError",
    "InvalidArgumentError", "DeadlineExceededError", "AbortedError", "CancelledError",
    "FailedPreconditionError", "UnavailableError", "NotFoundError", "version",
]


def version():
    """muster's version (of the loaded libmuster.so)."""
    return lib().muster_version().decode()


# ---- errors ----

class MusterError(RuntimeError):
    """A failed muster call: `code` (int, absl/gRPC canonical), `code_name`,
    `message` (muster's text, naming what went wrong)."""

    def __init__(self, code, message):
        self.code = code
        self.code_name = lib().muster_code_name(code).decode()
        self.message = message
        super().__init__(f"{self.code_name}: {message}")


class CancelledError(MusterError):
    pass


class InvalidArgumentError(MusterError, ValueError):
    pass


class DeadlineExceededError(MusterError, TimeoutError):
    pass


class NotFoundError(MusterError):
    pass


class FailedPreconditionError(MusterError):
    pass


class AbortedError(MusterError):
    pass


class UnavailableError(MusterError, ConnectionError):
    pass


_ERRORS = {1: CancelledError, 3: InvalidArgumentError, 4: DeadlineExceededError,
           5: NotFoundError, 9: FailedPreconditionError, 10: AbortedError,
           14: UnavailableError}


def _error(code, message=None):
    if message is None:
        message = lib().muster_last_error().decode(errors="replace")
    return _ERRORS.get(code, MusterError)(code, message)


def _check(code):
    if code != 0:
        raise _error(code)


# ---- types ----

class ReduceOp(enum.IntEnum):
    SUM = 0
    AVG = 1
    PRODUCT = 2
    MIN = 3
    MAX = 4
    BAND = 5
    BOR = 6
    BXOR = 7
    PREMUL_SUM = 8


class DType(enum.IntEnum):
    FLOAT16 = 0
    BFLOAT16 = 1
    FLOAT32 = 2
    FLOAT64 = 3
    INT8 = 4
    UINT8 = 5
    INT32 = 6
    INT64 = 7
    BOOL = 8
    COMPLEX64 = 9
    COMPLEX128 = 10


_SUPPORTED = ("float16, bfloat16 (torch), float32, float64, int8, uint8, int32, int64, "
              "bool, complex64, complex128")

# numpy dtype.str without byte order, and buffer formats.
_NUMPY_DTYPES = {"f2": DType.FLOAT16, "f4": DType.FLOAT32, "f8": DType.FLOAT64,
                 "i1": DType.INT8, "u1": DType.UINT8, "i4": DType.INT32, "i8": DType.INT64,
                 "b1": DType.BOOL, "c8": DType.COMPLEX64, "c16": DType.COMPLEX128}
_TORCH_DTYPES = {"torch.float16": DType.FLOAT16, "torch.bfloat16": DType.BFLOAT16,
                 "torch.float32": DType.FLOAT32, "torch.float64": DType.FLOAT64,
                 "torch.int8": DType.INT8, "torch.uint8": DType.UINT8,
                 "torch.int32": DType.INT32, "torch.int64": DType.INT64,
                 "torch.bool": DType.BOOL, "torch.complex64": DType.COMPLEX64,
                 "torch.complex128": DType.COMPLEX128}


def _format_dtype(fmt, itemsize):
    fmt = fmt.lstrip("@=<>!")
    if fmt in ("f", "d", "e"):
        return {2: DType.FLOAT16, 4: DType.FLOAT32, 8: DType.FLOAT64}.get(itemsize)
    if fmt in ("b", "h", "i", "l", "q", "n"):
        return {1: DType.INT8, 4: DType.INT32, 8: DType.INT64}.get(itemsize)
    if fmt in ("B", "c"):
        return DType.UINT8
    if fmt == "?":
        return DType.BOOL
    if fmt in ("Zf", "Zd"):
        return {8: DType.COMPLEX64, 16: DType.COMPLEX128}.get(itemsize)
    return None


def _timeout_s(timeout):
    """None: the default (0 for the C API); timedelta or seconds."""
    if timeout is None:
        return 0.0
    if isinstance(timeout, datetime.timedelta):
        timeout = timeout.total_seconds()
    timeout = float(timeout)
    if timeout <= 0:
        raise ValueError(f"timeout must be positive, got {timeout}")
    return timeout


class _Buffer:
    """A C view of a Python buffer: the muster_tensor plus what keeps its
    memory alive."""

    __slots__ = ("tensor", "keep")

    def __init__(self, obj, what, writable=True):
        self.keep = obj
        t = _capi.Tensor()
        if type(obj).__module__.startswith("torch") and hasattr(obj, "data_ptr"):
            dtype = _TORCH_DTYPES.get(str(obj.dtype))
            if dtype is None:
                raise InvalidArgumentError(
                    3, f"{what}: torch dtype {obj.dtype} is not supported (supported: "
                    f"{_SUPPORTED})")
            if not obj.is_contiguous():
                raise InvalidArgumentError(3, f"{what}: the tensor is not contiguous")
            if obj.is_conj() or (hasattr(obj, "is_neg") and obj.is_neg()):
                raise InvalidArgumentError(3, f"{what}: the tensor is a lazy conjugate/negative "
                                              "view (call resolve_conj()/resolve_neg() first)")
            t.data = obj.data_ptr() or None
            t.count = obj.numel()
            t.dtype = dtype
            if obj.device.type == "cuda":
                import torch
                t.device = 1
                t.stream = torch.cuda.current_stream(obj.device).cuda_stream or None
            elif obj.device.type != "cpu":
                raise InvalidArgumentError(3, f"{what}: device {obj.device} is not supported "
                                              "(cpu or cuda)")
        elif hasattr(obj, "__array_interface__") and hasattr(obj, "dtype"):
            dtype = _NUMPY_DTYPES.get(obj.dtype.str.lstrip("<>|="))
            if dtype is None or (obj.dtype.byteorder == ">"):
                raise InvalidArgumentError(
                    3, f"{what}: numpy dtype {obj.dtype} is not supported (supported: "
                    f"{_SUPPORTED})")
            if not obj.flags.c_contiguous:
                raise InvalidArgumentError(3, f"{what}: the array is not C-contiguous")
            if writable and not obj.flags.writeable:
                raise InvalidArgumentError(3, f"{what}: the array is read-only")
            t.data = obj.ctypes.data if obj.size else None
            t.count = obj.size
            t.dtype = dtype
        else:
            try:
                view = memoryview(obj)
            except TypeError:
                raise InvalidArgumentError(
                    3, f"{what}: {type(obj).__name__} is not a buffer (pass a numpy array, "
                    "bytearray, memoryview or torch tensor)") from None
            dtype = _format_dtype(view.format, view.itemsize)
            if dtype is None:
                raise InvalidArgumentError(
                    3, f"{what}: buffer format '{view.format}' (itemsize {view.itemsize}) is "
                    f"not supported (supported: {_SUPPORTED})")
            if not view.c_contiguous:
                raise InvalidArgumentError(3, f"{what}: the buffer is not C-contiguous")
            count = view.nbytes // view.itemsize
            if view.nbytes == 0:
                t.data = None
            elif view.readonly:
                if writable:
                    raise InvalidArgumentError(3, f"{what}: the buffer is read-only")
                copy = (ctypes.c_char * view.nbytes).from_buffer_copy(view)
                self.keep = copy
                t.data = ctypes.addressof(copy)
            else:
                chars = (ctypes.c_char * view.nbytes).from_buffer(view.cast("B"))
                self.keep = (obj, chars)
                t.data = ctypes.addressof(chars)
            t.count = count
            t.dtype = dtype
        self.tensor = t


def _buffers(objs, what, writable=True):
    bufs = [_Buffer(o, f"{what}[{i}]", writable) for i, o in enumerate(objs)]
    array = (_capi.Tensor * max(len(bufs), 1))()
    for i, b in enumerate(bufs):
        array[i] = b.tensor
    return bufs, array


def _op(op):
    if isinstance(op, str):
        try:
            return ReduceOp[op.upper()]
        except KeyError:
            raise InvalidArgumentError(
                3, f"unknown reduce op '{op}' (one of {', '.join(o.name for o in ReduceOp)})"
            ) from None
    return int(op)


# ---- work ----

# Works dropped before they completed, with the buffers they still use;
# pruned on every new collective.
# Reentrant: a garbage collection inside _prune_orphans may finalize a Work.
_orphans_lock = threading.RLock()
_orphans = []


def _prune_orphans():
    if not _orphans:  # the common case, without the lock (reads are atomic under the GIL)
        return
    with _orphans_lock:
        if not _orphans:
            return
        pending = []
        for handle, keep in _orphans:
            if lib().muster_work_is_completed(handle):
                lib().muster_work_release(handle)
            else:
                pending.append((handle, keep))
        _orphans[:] = pending


class Work:
    """An asynchronous collective. wait() raises its failure."""

    def __init__(self, handle, keep=None, result=None):
        self._handle = handle
        self._keep = keep
        self._result = result  # called once completed, for byte-blob results

    @property
    def sequence(self):
        """The collective's sequence number in its group (from 1)."""
        return int(lib().muster_work_sequence(self._handle))

    @property
    def source_rank(self):
        """A completed receive: the sender's global rank (else -1)."""
        return int(lib().muster_work_source_rank(self._handle))

    def is_completed(self):
        return bool(lib().muster_work_is_completed(self._handle))

    def wait(self, timeout=None):
        """Blocks until completed (raises DeadlineExceededError after
        `timeout`; the collective itself goes on), raises its failure, and
        returns its result (byte-blob collectives) or None."""
        t = -1.0 if timeout is None else _timeout_s(timeout)
        _check(lib().muster_work_wait(self._handle, t))
        return self.result()

    def exception(self):
        """None if it succeeded (or has not completed), else its error."""
        if not self.is_completed():
            return None
        code = lib().muster_work_status(self._handle)
        return None if code == 0 else _error(code)

    def synchronize(self, timeout=None):
        """CUDA collectives: also blocks until the GPU finished them."""
        t = -1.0 if timeout is None else _timeout_s(timeout)
        _check(lib().muster_work_synchronize(self._handle, t))

    def result(self):
        """The byte-blob result once completed (None for other collectives)."""
        if self._result is None:
            return None
        if not self.is_completed():
            raise FailedPreconditionError(9, "the collective has not completed yet (wait() first)")
        code = lib().muster_work_status(self._handle)
        if code != 0:
            raise _error(code)
        return self._result(self._handle)

    def __del__(self):
        handle, self._handle = getattr(self, "_handle", None), None
        if not handle:
            return
        try:
            if lib().muster_work_is_completed(handle):
                lib().muster_work_release(handle)
            else:
                with _orphans_lock:
                    _orphans.append((handle, self._keep))
        except Exception:  # interpreter shutdown
            pass


def _blobs(handle):
    n = lib().muster_work_blob_count(handle)
    out = []
    for i in range(n):
        data, size = ctypes.c_void_p(), ctypes.c_size_t()
        _check(lib().muster_work_blob(handle, i, ctypes.byref(data), ctypes.byref(size)))
        out.append(ctypes.string_at(data, size.value) if size.value else b"")
    return out


def _finish(code, handle, keep, async_op, result=None):
    _check(code)
    if async_op:
        return Work(handle.value, keep, result)
    # Synchronous: wait and release the handle here (no Work object); the
    # buffers in `keep` stay referenced by the caller's frame until then.
    h = handle.value
    try:
        code = lib().muster_work_wait(h, -1.0)
        if code != 0:
            raise _error(code)
        return None if result is None else result(h)
    finally:
        lib().muster_work_release(h)


# ---- groups ----

class _Handle:
    """Owns one reference of a C handle, dropped (by the muster_*_release
    function named _RELEASE) when the object is collected or closed."""

    _RELEASE = None

    def __init__(self, handle):
        self._handle = handle

    @property
    def handle(self):
        return self._handle

    def _drop(self):
        handle, self._handle = getattr(self, "_handle", None), None
        if handle:
            getattr(lib(), self._RELEASE)(handle)

    def __del__(self):
        try:
            self._drop()
        except Exception:  # interpreter shutdown
            pass


class Group(_Handle):
    """A process group as this rank sees it (c10d's ProcessGroup)."""

    _RELEASE = "muster_group_release"

    def __init__(self, handle, world=None):
        super().__init__(handle)
        self._world = world

    @classmethod
    def from_handle(cls, handle):
        """Wraps a muster_group* (an int) from elsewhere, e.g. the torch
        backend; takes a reference of its own."""
        return cls(lib().muster_group_retain(handle))

    @property
    def rank(self):
        """This rank in the group; -1 if not a member."""
        return lib().muster_group_rank(self._handle)

    @property
    def size(self):
        return lib().muster_group_size(self._handle)

    @property
    def ranks(self):
        """Global ranks of the members, in group-rank order."""
        n = self.size
        out = (ctypes.c_int32 * max(n, 1))()
        lib().muster_group_ranks(self._handle, out, n)
        return list(out[:n])

    @property
    def name(self):
        return lib().muster_group_name(self._handle).decode()

    @property
    def tag(self):
        return lib().muster_group_tag(self._handle).decode()

    @property
    def backend(self):
        return lib().muster_group_backend(self._handle).decode()

    def global_rank(self, group_rank):
        r = ctypes.c_int32()
        _check(lib().muster_group_global_rank(self._handle, group_rank, ctypes.byref(r)))
        return r.value

    def group_rank(self, global_rank):
        r = ctypes.c_int32()
        _check(lib().muster_group_group_rank(self._handle, global_rank, ctypes.byref(r)))
        return r.value

    def destroy(self):
        """Destroys the group in musterd (c10d's destroy_process_group(g))."""
        _check(lib().muster_group_destroy(self._handle))

    def barrier(self, timeout=None, async_op=False):
        """A barrier run by the members themselves (shared memory / Gloo).
        With `timeout`, DeadlineExceededError if not all arrived by then (the
        barrier itself goes on until the group's timeout)."""
        _prune_orphans()
        w = ctypes.c_void_p()
        _check(lib().muster_collective_barrier(self._handle, ctypes.byref(w)))
        work = Work(w.value)
        if async_op:
            return work
        return work.wait(timeout)

    def daemon_barrier(self, timeout=None):
        """A barrier through musterd and the job's store."""
        _check(lib().muster_group_barrier(self._handle, _timeout_s(timeout)))

    def monitored_barrier(self, timeout=None):
        """c10d's monitored_barrier: DeadlineExceededError naming every member
        that did not arrive within `timeout` (default 30 minutes)."""
        _check(lib().muster_group_monitored_barrier(self._handle, _timeout_s(timeout)))

    # -- collectives: in place on the given buffers, c10d semantics --

    def all_reduce(self, buf, op=ReduceOp.SUM, premul_scale=1.0, async_op=False):
        _prune_orphans()
        b = _Buffer(buf, "all_reduce")
        w = ctypes.c_void_p()
        code = lib().muster_all_reduce(self._handle, ctypes.byref(b.tensor), _op(op),
                                       float(premul_scale), ctypes.byref(w))
        return _finish(code, w, b, async_op)

    def all_reduce_coalesced(self, bufs, op=ReduceOp.SUM, async_op=False):
        _prune_orphans()
        keep, arr = _buffers(bufs, "all_reduce_coalesced")
        w = ctypes.c_void_p()
        code = lib().muster_all_reduce_coalesced(self._handle, arr, len(keep), _op(op),
                                                 ctypes.byref(w))
        return _finish(code, w, keep, async_op)

    def broadcast(self, buf, root, async_op=False):
        _prune_orphans()
        b = _Buffer(buf, "broadcast")
        w = ctypes.c_void_p()
        code = lib().muster_broadcast(self._handle, ctypes.byref(b.tensor), root, ctypes.byref(w))
        return _finish(code, w, b, async_op)

    def reduce(self, buf, root, op=ReduceOp.SUM, async_op=False):
        _prune_orphans()
        b = _Buffer(buf, "reduce")
        w = ctypes.c_void_p()
        code = lib().muster_reduce(self._handle, ctypes.byref(b.tensor), root, _op(op),
                                   ctypes.byref(w))
        return _finish(code, w, b, async_op)

    def all_gather(self, outputs, input, async_op=False):
        """outputs[i] receives group rank i's input."""
        _prune_orphans()
        keep, arr = _buffers(outputs, "all_gather outputs")
        b = _Buffer(input, "all_gather input", writable=False)
        w = ctypes.c_void_p()
        code = lib().muster_all_gather(self._handle, arr, len(keep), ctypes.byref(b.tensor),
                                       ctypes.byref(w))
        return _finish(code, w, (keep, b), async_op)

    def all_gather_into(self, output, input, async_op=False):
        """all_gather_into_tensor: output holds size * len(input) elements."""
        _prune_orphans()
        o = _Buffer(output, "all_gather_into output")
        i = _Buffer(input, "all_gather_into input", writable=False)
        w = ctypes.c_void_p()
        code = lib().muster_all_gather_into_tensor(self._handle, ctypes.byref(o.tensor),
                                                   ctypes.byref(i.tensor), ctypes.byref(w))
        return _finish(code, w, (o, i), async_op)

    def gather(self, input, outputs=None, root=0, async_op=False):
        """outputs (size of them) matter at the root only."""
        _prune_orphans()
        keep, arr = _buffers(outputs or [], "gather outputs")
        b = _Buffer(input, "gather input", writable=False)
        w = ctypes.c_void_p()
        code = lib().muster_gather(self._handle, arr, len(keep), ctypes.byref(b.tensor), root,
                                   ctypes.byref(w))
        return _finish(code, w, (keep, b), async_op)

    def scatter(self, output, inputs=None, root=0, async_op=False):
        """inputs (size of them) matter at the root only."""
        _prune_orphans()
        keep, arr = _buffers(inputs or [], "scatter inputs", writable=False)
        o = _Buffer(output, "scatter output")
        w = ctypes.c_void_p()
        code = lib().muster_scatter(self._handle, ctypes.byref(o.tensor), arr, len(keep), root,
                                    ctypes.byref(w))
        return _finish(code, w, (keep, o), async_op)

    def reduce_scatter(self, output, inputs, op=ReduceOp.SUM, async_op=False):
        """inputs[i] is reduced into group rank i's output."""
        _prune_orphans()
        keep, arr = _buffers(inputs, "reduce_scatter inputs", writable=False)
        o = _Buffer(output, "reduce_scatter output")
        w = ctypes.c_void_p()
        code = lib().muster_reduce_scatter(self._handle, ctypes.byref(o.tensor), arr, len(keep),
                                           _op(op), ctypes.byref(w))
        return _finish(code, w, (keep, o), async_op)

    def reduce_scatter_into(self, output, input, op=ReduceOp.SUM, async_op=False):
        """reduce_scatter_tensor: input holds size * len(output) elements."""
        _prune_orphans()
        o = _Buffer(output, "reduce_scatter_into output")
        i = _Buffer(input, "reduce_scatter_into input", writable=False)
        w = ctypes.c_void_p()
        code = lib().muster_reduce_scatter_tensor(self._handle, ctypes.byref(o.tensor),
                                                  ctypes.byref(i.tensor), _op(op),
                                                  ctypes.byref(w))
        return _finish(code, w, (o, i), async_op)

    def all_to_all(self, outputs, inputs, async_op=False):
        """outputs[i] receives group rank i's inputs[this rank]."""
        _prune_orphans()
        okeep, oarr = _buffers(outputs, "all_to_all outputs")
        ikeep, iarr = _buffers(inputs, "all_to_all inputs", writable=False)
        if len(okeep) != len(ikeep):
            raise InvalidArgumentError(3, f"all_to_all: {len(okeep)} outputs but "
                                          f"{len(ikeep)} inputs")
        w = ctypes.c_void_p()
        code = lib().muster_all_to_all(self._handle, oarr, iarr, len(okeep), ctypes.byref(w))
        return _finish(code, w, (okeep, ikeep), async_op)

    def all_to_all_single(self, output, input, output_splits=None, input_splits=None,
                          async_op=False):
        """Split sizes in elements; None for equal splits."""
        _prune_orphans()
        o = _Buffer(output, "all_to_all_single output")
        i = _Buffer(input, "all_to_all_single input", writable=False)
        if (output_splits is None) != (input_splits is None):
            raise InvalidArgumentError(3, "all_to_all_single: give both split lists or neither")
        n = 0 if output_splits is None else len(output_splits)
        if input_splits is not None and len(input_splits) != n:
            raise InvalidArgumentError(3, f"all_to_all_single: {n} output splits but "
                                          f"{len(input_splits)} input splits")
        osp = (ctypes.c_uint64 * max(n, 1))(*(output_splits or []))
        isp = (ctypes.c_uint64 * max(n, 1))(*(input_splits or []))
        w = ctypes.c_void_p()
        code = lib().muster_all_to_all_single(self._handle, ctypes.byref(o.tensor),
                                              ctypes.byref(i.tensor), osp, isp, n,
                                              ctypes.byref(w))
        return _finish(code, w, (o, i), async_op)

    # -- byte blobs ("object" collectives) --

    def broadcast_bytes(self, data, root, async_op=False):
        """Returns the root's bytes on every rank (`data` matters at the root)."""
        _prune_orphans()
        data = bytes(data or b"")
        w = ctypes.c_void_p()
        code = lib().muster_broadcast_bytes(self._handle, data, len(data), root, ctypes.byref(w))
        return _finish(code, w, None, async_op, lambda h: _blobs(h)[0])

    def all_gather_bytes(self, data, async_op=False):
        """Returns every rank's bytes, in group-rank order."""
        _prune_orphans()
        data = bytes(data)
        w = ctypes.c_void_p()
        code = lib().muster_all_gather_bytes(self._handle, data, len(data), ctypes.byref(w))
        return _finish(code, w, None, async_op, _blobs)

    def gather_bytes(self, data, root, async_op=False):
        """The root gets every rank's bytes; other ranks get None."""
        _prune_orphans()
        data = bytes(data)
        w = ctypes.c_void_p()
        is_root = self.rank == root
        code = lib().muster_gather_bytes(self._handle, data, len(data), root, ctypes.byref(w))
        return _finish(code, w, None, async_op, lambda h: _blobs(h) if is_root else None)

    def scatter_bytes(self, blobs, root, async_op=False):
        """The root passes size blobs; every rank gets its own."""
        _prune_orphans()
        blobs = [bytes(b) for b in (blobs or [])]
        ptrs = (ctypes.c_void_p * max(len(blobs), 1))()
        sizes = (ctypes.c_size_t * max(len(blobs), 1))()
        keep = [ctypes.create_string_buffer(b, len(b) or 1) for b in blobs]
        for i, b in enumerate(blobs):
            ptrs[i] = ctypes.addressof(keep[i])
            sizes[i] = len(b)
        w = ctypes.c_void_p()
        code = lib().muster_scatter_bytes(self._handle, ptrs, sizes, len(blobs), root,
                                          ctypes.byref(w))
        return _finish(code, w, keep, async_op, lambda h: _blobs(h)[0])

    # -- point to point (peers are global ranks) --

    def isend(self, buf, dst, tag=0):
        _prune_orphans()
        b = _Buffer(buf, "send", writable=False)
        w = ctypes.c_void_p()
        code = lib().muster_send(self._handle, ctypes.byref(b.tensor), dst, tag, ctypes.byref(w))
        return _finish(code, w, b, True)

    def irecv(self, buf, src=None, tag=0):
        """src None: the first message with `tag` from any member (the
        Work's source_rank names the sender)."""
        _prune_orphans()
        b = _Buffer(buf, "recv")
        w = ctypes.c_void_p()
        if src is None:
            code = lib().muster_recv_anysource(self._handle, ctypes.byref(b.tensor), tag,
                                               ctypes.byref(w))
        else:
            code = lib().muster_recv(self._handle, ctypes.byref(b.tensor), src, tag,
                                     ctypes.byref(w))
        return _finish(code, w, b, True)

    def send(self, buf, dst, tag=0):
        self.isend(buf, dst, tag).wait()

    def recv(self, buf, src=None, tag=0):
        """Returns the sender's global rank (c10d's recv)."""
        w = self.irecv(buf, src, tag)
        w.wait()
        return w.source_rank

    def batch_isend_irecv(self, ops):
        """ops: (kind, buf, peer[, tag]) with kind "send" or "recv"; returns
        one Work per op."""
        _prune_orphans()
        arr = (_capi.P2POp * max(len(ops), 1))()
        keep = []
        for i, op in enumerate(ops):
            kind, buf, peer = op[0], op[1], op[2]
            tag = op[3] if len(op) > 3 else 0
            if kind not in ("send", "recv"):
                raise InvalidArgumentError(3, f"batch_isend_irecv: op {i} is '{kind}', not "
                                              "'send' or 'recv'")
            b = _Buffer(buf, f"batch_isend_irecv[{i}]", writable=kind == "recv")
            keep.append(b)
            arr[i].send = 1 if kind == "send" else 0
            arr[i].peer = peer
            arr[i].tag = tag
            arr[i].tensor = b.tensor
        works = (ctypes.c_void_p * max(len(ops), 1))()
        _check(lib().muster_batch_isend_irecv(self._handle, arr, len(ops), works))
        return [Work(works[i], keep[i]) for i in range(len(ops))]


# ---- the store ----

class Store(_Handle):
    """A key-value store client with c10d's semantics (values are bytes)."""

    _RELEASE = "muster_store_release"

    @staticmethod
    def _bytes(value):
        return value.encode() if isinstance(value, str) else bytes(value)

    @staticmethod
    def _keys(keys):
        if isinstance(keys, (str, bytes)):
            keys = [keys]
        enc = [k.encode() if isinstance(k, str) else bytes(k) for k in keys]
        return (ctypes.c_char_p * max(len(enc), 1))(*enc), len(enc)

    def set_timeout(self, timeout):
        lib().muster_store_set_timeout(self._handle, _timeout_s(timeout))

    def set(self, key, value):
        v = self._bytes(value)
        _check(lib().muster_store_set(self._handle, key.encode(), v, len(v)))

    def get(self, key, timeout=None):
        """Blocks until the key exists (DeadlineExceededError after timeout)."""
        data, size = ctypes.c_void_p(), ctypes.c_size_t()
        _check(lib().muster_store_get(self._handle, key.encode(), _timeout_s(timeout),
                                      ctypes.byref(data), ctypes.byref(size)))
        try:
            return ctypes.string_at(data, size.value)
        finally:
            lib().muster_free(data)

    def add(self, key, delta):
        out = ctypes.c_int64()
        _check(lib().muster_store_add(self._handle, key.encode(), int(delta), ctypes.byref(out)))
        return out.value

    def compare_set(self, key, expected, desired):
        e, d = self._bytes(expected), self._bytes(desired)
        data, size = ctypes.c_void_p(), ctypes.c_size_t()
        _check(lib().muster_store_compare_set(self._handle, key.encode(), e, len(e), d, len(d),
                                              ctypes.byref(data), ctypes.byref(size)))
        try:
            return ctypes.string_at(data, size.value)
        finally:
            lib().muster_free(data)

    def wait(self, keys, timeout=None):
        arr, n = self._keys(keys)
        _check(lib().muster_store_wait(self._handle, arr, n, _timeout_s(timeout)))

    def check(self, keys):
        arr, n = self._keys(keys)
        out = ctypes.c_int()
        _check(lib().muster_store_check(self._handle, arr, n, ctypes.byref(out)))
        return bool(out.value)

    def delete_key(self, key):
        out = ctypes.c_int()
        _check(lib().muster_store_delete_key(self._handle, key.encode(), ctypes.byref(out)))
        return bool(out.value)

    def num_keys(self):
        out = ctypes.c_int64()
        _check(lib().muster_store_num_keys(self._handle, ctypes.byref(out)))
        return out.value

    def append(self, key, value):
        v = self._bytes(value)
        _check(lib().muster_store_append(self._handle, key.encode(), v, len(v)))

    def list_keys(self):
        data, size, n = ctypes.c_void_p(), ctypes.c_size_t(), ctypes.c_size_t()
        _check(lib().muster_store_list_keys(self._handle, ctypes.byref(data), ctypes.byref(size),
                                            ctypes.byref(n)))
        try:
            raw = ctypes.string_at(data, size.value)
        finally:
            lib().muster_free(data)
        return [k.decode() for k in raw.split(b"\0")[:n.value]]

    def prefixed(self, prefix):
        """The keys under "<prefix>/" (c10d's PrefixStore)."""
        out = ctypes.c_void_p()
        _check(lib().muster_store_prefixed(self._handle, prefix.encode(), ctypes.byref(out)))
        return Store(out.value)


def connect_store(host, port, token=None, torch113=False, timeout=None):
    """A store client of its own: a musterd's store (native protocol) or,
    with torch113=True, any PyTorch TCPStore server."""
    out = ctypes.c_void_p()
    _check(lib().muster_store_connect(host.encode(), int(port),
                                      token.encode() if token else None, 1 if torch113 else 0,
                                      _timeout_s(timeout), ctypes.byref(out)))
    return Store(out.value)


def daemon_store_port(socket=None):
    """The store port of the musterd at `socket` ($MUSTER_SOCKET, else the
    default socket)."""
    port = ctypes.c_int32()
    _check(lib().muster_daemon_store_port(socket.encode() if socket else None,
                                          ctypes.byref(port)))
    return port.value


# ---- the world ----

class World(_Handle):
    """This process's membership in a job (one per process)."""

    _RELEASE = "muster_world_release"

    def __init__(self, handle):
        super().__init__(handle)
        self.group = Group(lib().muster_world_group(handle), self)

    def close(self):
        """Leaves the job once every group handle is gone."""
        self.group = None
        self._drop()

    @property
    def rank(self):
        return lib().muster_world_rank(self._handle)

    @property
    def size(self):
        return lib().muster_world_size(self._handle)

    @property
    def local_rank(self):
        return lib().muster_world_local_rank(self._handle)

    @property
    def local_size(self):
        return lib().muster_world_local_size(self._handle)

    @property
    def generation(self):
        return lib().muster_world_generation(self._handle)

    @property
    def job_id(self):
        return lib().muster_world_job_id(self._handle).decode()

    @property
    def epoch(self):
        """The job epoch this rank is in (0 at start, +1 per reconfigure)."""
        return lib().muster_world_epoch(self._handle)

    def reconfigure(self, timeout=None, allow_shrink=False):
        """Elastic jobs: after a member died (collectives failed ABORTED),
        joins the job's next epoch with the other ranks (the survivors call
        it; a replacement process does it inside init()) and forms every
        group this rank holds again under it; Group objects stay valid.
        allow_shrink: form it with the ranks alive (and new ones that
        joined) instead of waiting for every rank; rank and size change.
        Returns the new epoch."""
        epoch = ctypes.c_int64(0)
        _check(lib().muster_world_reconfigure(self._handle, _timeout_s(timeout),
                                              1 if allow_shrink else 0, ctypes.byref(epoch)))
        return epoch.value

    def pending_joins(self):
        """How many processes wait to join the job's next epoch (call
        reconfigure() to admit them)."""
        n = ctypes.c_int32(0)
        _check(lib().muster_world_pending_joins(self._handle, ctypes.byref(n)))
        return n.value

    def failures(self):
        """Failures of other ranks this rank was told about."""
        n = lib().muster_world_failures(self._handle, None, 0)
        buf = ctypes.create_string_buffer(n + 1)
        lib().muster_world_failures(self._handle, buf, n + 1)
        return [line for line in buf.value.decode(errors="replace").split("\n") if line]

    def new_group(self, ranks, name=None, tag=None, backend=None, timeout=None,
                  local_synchronization=False):
        """c10d's new_group: every world rank calls it (non-members get a
        group whose rank is -1) unless local_synchronization."""
        opts = _capi.GroupOptions()
        lib().muster_group_options_default(ctypes.byref(opts))
        opts.name = name.encode() if name else None
        opts.tag = tag.encode() if tag else None
        opts.backend = backend.encode() if backend else None
        opts.timeout_s = _timeout_s(timeout)
        opts.local_synchronization = 1 if local_synchronization else 0
        ranks = list(ranks)
        arr = (ctypes.c_int32 * max(len(ranks), 1))(*ranks)
        out = ctypes.c_void_p()
        _check(lib().muster_group_create(self._handle, arr, len(ranks), ctypes.byref(opts),
                                         ctypes.byref(out)))
        return Group(out.value, self)

    def new_subgroups(self, group_size, **kwargs):
        """c10d's new_subgroups: consecutive groups of `group_size` ranks.
        Returns (this rank's group, every group)."""
        if group_size <= 0 or self.size % group_size:
            raise InvalidArgumentError(
                3, f"new_subgroups: group size {group_size} does not divide world size "
                f"{self.size}")
        groups = [self.new_group(range(s, s + group_size), **kwargs)
                  for s in range(0, self.size, group_size)]
        return groups[self.rank // group_size], groups

    def store(self):
        """The job's store, namespaced to this job attempt."""
        out = ctypes.c_void_p()
        _check(lib().muster_world_store(self._handle, ctypes.byref(out)))
        return Store(out.value)


_default_lock = threading.Lock()
_default_world = None


def _encode(s):
    return s.encode() if isinstance(s, str) else s


def init(rank=None, world_size=None, local_rank=None, local_world_size=None, master_addr=None,
         master_port=None, socket=None, job_id=None, generation=None, backend=None,
         timeout=None, store_token=None, world_group_name=None):
    """Joins the job (every argument left None comes from the environment,
    as c10d's env:// reads it) and returns the World, also kept as this
    process's default (muster.world())."""
    global _default_world
    opts = _capi.InitOptions()
    lib().muster_init_options_default(ctypes.byref(opts))
    for field, value in (("rank", rank), ("world_size", world_size), ("local_rank", local_rank),
                         ("local_world_size", local_world_size),
                         ("master_port", master_port), ("generation", generation)):
        if value is not None:
            setattr(opts, field, int(value))
    for field, value in (("master_addr", master_addr), ("socket", socket), ("job_id", job_id),
                         ("backend", backend), ("store_token", store_token),
                         ("world_group_name", world_group_name)):
        if value is not None:
            setattr(opts, field, _encode(value))
    opts.timeout_s = _timeout_s(timeout)
    with _default_lock:
        if _default_world is not None:
            raise FailedPreconditionError(9, "muster.init() was already called in this process "
                                             "(muster.destroy() first)")
        out = ctypes.c_void_p()
        _check(lib().muster_world_init(ctypes.byref(opts), ctypes.byref(out)))
        _default_world = World(out.value)
        return _default_world


def world():
    """The World joined by init(), or None."""
    return _default_world


def reconfigure(timeout=None, allow_shrink=False):
    """World.reconfigure() on the default World (see muster.init)."""
    if _default_world is None:
        raise FailedPreconditionError(9, "muster.reconfigure(): muster.init() was not called")
    return _default_world.reconfigure(timeout, allow_shrink)


def is_initialized():
    return _default_world is not None


def destroy():
    """Forgets the default World (the job is left once no group uses it)."""
    global _default_world
    with _default_lock:
        w, _default_world = _default_world, None
    if w is not None:
        w.close()
