"""`pip install ./python` puts the SDK and libmuster.so into an environment,
and the installed package imports with nothing from the source tree."""
import os
import subprocess
import sys

from conftest import REPO, bin_dir


def test_pip_install_no_build_isolation(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True, timeout=120)
    py = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MUSTER_LIBRARY")}
    env["MUSTER_LIBRARY"] = str(bin_dir() / "client" / "libmuster.so")
    build = subprocess.run(
        [py, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "--no-index", str(REPO / "python")],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        timeout=300)
    assert build.returncode == 0, build.stdout
    del env["MUSTER_LIBRARY"]
    probe = subprocess.run(
        [py, "-c", "import muster, muster._capi as c; print(c.library_path()); "
                   "print(muster.__file__); print(muster.version())"],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        timeout=60)
    assert probe.returncode == 0, probe.stdout
    lib_path, module, version = probe.stdout.split()
    assert lib_path.startswith(str(venv)) and lib_path.endswith("muster/libmuster.so")
    assert module.startswith(str(venv))
    assert version == "0.1.0"
