"""Shared pieces of muster's Python tests: where the binaries are, and how to
run a job of real rank processes under muster-run (with an embedded musterd
of its own) and read what the ranks reported.

Binaries come from $MUSTER_BIN_DIR (a tree laid out like bazel-bin: tools/,
daemon/, client/), else <repo>/bazel-bin. Ranks run with this interpreter
(sys.executable), so the same tests cover Debian's torch 1.13 under
/usr/bin/python3 and torch 2.x in the venv.
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parent


def bin_dir():
    return Path(os.environ.get("MUSTER_BIN_DIR", REPO / "bazel-bin"))


def binary(rel):
    path = bin_dir() / rel
    if not path.exists():
        pytest.fail(f"missing {path}: build it with `bazel build //tools:muster-run "
                    f"//daemon:musterd //tools:musterctl //client:libmuster.so`")
    return str(path)


def rank_env(extra=None):
    """The environment of rank processes: the package from this tree (unless
    it is installed), libmuster.so from the binary tree."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO / "python")] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    lib = bin_dir() / "client" / "libmuster.so"
    if "MUSTER_LIBRARY" not in env and lib.exists():
        env["MUSTER_LIBRARY"] = str(lib)
    env["PYTHONUNBUFFERED"] = "1"
    if extra:
        env.update(extra)
    return env


class Job:
    """The outcome of one muster-run: exit code, output, and the JSON lines
    ranks printed as `RESULT {...}` (as dicts, in order)."""

    def __init__(self, returncode, output):
        self.returncode = returncode
        self.output = output
        self.results = []
        for line in output.splitlines():
            _, sep, rest = line.partition("RESULT ")
            if sep:
                self.results.append(json.loads(rest))

    def by_rank(self):
        out = {}
        for r in self.results:
            out.setdefault(r["rank"], []).append(r)
        return out


def run_job(nproc, script, args=(), env=None, timeout=180, launcher_args=()):
    """Runs `script` (a path) on `nproc` ranks under muster-run with an
    embedded musterd (MUSTER_SOCKET points where nobody answers)."""
    with tempfile.TemporaryDirectory(prefix="muster-pytest-") as tmp:
        e = rank_env(env)
        e["MUSTER_SOCKET"] = os.path.join(tmp, "nobody.sock")
        cmd = [binary("tools/muster-run"), "--nproc-per-node", str(nproc),
               "--musterd", binary("daemon/musterd"), *launcher_args, "--",
               sys.executable, str(script), *map(str, args)]
        try:
            p = subprocess.run(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as ex:
            out = ex.stdout.decode(errors="replace") if isinstance(ex.stdout, bytes) else (
                ex.stdout or "")
            pytest.fail(f"job {script} did not finish within {timeout} s; output:\n{out}")
        return Job(p.returncode, p.stdout)


# ---- the torch backend (test_torch_*.py) ----------------------------------


@pytest.fixture(scope="session")
def torch_backend():
    """Builds muster.torch's C++ extension once (for this interpreter's torch)
    before any rank process imports it; returns the extension's path."""
    p = subprocess.run([sys.executable, "-c", "import muster.torch as m; print(m.build().__file__)"],
                       env=rank_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=600, stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        pytest.fail(f"building the torch backend failed:\n{p.stdout}")
    return p.stdout.strip().splitlines()[-1]


# ---- a musterd of the test's own (tests that start ranks themselves) ----


@pytest.fixture
def musterd(tmp_path):
    sock, ready = tmp_path / "musterd.sock", tmp_path / "ready.json"
    p = subprocess.Popen([binary("daemon/musterd"), f"--socket={sock}", "--store-port=0",
                          "--grpc-port=0", "--listen=127.0.0.1", f"--ready-file={ready}",
                          "--log-level=warning"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 15
        while not ready.exists():
            assert p.poll() is None, "musterd exited"
            assert time.monotonic() < deadline, "musterd did not become ready"
            time.sleep(0.02)
        yield str(sock), json.loads(ready.read_text())
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
