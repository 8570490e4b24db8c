"""Builds (once per torch version and Python) and loads the backend's C++ extension.

The extension is compiled with torch.utils.cpp_extension.load (ninja) against
the installed torch's headers and libmuster.so's C API (client/include/muster/
muster.h), and linked to libmuster.so with an rpath. No Bazel is needed: a
machine with a prebuilt libmuster.so (MUSTER_LIBRARY or bazel-bin/client/) and
this source tree builds it on first import.

Environment:
  MUSTER_TORCH_BUILD_DIR  cache root (default ~/.cache/muster); the extension
                          is built in <root>/torch-<torch version>-<python tag>-
                          <hash of the libmuster.so and header paths>, so one
                          root serves several torch versions and several
                          installs of muster side by side
  MUSTER_INCLUDE_DIR      directory holding muster/muster.h (default: the
                          repository's client/include)
  MUSTER_LIBRARY          libmuster.so (see muster._capi.library_path)
  MUSTER_TORCH_VERBOSE=1  show the compiler's output
"""

import contextlib
import hashlib
import importlib.util
import io
import json
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


def _installed_include_dir():
    """The include directory tools/install.sh recorded, or None."""
    try:
        from muster import _installed
    except ImportError:
        return None
    return getattr(_installed, "INCLUDE_DIR", None)


def include_dir():
    """The directory holding muster/muster.h."""
    candidates = [
        os.environ.get("MUSTER_INCLUDE_DIR"),
        os.path.join(os.path.dirname(_HERE), "include"),  # an installed package
        _installed_include_dir(),  # installed by tools/install.sh
        os.path.join(_repo_root(), "client", "include"),  # the source tree
        # The source tree behind a tree of symlinks (Bazel's runfiles).
        os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
            os.path.realpath(__file__))))), "client", "include"),
    ]
    for c in candidates:
        if c and os.path.exists(os.path.join(c, "muster", "muster.h")):
            return c
    raise RuntimeError(
        "muster: cannot find muster/muster.h (looked in %s); set MUSTER_INCLUDE_DIR"
        % ", ".join(c for c in candidates if c))


def build_dir(lib=None, include=None):
    """Where the extension for this torch, Python and muster install lives."""
    import torch
    root = os.environ.get("MUSTER_TORCH_BUILD_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "muster")
    tag = "cp%d%d" % sys.version_info[:2]
    # Two installs (a checkout and a pip-installed copy) each get their own
    # build instead of rebuilding over each other in turn.
    install = hashlib.sha256(
        ("%s\0%s" % (lib or os.path.realpath(library_path()), include or include_dir())).encode()
    ).hexdigest()[:12]
    return os.path.join(root, "torch-%s-%s-%s" % (torch.__version__, tag, install))


def compile_flags():
    """Our flags on top of torch's own: cpp_extension already passes the C++
    standard and ABI torch was built with (C++17 from torch 2.0, C++20 from
    2.15); torch 1.13 passes C++14, which the backend's code is past."""
    import torch
    flags = ["-O2", "-Wno-unused-parameter"]
    major, minor = (int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    if (major, minor) < (2, 0):
        flags.append("-std=c++17")
    return flags


def _build_key(lib, include):
    """What the built extension depends on, hashed."""
    import torch
    h = hashlib.sha256()
    for p in _SOURCES + _HEADERS + [os.path.join(include, "muster", "muster.h")]:
        with open(p, "rb") as f:
            h.update(f.read())
    for part in (lib, include, torch.__version__, sys.version, " ".join(compile_flags())):
        h.update(b"\0" + part.encode())
    return h.hexdigest()


def _stamp_path(directory):
    return os.path.join(directory, "muster_stamp.json")


def private_dir(directory):
    """Creates `directory` (mode 700) if needed and checks that only this user
    can write it or its parent: code loaded from a folder someone else can
    write would run as whoever imports muster.torch. Raises RuntimeError."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    for d in (directory, os.path.dirname(os.path.abspath(directory))):
        st = os.stat(d)
        if st.st_uid != os.getuid() or st.st_mode & 0o022:
            if d != directory and st.st_mode & 0o1000 and st.st_uid == 0:
                continue  # a sticky root-owned parent such as /tmp: entries stay ours
            raise RuntimeError(
                "muster: the torch backend's build folder %s is writable by another user (owner "
                "uid %d, mode %o); use a private one (MUSTER_TORCH_BUILD_DIR)"
                % (d, st.st_uid, st.st_mode & 0o7777))


def _load_built(directory, key):
    """The already built extension if its stamp matches `key` and names a
    file inside `directory`, else None."""
    try:
        with open(_stamp_path(directory)) as f:
            stamp = json.load(f)
    except (OSError, ValueError):
        return None
    so = os.path.realpath(stamp.get("so", ""))
    inside = so.startswith(os.path.realpath(directory) + os.sep)
    if stamp.get("key") != key or not inside or not os.path.exists(so):
        return None
    spec = importlib.util.spec_from_file_location(stamp["name"], stamp["so"])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write_stamp(directory, key, module):
    tmp = "%s.%d" % (_stamp_path(directory), os.getpid())
    with open(tmp, "w") as f:
        json.dump({"key": key, "name": module.__name__, "so": module.__file__}, f)
    os.replace(tmp, _stamp_path(directory))


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
        lib = os.path.realpath(library_path())
        if not os.path.exists(lib):
            raise RuntimeError(
                "muster: libmuster.so not found at %s (build it with `bazel build "
                "//client:libmuster.so`, or set MUSTER_LIBRARY)" % lib)
        # The SDK loads libmuster.so first, on its own (RTLD_LOCAL): its
        # gRPC, protobuf and Gloo then bind among its own dependencies, not
        # to the copies inside libtorch that the extension's dependency
        # scope would offer; the extension then reuses that same copy (the
        # same file), so handles pass between muster and muster.torch.
        from muster import _capi
        _capi.lib()
        include = include_dir()
        directory = build_dir(lib, include)
        private_dir(directory)
        key = _build_key(lib, include)
        module = _load_built(directory, key)
        if module is None:
            module = _compile(directory, lib, include)
            _write_stamp(directory, key, module)
        _module = module
        if _module.library_api_version() != _module.C_API_VERSION:
            raise RuntimeError(
                "muster: %s speaks C API version %d, the torch backend was built for %d"
                % (lib, _module.library_api_version(), _module.C_API_VERSION))
        return _module


def _compile(directory, lib, include):
    """Builds and imports the extension with cpp_extension (ninja). Processes
    building at once take turns on cpp_extension's lock file."""
    import torch
    verbose = os.environ.get("MUSTER_TORCH_VERBOSE") == "1"
    version = ".".join(torch.__version__.split(".")[:2])
    sys.stderr.write("muster: building the torch backend for torch %s (once)…\n" % version)
    sys.stderr.flush()
    lock = os.path.join(directory, "lock")
    try:
        if time.time() - os.path.getmtime(lock) > _STALE_LOCK_S:
            os.remove(lock)
    except OSError:
        pass
    _ninja_on_path()
    # Importing cpp_extension complains about the missing CUDA runtime (a
    # print on 1.13, a log line on 2.x); the extension has no CUDA code.
    log = logging.getLogger("torch.utils.cpp_extension")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            from torch.utils import cpp_extension
        lib_dir = os.path.dirname(lib)
        return cpp_extension.load(
            name=_NAME,
            sources=_SOURCES,
            extra_include_paths=[include, os.path.join(_HERE, "csrc")],
            extra_cflags=compile_flags(),
            extra_ldflags=["-L" + lib_dir, "-l:" + os.path.basename(lib), "-Wl,-rpath," + lib_dir],
            build_directory=directory,
            verbose=verbose,
        )
    finally:
        log.setLevel(level)
