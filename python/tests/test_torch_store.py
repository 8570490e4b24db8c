"""PyTorch's own TCPStore client (the interpreter's torch: 1.13 or 2.x)
against musterd's store: every call of the client's API, including torch
2.x's extended API (append, multi_get, multi_set, queues, list_keys) and a
wait that times out and is cancelled, after which the connection still
works."""
import datetime
import json
import signal
import subprocess
import time

import pytest

from conftest import binary

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

TORCH2 = int(torch.__version__.split(".")[0]) >= 2


@pytest.fixture
def store(tmp_path):
    sock, ready = tmp_path / "musterd.sock", tmp_path / "ready.json"
    p = subprocess.Popen([binary("daemon/musterd"), f"--socket={sock}", "--store-port=0",
                          "--listen=127.0.0.1", f"--ready-file={ready}", "--log-level=warning"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 15
        while not ready.exists():
            assert p.poll() is None, "musterd exited"
            assert time.monotonic() < deadline, "musterd did not become ready"
            time.sleep(0.02)
        port = json.loads(ready.read_text())["store_port"]
        s = dist.TCPStore("127.0.0.1", port, 1, False, datetime.timedelta(seconds=10))
        yield s, port
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def test_basic_api(store):
    s, _ = store
    s.set("a", "1")
    assert s.get("a") == b"1"
    s.set("bin", bytes(range(256)))
    assert s.get("bin") == bytes(range(256))
    assert s.add("n", 5) == 5
    assert s.add("n", -2) == 3
    assert s.compare_set("a", "1", "2") == b"2"
    assert s.compare_set("a", "x", "3") == b"2"  # expected mismatch: current value
    assert s.num_keys() >= 3
    assert s.delete_key("a") is True
    assert s.delete_key("a") is False
    s.wait(["bin", "n"], datetime.timedelta(seconds=2))


def test_wait_times_out_and_the_connection_still_works(store):
    s, _ = store
    t0 = time.monotonic()
    with pytest.raises(Exception):
        s.wait(["never"], datetime.timedelta(milliseconds=300))
    assert 0.25 < time.monotonic() - t0 < 5
    # After the cancelled wait the same connection answers correctly (no
    # stray reply from the abandoned wait).
    s.set("after", "ok")
    assert s.get("after") == b"ok"
    s.set("never", "now")
    assert s.get("never") == b"now"


@pytest.mark.skipif(not TORCH2, reason="torch 1.13's client has no extended API")
def test_extended_api_of_torch2(store):
    s, port = store
    assert s.has_extended_api()
    s.append("log", "a")
    s.append("log", "bc")
    assert s.get("log") == b"abc"
    s.multi_set(["m1", "m2", "m3"], ["x", "yy", "zzz"])
    assert s.multi_get(["m3", "m1", "m2"]) == [b"zzz", b"x", b"yy"]
    s.queue_push("q", "first")
    s.queue_push("q", "second")
    assert s.queue_len("q") == 2
    assert s.queue_pop("q") == b"first"
    assert s.queue_pop("q", block=False) == b"second"
    assert s.queue_len("q") == 0
    keys = s.list_keys()
    for k in ["log", "m1", "m2", "m3"]:
        assert k in keys
    # A second client sees the first one's data.
    other = dist.TCPStore("127.0.0.1", port, 1, False, datetime.timedelta(seconds=10))
    assert other.get("m2") == b"yy"
    assert other.check(["m1", "log"])
    assert not other.check(["absent"])
