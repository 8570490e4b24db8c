"""How the torch backend joins muster's job under each launcher
(muster/torch/_options.py; pure Python, no ranks)."""
import importlib.util
import os

import pytest

from conftest import REPO


def _load():
    path = REPO / "python" / "muster" / "torch" / "_options.py"
    spec = importlib.util.spec_from_file_location("muster_torch_options", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


options = _load()
BASE = {"rank": 1, "world_size": 2, "world_group_name": "0", "timeout_s": 60.0,
        "backend": "cpu:gloo,cuda:nccl"}


def resolve(env, port=4242):
    asked = []

    def store_port(socket):
        asked.append(socket)
        return port

    return options.world_init_options(1, 2, "0", 60, env, store_port), asked


def test_muster_run_leaves_everything_to_the_environment():
    env = {"MUSTER_JOB_ID": "run-7", "TORCHELASTIC_RUN_ID": "run-7", "MASTER_ADDR": "10.0.0.1",
           "MASTER_PORT": "29500", "MUSTER_SOCKET": "/s"}
    got, asked = resolve(env)
    assert got == BASE and asked == []


def test_torchrun_uses_the_run_id_and_the_local_musterds_store():
    env = {"TORCHELASTIC_RUN_ID": "abc", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29400",
           "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MUSTER_SOCKET": "/tmp/m.sock"}
    got, asked = resolve(env)
    assert got == dict(BASE, job_id="abc", master_addr="127.0.0.1", master_port=4242)
    assert asked == ["/tmp/m.sock"]  # not torchrun's MASTER_PORT


def test_torchrun_store_from_muster_store_variables():
    env = {"TORCHELASTIC_RUN_ID": "abc", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4",
           "MUSTER_STORE_ADDR": "node0", "MUSTER_STORE_PORT": "29555"}
    got, asked = resolve(env)
    assert got == dict(BASE, job_id="abc", master_addr="node0", master_port=29555)
    assert asked == []


def test_torchrun_on_several_nodes_needs_muster_store_addr():
    env = {"TORCHELASTIC_RUN_ID": "abc", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}
    with pytest.raises(RuntimeError, match="MUSTER_STORE_ADDR"):
        resolve(env)


def test_torchrun_store_addr_without_port_asks_the_local_musterd():
    env = {"TORCHELASTIC_RUN_ID": "abc", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4",
           "MUSTER_STORE_ADDR": "node0"}
    got, asked = resolve(env, port=29501)
    assert got["master_addr"] == "node0" and got["master_port"] == 29501
    assert asked == [""]  # musterd's default socket


def test_plain_env_uses_master_addr_and_port():
    env = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29510"}
    got, asked = resolve(env)
    assert got == BASE and asked == []


def test_plain_env_with_muster_store_override():
    env = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "MUSTER_STORE_PORT": "29510"}
    got, asked = resolve(env)
    assert got == dict(BASE, master_addr="127.0.0.1", master_port=29510)


def _load_build():
    path = REPO / "python" / "muster" / "torch" / "_build.py"
    spec = importlib.util.spec_from_file_location("muster_torch_build", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_build_folder_must_be_private(tmp_path):
    build = _load_build()
    mine = tmp_path / "cache" / "torch-x"
    build.private_dir(str(mine))  # created, mode 700
    assert (mine.stat().st_mode & 0o777) == 0o700
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(RuntimeError, match="writable by another user"):
        build.private_dir(str(shared / "torch-x"))


def test_a_stamp_naming_a_file_outside_the_build_folder_is_ignored(tmp_path):
    build = _load_build()
    outside = tmp_path / "evil.so"
    outside.write_bytes(b"not a module")
    folder = tmp_path / "build"
    folder.mkdir()
    (folder / "muster_stamp.json").write_text(
        '{"key": "k", "name": "muster_torch_C", "so": "%s"}' % outside)
    assert build._load_built(str(folder), "k") is None


def test_the_cxx_standard_is_torchs_own_from_torch_2():
    # torch 2.15's headers need C++20, which cpp_extension passes; a forced
    # -std=c++17 after it broke the build. Torch 1.13 passes C++14, older
    # than the backend's code.
    import torch
    build = _load_build()
    flags = build.compile_flags()
    major = int(torch.__version__.split(".")[0])
    if major >= 2:
        assert not any(f.startswith("-std=") for f in flags)
    else:
        assert "-std=c++17" in flags


def test_two_installs_of_muster_build_in_folders_of_their_own(tmp_path, monkeypatch):
    monkeypatch.setenv("MUSTER_TORCH_BUILD_DIR", str(tmp_path))
    build = _load_build()
    checkout = build.build_dir("/src/bazel-bin/client/libmuster.so", "/src/client/include")
    installed = build.build_dir("/venv/lib/muster/libmuster.so", "/venv/lib/muster/include")
    assert checkout != installed
    assert checkout == build.build_dir("/src/bazel-bin/client/libmuster.so",
                                       "/src/client/include")
    assert os.path.dirname(checkout) == str(tmp_path)
