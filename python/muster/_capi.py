"""ctypes bindings of muster's C API (client/include/muster/muster.h).

Loads libmuster.so once per process, with RTLD_LOCAL: its gRPC, protobuf and
Abseil resolve among its own dependencies, never against the copies torch
(or anything else) loaded. Everything above this module talks to muster
through `lib()`.

Where libmuster.so comes from, first match wins:
  1. $MUSTER_LIBRARY (a path to the file);
  2. next to this module (what `pip install ./python` puts there);
  3. the library tools/install.sh installed with this package (the path it
     recorded in muster/_installed.py);
  4. <repo>/bazel-bin/client/libmuster.so (running from a source tree).

Thread-safety: the library is thread-safe; ctypes releases the GIL during
every call, so blocking waits do not stall other Python threads.
"""
import ctypes
import os
import threading
from pathlib import Path

API_VERSION = 1

c_int = ctypes.c_int
c_int32 = ctypes.c_int32
c_int64 = ctypes.c_int64
c_uint32 = ctypes.c_uint32
c_uint64 = ctypes.c_uint64
c_size_t = ctypes.c_size_t
c_double = ctypes.c_double
c_char_p = ctypes.c_char_p
c_void_p = ctypes.c_void_p
POINTER = ctypes.POINTER


class Tensor(ctypes.Structure):
    _fields_ = [
        ("data", c_void_p),
        ("count", c_uint64),
        ("dtype", c_int32),
        ("device", c_int32),
        ("stream", c_void_p),
    ]


class InitOptions(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("job_id", c_char_p),
        ("rank", c_int32),
        ("world_size", c_int32),
        ("local_rank", c_int32),
        ("local_world_size", c_int32),
        ("master_addr", c_char_p),
        ("master_port", c_int32),
        ("socket", c_char_p),
        ("generation", c_int64),
        ("backend", c_char_p),
        ("timeout_s", c_double),
        ("store_token", c_char_p),
        ("world_group_name", c_char_p),
    ]


class GroupOptions(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("name", c_char_p),
        ("tag", c_char_p),
        ("backend", c_char_p),
        ("timeout_s", c_double),
        ("local_synchronization", c_int32),
    ]


class P2POp(ctypes.Structure):
    _fields_ = [
        ("send", c_int32),
        ("peer", c_int32),
        ("tag", c_uint64),
        ("tensor", Tensor),
    ]


WORK_CALLBACK = ctypes.CFUNCTYPE(None, c_void_p, c_int, c_char_p)

_T = POINTER(Tensor)
_W = POINTER(c_void_p)  # muster_work** / muster_group** / ... out-pointers

# name: (restype, argtypes)
_SIGNATURES = {
    "muster_api_version": (c_int, []),
    "muster_version": (c_char_p, []),
    "muster_last_error": (c_char_p, []),
    "muster_code_name": (c_char_p, [c_int]),
    "muster_dtype_size": (c_size_t, [c_int]),
    "muster_daemon_store_port": (c_int, [c_char_p, POINTER(c_int32)]),
    "muster_init_options_default": (None, [POINTER(InitOptions)]),
    "muster_world_init": (c_int, [POINTER(InitOptions), _W]),
    "muster_world_retain": (c_void_p, [c_void_p]),
    "muster_world_release": (None, [c_void_p]),
    "muster_world_rank": (c_int, [c_void_p]),
    "muster_world_size": (c_int, [c_void_p]),
    "muster_world_local_rank": (c_int, [c_void_p]),
    "muster_world_local_size": (c_int, [c_void_p]),
    "muster_world_generation": (c_int64, [c_void_p]),
    "muster_world_epoch": (c_int64, [c_void_p]),
    "muster_world_reconfigure": (c_int, [c_void_p, c_double, c_int, POINTER(c_int64)]),
    "muster_world_pending_joins": (c_int, [c_void_p, POINTER(c_int32)]),
    "muster_world_job_id": (c_char_p, [c_void_p]),
    "muster_world_group": (c_void_p, [c_void_p]),
    "muster_world_failures": (c_size_t, [c_void_p, c_char_p, c_size_t]),
    "muster_group_options_default": (None, [POINTER(GroupOptions)]),
    "muster_group_create": (c_int, [c_void_p, POINTER(c_int32), c_size_t,
                                    POINTER(GroupOptions), _W]),
    "muster_group_retain": (c_void_p, [c_void_p]),
    "muster_group_release": (None, [c_void_p]),
    "muster_group_destroy": (c_int, [c_void_p]),
    "muster_group_rank": (c_int, [c_void_p]),
    "muster_group_size": (c_int, [c_void_p]),
    "muster_group_ranks": (c_size_t, [c_void_p, POINTER(c_int32), c_size_t]),
    "muster_group_global_rank": (c_int, [c_void_p, c_int, POINTER(c_int32)]),
    "muster_group_group_rank": (c_int, [c_void_p, c_int, POINTER(c_int32)]),
    "muster_group_name": (c_char_p, [c_void_p]),
    "muster_group_tag": (c_char_p, [c_void_p]),
    "muster_group_backend": (c_char_p, [c_void_p]),
    "muster_group_world": (c_void_p, [c_void_p]),
    "muster_group_barrier": (c_int, [c_void_p, c_double]),
    "muster_group_monitored_barrier": (c_int, [c_void_p, c_double]),
    "muster_all_reduce": (c_int, [c_void_p, _T, c_int, c_double, _W]),
    "muster_all_reduce_coalesced": (c_int, [c_void_p, _T, c_size_t, c_int, _W]),
    "muster_broadcast": (c_int, [c_void_p, _T, c_int, _W]),
    "muster_reduce": (c_int, [c_void_p, _T, c_int, c_int, _W]),
    "muster_all_gather": (c_int, [c_void_p, _T, c_size_t, _T, _W]),
    "muster_all_gather_into_tensor": (c_int, [c_void_p, _T, _T, _W]),
    "muster_all_gather_coalesced": (c_int, [c_void_p, _T, _T, c_size_t, _W]),
    "muster_gather": (c_int, [c_void_p, _T, c_size_t, _T, c_int, _W]),
    "muster_scatter": (c_int, [c_void_p, _T, _T, c_size_t, c_int, _W]),
    "muster_reduce_scatter": (c_int, [c_void_p, _T, _T, c_size_t, c_int, _W]),
    "muster_reduce_scatter_tensor": (c_int, [c_void_p, _T, _T, c_int, _W]),
    "muster_all_to_all": (c_int, [c_void_p, _T, _T, c_size_t, _W]),
    "muster_all_to_all_single": (c_int, [c_void_p, _T, _T, POINTER(c_uint64),
                                         POINTER(c_uint64), c_size_t, _W]),
    "muster_collective_barrier": (c_int, [c_void_p, _W]),
    "muster_broadcast_bytes": (c_int, [c_void_p, c_void_p, c_size_t, c_int, _W]),
    "muster_all_gather_bytes": (c_int, [c_void_p, c_void_p, c_size_t, _W]),
    "muster_gather_bytes": (c_int, [c_void_p, c_void_p, c_size_t, c_int, _W]),
    "muster_scatter_bytes": (c_int, [c_void_p, POINTER(c_void_p), POINTER(c_size_t),
                                     c_size_t, c_int, _W]),
    "muster_send": (c_int, [c_void_p, _T, c_int, c_uint64, _W]),
    "muster_recv": (c_int, [c_void_p, _T, c_int, c_uint64, _W]),
    "muster_recv_anysource": (c_int, [c_void_p, _T, c_uint64, _W]),
    "muster_batch_isend_irecv": (c_int, [c_void_p, POINTER(P2POp), c_size_t, _W]),
    "muster_work_retain": (c_void_p, [c_void_p]),
    "muster_work_release": (None, [c_void_p]),
    "muster_work_wait": (c_int, [c_void_p, c_double]),
    "muster_work_is_completed": (c_int, [c_void_p]),
    "muster_work_status": (c_int, [c_void_p]),
    "muster_work_synchronize": (c_int, [c_void_p, c_double]),
    "muster_work_sequence": (c_uint64, [c_void_p]),
    "muster_work_source_rank": (c_int, [c_void_p]),
    "muster_work_on_complete": (c_int, [c_void_p, WORK_CALLBACK, c_void_p]),
    "muster_work_blob_count": (c_size_t, [c_void_p]),
    "muster_work_blob": (c_int, [c_void_p, c_size_t, POINTER(c_void_p), POINTER(c_size_t)]),
    "muster_world_store": (c_int, [c_void_p, _W]),
    "muster_store_connect": (c_int, [c_char_p, c_int, c_char_p, c_int, c_double, _W]),
    "muster_store_prefixed": (c_int, [c_void_p, c_char_p, _W]),
    "muster_store_release": (None, [c_void_p]),
    "muster_store_set_timeout": (None, [c_void_p, c_double]),
    "muster_store_set": (c_int, [c_void_p, c_char_p, c_void_p, c_size_t]),
    "muster_store_get": (c_int, [c_void_p, c_char_p, c_double, POINTER(c_void_p),
                                 POINTER(c_size_t)]),
    "muster_store_add": (c_int, [c_void_p, c_char_p, c_int64, POINTER(c_int64)]),
    "muster_store_compare_set": (c_int, [c_void_p, c_char_p, c_void_p, c_size_t, c_void_p,
                                         c_size_t, POINTER(c_void_p), POINTER(c_size_t)]),
    "muster_store_wait": (c_int, [c_void_p, POINTER(c_char_p), c_size_t, c_double]),
    "muster_store_check": (c_int, [c_void_p, POINTER(c_char_p), c_size_t, POINTER(c_int)]),
    "muster_store_delete_key": (c_int, [c_void_p, c_char_p, POINTER(c_int)]),
    "muster_store_num_keys": (c_int, [c_void_p, POINTER(c_int64)]),
    "muster_store_append": (c_int, [c_void_p, c_char_p, c_void_p, c_size_t]),
    "muster_store_list_keys": (c_int, [c_void_p, POINTER(c_void_p), POINTER(c_size_t),
                                       POINTER(c_size_t)]),
    "muster_free": (None, [c_void_p]),
}

_lock = threading.Lock()
_lib = None


def _installed_path(name):
    """A path tools/install.sh recorded in muster/_installed.py, or None."""
    try:
        from muster import _installed
    except ImportError:
        return None
    return getattr(_installed, name, None)


def library_path():
    """The libmuster.so this process uses (see the module docstring)."""
    env = os.environ.get("MUSTER_LIBRARY")
    if env:
        if not os.path.isfile(env):
            raise ImportError(f"MUSTER_LIBRARY={env} is not a file")
        return env
    here = Path(__file__).resolve().parent
    candidates = [here / "libmuster.so"]
    installed = _installed_path("LIBRARY")
    if installed:
        candidates.append(Path(installed))
    candidates.append(here.parent.parent / "bazel-bin" / "client" / "libmuster.so")
    for c in candidates:
        if c.is_file():
            return str(c)
    raise ImportError(
        "muster: libmuster.so not found (looked at $MUSTER_LIBRARY, "
        + ", ".join(str(c) for c in candidates)
        + "); build it with `bazel build //client:libmuster.so` or reinstall the package")


def lib():
    """The loaded library, with every function's signature declared."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            path = library_path()
            handle = ctypes.CDLL(path, mode=os.RTLD_LOCAL | os.RTLD_NOW)
            for name, (restype, argtypes) in _SIGNATURES.items():
                fn = getattr(handle, name)
                fn.restype = restype
                fn.argtypes = argtypes
            version = handle.muster_api_version()
            if version != API_VERSION:
                raise ImportError(f"muster: {path} has C API version {version}, "
                                  f"this package needs {API_VERSION}")
            _lib = handle
    return _lib
