"""Builds (once per torch version and Python) and loads the backend's C++ extension.

The extension is compiled with torch.utils.cpp_extension.load (ninja) against
the installed torch's headers and libmuster.so's C API (client/include/muster/
muster.h), and linked to libmuster.so with an rpath. No Bazel is needed: a
machine with a prebuilt libmuster.so (MUSTER_LIBRARY or bazel-bin/client/) and
this source tree builds it on first import.

Environment:
  MUSTER_TORCH_BUILD_DIR  cache root (default ~/.cache/muster); the extension
                          is built in <root>/torch-<torch version>-<python tag>,
                          so one root serves several torch versions
  MUSTER_INCLUDE_DIR      directory holding muster/muster.h (default: the
                          repository's client/include)
  MUSTER_LIBRARY          libmuster.so (see muster._capi.library_path)
  MUSTER_TORCH_VERBOSE=1  show the compiler's output
"""

import logging
import os
import sys
import threading
import time

_NAME = "muster_torch_C"
_HERE = os.path.dirname(os.path.abspath(__file__))
_SOURCES = [os.path.join(_HERE, "csrc", "muster_backend.cpp")]
_HEADERS = [os.path.join(_HERE, "csrc", "muster_backend.h")]
# A lock file older than this is left over from a build that was killed.
_STALE_LOCK_S = 15 * 60

_lock = threading.Lock()
_module = None


def _repo_root():
    return os.path.dirname(os.path.dirname(os.path.dirname(_HERE)))


def library_path():
    """The libmuster.so the extension links to."""
    try:
        from muster import _capi
        return _capi.library_path()
    except (ImportError, AttributeError):
        pass
    env = os.environ.get("MUSTER_LIBRARY")
    if env:
        return env
    beside = os.path.join(os.path.dirname(_HERE), "libmuster.so")
    if os.path.exists(beside):
        return beside
    return os.path.join(_repo_root(), "bazel-bin", "client", "libmuster.so")


def include_dir():
    """The directory holding muster/muster.h."""
    candidates = [
        os.environ.get("MUSTER_INCLUDE_DIR"),
        os.path.join(os.path.dirname(_HERE), "include"),
        os.path.join(_repo_root(), "client", "include"),
    ]
    for c in candidates:
        if c and os.path.exists(os.path.join(c, "muster", "muster.h")):
            return c
    raise RuntimeError(
        "muster: cannot find muster/muster.h (looked in %s); set MUSTER_INCLUDE_DIR"
        % ", ".join(c for c in candidates if c))


def build_dir():
    import torch
    root = os.environ.get("MUSTER_TORCH_BUILD_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "muster")
    tag = "cp%d%d" % sys.version_info[:2]
    return os.path.join(root, "torch-%s-%s" % (torch.__version__, tag))


def _up_to_date(directory):
    so = os.path.join(directory, _NAME + ".so")
    if not os.path.exists(so):
        return False
    built = os.path.getmtime(so)
    return all(os.path.getmtime(p) <= built for p in _SOURCES + _HEADERS)


def _ninja_on_path():
    """Puts this Python's ninja (pip's ninja package, or the venv's bin) on PATH."""
    dirs = [os.path.dirname(sys.executable)]
    try:
        import ninja
        dirs.insert(0, ninja.BIN_DIR)
    except (ImportError, AttributeError):
        pass
    path = os.environ.get("PATH", "").split(os.pathsep)
    for d in dirs:
        if os.path.exists(os.path.join(d, "ninja")) and d not in path:
            path.insert(0, d)
    os.environ["PATH"] = os.pathsep.join(path)


def load():
    """Builds the extension if needed (once; safe across processes) and imports it."""
    global _module
    with _lock:
        if _module is not None:
            return _module
        import torch
        lib = os.path.abspath(library_path())
        if not os.path.exists(lib):
            raise RuntimeError(
                "muster: libmuster.so not found at %s (build it with `bazel build "
                "//client:libmuster.so`, or set MUSTER_LIBRARY)" % lib)
        directory = build_dir()
        os.makedirs(directory, exist_ok=True)
        lock = os.path.join(directory, "lock")
        try:
            if time.time() - os.path.getmtime(lock) > _STALE_LOCK_S:
                os.remove(lock)
        except OSError:
            pass
        verbose = os.environ.get("MUSTER_TORCH_VERBOSE") == "1"
        if not _up_to_date(directory):
            version = ".".join(torch.__version__.split(".")[:2])
            sys.stderr.write("muster: building the torch backend for torch %s (once)…\n" % version)
            sys.stderr.flush()
        _ninja_on_path()
        # cpp_extension warns about a missing CUDA runtime on every import; the
        # extension has no CUDA code.
        log = logging.getLogger("torch.utils.cpp_extension")
        level = log.level
        log.setLevel(logging.ERROR)
        try:
            from torch.utils import cpp_extension
            lib_dir = os.path.dirname(lib)
            _module = cpp_extension.load(
                name=_NAME,
                sources=_SOURCES,
                extra_include_paths=[include_dir(), os.path.join(_HERE, "csrc")],
                extra_cflags=["-O2", "-std=c++17", "-Wno-unused-parameter"],
                extra_ldflags=["-L" + lib_dir, "-l:" + os.path.basename(lib),
                               "-Wl,-rpath," + lib_dir],
                build_directory=directory,
                verbose=verbose,
            )
        finally:
            log.setLevel(level)
        if _module.library_api_version() != _module.C_API_VERSION:
            raise RuntimeError(
                "muster: %s speaks C API version %d, the torch backend was built for %d"
                % (lib, _module.library_api_version(), _module.C_API_VERSION))
        return _module
