"""Builds the muster wheel: the pure-Python package plus libmuster.so.

libmuster.so comes from, first match wins:
  1. $MUSTER_LIBRARY (a built libmuster.so, e.g. one shipped by
     tools/gpu_check.sh --pack);
  2. <repo>/bazel-bin/client/libmuster.so (the one Bazel built);
  3. `bazel build //client:libmuster.so` run in the repository, when
     bazel is on PATH.
It is copied into the package (muster/libmuster.so), with the C API's header
(muster/include/muster/muster.h). The torch backend is compiled later, on
first `import muster.torch`, against whatever torch the environment has and
that header (see muster/torch).
"""
import os
import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def find_library():
    env = os.environ.get("MUSTER_LIBRARY")
    if env:
        if not Path(env).is_file():
            raise SystemExit(f"muster setup: MUSTER_LIBRARY={env} is not a file")
        return Path(env)
    built = REPO / "bazel-bin" / "client" / "libmuster.so"
    if built.is_file():
        return built
    if shutil.which("bazel") and (REPO / "WORKSPACE").is_file():
        print("muster setup: building libmuster.so with bazel (a few minutes the first time)")
        subprocess.run(["bazel", "build", "//client:libmuster.so"], cwd=REPO, check=True)
        if built.is_file():
            return built
    raise SystemExit(
        "muster setup: libmuster.so not found. Build it first (bazel build "
        "//client:libmuster.so in the repository) or set MUSTER_LIBRARY to a built one.")


class BuildWithLibrary(build_py):
    def run(self):
        super().run()
        lib = find_library()
        dest = Path(self.build_lib) / "muster" / "libmuster.so"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(lib, dest)
        os.chmod(dest, 0o755)
        header = Path(self.build_lib) / "muster" / "include" / "muster" / "muster.h"
        header.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / "client" / "include" / "muster" / "muster.h", header)
        print(f"muster setup: packaged {lib}")


setup(cmdclass={"build_py": BuildWithLibrary})
