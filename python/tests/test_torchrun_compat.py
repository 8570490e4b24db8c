"""muster-run as a drop-in for torchrun: the same script started by torchrun
and by muster-run with the same flags gets the same environment variables
(key by key, minus what muster adds) and both finish; a script, -m and
torch's error files work. Real torch, real processes."""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import TESTS, binary, rank_env

torch = pytest.importorskip("torch")

SCRIPT = TESTS / "torchrun_script.py"
# What muster-run adds to torchrun's environment (documented in the README).
MUSTER_ONLY = {"MUSTER_SOCKET", "MUSTER_JOB_ID", "MUSTER_GENERATION", "MUSTER_RESTART_COUNT",
               "PYTHONUNBUFFERED", "MUSTER_PYTHON"}
# Keys whose values must match too (the others name ports, paths, ids).
SAME_VALUES = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
               "GROUP_WORLD_SIZE", "ROLE_NAME", "ROLE_RANK", "ROLE_WORLD_SIZE", "OMP_NUM_THREADS",
               "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RESTART_COUNT",
               "TORCHELASTIC_USE_AGENT_STORE", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
               "TORCHELASTIC_SIGNALS_TO_HANDLE"]


def launcher_env(tmp):
    env = rank_env({"MUSTER_SOCKET": os.path.join(tmp, "nobody.sock"),
                    "MUSTER_PYTHON": sys.executable})
    env.pop("OMP_NUM_THREADS", None)
    env.pop("PYTHONUNBUFFERED", None)
    return env


def launch(launcher, args, tmp, timeout=180):
    env = launcher_env(tmp)
    p = subprocess.run([*launcher, *map(str, args)], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=timeout,
                       stdin=subprocess.DEVNULL)
    return p.returncode, p.stdout


def muster_run():
    return [binary("tools/muster-run"), "--musterd", binary("daemon/musterd")]


def envs(out_dir, n):
    return [json.loads((Path(out_dir) / f"env-{r}.json").read_text()) for r in range(n)]


@pytest.mark.skipif(tuple(int(x) for x in torch.__version__.split(".")[:1]) < (2,),
                    reason="Debian's torch 1.13 torchrun fails on Python 3.11 before starting "
                           "a rank (AttributeError in its Std enum), so there is no torchrun "
                           "environment to compare with")
def test_same_environment_as_torchrun_and_both_finish():
    flags = ["--standalone", "--nproc_per_node", "2", "--max-restarts", "0", "--role", "trainer"]
    with tempfile.TemporaryDirectory() as tmp:
        by_torchrun, by_muster = Path(tmp, "torchrun"), Path(tmp, "muster")
        by_torchrun.mkdir()
        by_muster.mkdir()
        code, out = launch([sys.executable, "-m", "torch.distributed.run"],
                           [*flags, SCRIPT, by_torchrun], tmp)
        assert code == 0, out
        code, mout = launch(muster_run(), [*flags, SCRIPT, by_muster], tmp)
        assert code == 0, mout
        for r in range(2):
            assert f'"rank": {r}, "sum": 3.0' in out
            assert f'"rank": {r}, "sum": 3.0' in mout
        for t, m in zip(envs(by_torchrun, 2), envs(by_muster, 2)):
            # LC_CTYPE: Python's own locale coercion in the launcher process.
            inherited = set(launcher_env(tmp))
            t_keys = set(t) - inherited - {"LC_CTYPE"}
            m_keys = set(m) - inherited - MUSTER_ONLY - {"LC_CTYPE"}
            assert "RANK" in t_keys and "TORCHELASTIC_RUN_ID" in t_keys
            assert sorted(t_keys - m_keys) == [], "torchrun sets these, muster-run does not"
            assert sorted(m_keys - t_keys) == [], "muster-run sets these, torchrun does not"
            for k in SAME_VALUES:
                assert t[k] == m[k], k
            assert m["TORCHELASTIC_ERROR_FILE"].endswith(f"/attempt_0/{m['LOCAL_RANK']}/error.json")


def test_script_and_module_forms_run_with_the_python_that_has_torch(tmp_path):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    code, out = launch(muster_run(), ["--nproc-per-node", "2", SCRIPT, out_dir], str(tmp_path))
    assert code == 0, out
    assert out.count('"sum": 3.0') == 2, out
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "train.py").write_text(SCRIPT.read_text())
    env_extra = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in [str(tmp_path), env_extra] if p)
    try:
        code, out = launch(muster_run(), ["--nproc_per_node=2", "-m", "pkg.train", out_dir],
                           str(tmp_path))
    finally:
        os.environ["PYTHONPATH"] = env_extra
    assert code == 0, out
    assert out.count('"sum": 3.0') == 2, out


def test_a_failing_rank_is_reported_with_its_error_file_message(tmp_path):
    code, out = launch(muster_run(), ["--nproc-per-node", "2", SCRIPT, tmp_path, "fail"],
                       str(tmp_path))
    assert code == 1, out
    assert "rank 1 (pid" in out
    assert "RuntimeError: boom from rank 1" in out
    assert "/attempt_0/1/error.json)" in out


def test_unsupported_torchrun_flags_are_refused_by_name(tmp_path):
    code, out = launch(muster_run(), ["--local-addr", "10.0.0.9", SCRIPT, tmp_path], str(tmp_path))
    assert code == 2
    assert "--local-addr is not supported by muster-run" in out
