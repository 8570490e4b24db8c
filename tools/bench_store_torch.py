#!/usr/bin/env python3
"""`muster-bench store --client torch`: PyTorch's own TCPStore client
processes against musterd's store, against PyTorch's own TCPStore master and
against a minimal "floor" server (tools/store_floor_server.cc: an epoll loop
speaking only this benchmark's requests, no logging, no durability), side by
side in one run.

One interpreter (its torch decides the wire dialect: 1.13 or 2.x) runs the
master and the client processes. Every client process connects to both
servers once, then on each command runs set+get on its own key for a fixed
time against the server named and reports how many operations it did. Rows
alternate which server goes first. The server's CPU (utime+stime from
/proc) over each timed window gives its CPU per operation.

Prints a table (or --json) with, per client count: operations per second of
each server, server CPU per operation, and the ratios (musterd/torch
throughput, musterd/torch CPU per op), against the goals throughput >= 1.2x
and CPU per op <= 0.5x; and the floor server's ratios to torch beside them:
what a server that does nothing else costs on this machine. If even the
floor cannot reach a ratio, no server can here.
"""
import argparse
import json
import os
import select
import subprocess
import sys
import tempfile
import time

CLIENT = r"""
import datetime, sys, time
import torch.distributed as d
idx, value = sys.argv[1], b"x" * int(sys.argv[2])
ports = {a.split("=")[0]: int(a.split("=")[1]) for a in sys.argv[3:]}
stores = {n: d.TCPStore("127.0.0.1", p, 1, False, datetime.timedelta(seconds=120))
          for n, p in ports.items()}
key = "bench/" + idx
for s in stores.values():
    s.set(key, value)
print("ready", flush=True)
for line in sys.stdin:
    name, seconds = line.split()
    s, seconds, ops = stores[name], float(seconds), 0
    t0 = time.monotonic()
    end = t0 + seconds
    while time.monotonic() < end:
        s.set(key, value)
        s.get(key)
        ops += 2
    print(ops, time.monotonic() - t0, flush=True)
"""

MASTER = r"""
import datetime, sys, time
import torch.distributed as d
s = d.TCPStore("127.0.0.1", int(sys.argv[1]), 1, True, datetime.timedelta(seconds=300),
               wait_for_workers=False)
print("ready", flush=True)
time.sleep(1e9)
"""


def progress(msg):
    print(f"muster-bench: {msg}", file=sys.stderr, flush=True)


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_line(proc, what, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r, _, _ = select.select([proc.stdout], [], [], 0.2)
        if r:
            line = proc.stdout.readline()
            if not line:
                break
            return line.strip()
        if proc.poll() is not None:
            break
    raise RuntimeError(f"{what} gave no answer within {timeout} s (exit {proc.poll()})")


def start_musterd(binary, tmp):
    ready = os.path.join(tmp, "ready.json")
    p = subprocess.Popen([binary, f"--socket={tmp}/s.sock", "--store-port=0", "--listen=127.0.0.1",
                          f"--ready-file={ready}", "--log-level=warning"],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=open(os.path.join(tmp, "musterd.log"), "w"))
    deadline = time.monotonic() + 60
    while not os.path.exists(ready):
        if p.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"musterd did not start: {open(tmp + '/musterd.log').read()}")
        time.sleep(0.02)
    return p, json.load(open(ready))["store_port"]


def start_floor(binary, torch2, extra_args):
    p = subprocess.Popen([binary, "--port", "0"] + (["--torch2"] if torch2 else []) + extra_args,
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    line = wait_line(p, "the floor server", 30)
    if not line.startswith("port "):
        raise RuntimeError(f"floor server: unexpected {line!r}")
    return p, int(line.split()[1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--musterd", required=True, help="musterd binary (-c opt)")
    ap.add_argument("--python", default="/usr/bin/python3",
                    help="interpreter whose torch runs the clients and the master")
    ap.add_argument("--clients", default="16,64", help="client process counts")
    ap.add_argument("--duration", type=float, default=3.0, help="seconds per timed window")
    ap.add_argument("--repeats", type=int, default=2, help="windows per server and count")
    ap.add_argument("--value-bytes", type=int, default=64)
    ap.add_argument("--floor", default="",
                    help="store-floor-server binary (default: bazel-bin/tools/ next to musterd's "
                         "daemon/; empty and not found: no floor server)")
    ap.add_argument("--floor-args", default="",
                    help="extra flags for the floor server (its knobs: --edge, --quickack, ...)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    counts = sorted(int(c) for c in a.clients.split(","))
    version = subprocess.run([a.python, "-c", "import torch; print(torch.__version__)"],
                             capture_output=True, text=True, check=True).stdout.strip()
    tmp = tempfile.mkdtemp(prefix="muster-bench-torch-")
    procs = []
    try:
        musterd, mport = start_musterd(a.musterd, tmp)
        procs.append(musterd)
        floor = a.floor or os.path.join(os.path.dirname(os.path.dirname(
            os.path.realpath(a.musterd))), "tools", "store-floor-server")
        servers = {"musterd": musterd.pid}
        ports = {"musterd": mport}
        if os.access(floor, os.X_OK):
            fproc, fport = start_floor(floor, not version.startswith("1."), a.floor_args.split())
            procs.append(fproc)
            servers["floor"], ports["floor"] = fproc.pid, fport
        else:
            progress(f"no floor server at {floor}: measuring musterd and torch only")
        tport = free_port()
        master = subprocess.Popen([a.python, "-c", MASTER, str(tport)], stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, text=True)
        procs.append(master)
        wait_line(master, "the PyTorch TCPStore master", 120)
        servers["torch"], ports["torch"] = master.pid, tport
        progress(f"torch {version}: starting {counts[-1]} client processes")
        clients = []
        for i in range(counts[-1]):
            c = subprocess.Popen([a.python, "-c", CLIENT, str(i), str(a.value_bytes)] +
                                 [f"{n}={p}" for n, p in ports.items()], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
            procs.append(c)
            clients.append(c)
        for i, c in enumerate(clients):
            if wait_line(c, f"client {i}", 300) != "ready":
                raise RuntimeError(f"client {i} did not get ready")
        names = list(servers)
        rows = []
        for n in counts:
            runs = {name: [] for name in names}
            for r in range(a.repeats):
                order = names if r % 2 == 0 else names[::-1]
                for name in order:
                    progress(f"{n} clients, {name}, window {r + 1}/{a.repeats}")
                    cpu0 = cpu_seconds(servers[name])
                    for c in clients[:n]:
                        c.stdin.write(f"{name} {a.duration}\n")
                        c.stdin.flush()
                    ops, secs = 0, 0.0
                    for i, c in enumerate(clients[:n]):
                        o, s = wait_line(c, f"client {i}", a.duration + 120).split()
                        ops += int(o)
                        secs = max(secs, float(s))
                    cpu = cpu_seconds(servers[name]) - cpu0
                    runs[name].append({"ops": ops, "seconds": secs, "server_cpu_s": cpu})
            row = {"clients": n}
            for name, rs in runs.items():
                ops = sum(x["ops"] for x in rs)
                secs = sum(x["seconds"] for x in rs)
                cpu = sum(x["server_cpu_s"] for x in rs)
                row[name] = {"ops_per_s": ops / secs, "server_cpu_us_per_op": cpu / ops * 1e6,
                             "server_cpu_percent": 100 * cpu / secs}
            row["throughput_ratio"] = row["musterd"]["ops_per_s"] / row["torch"]["ops_per_s"]
            row["cpu_per_op_ratio"] = (row["musterd"]["server_cpu_us_per_op"] /
                                       row["torch"]["server_cpu_us_per_op"])
            if "floor" in row:
                row["floor_throughput_ratio"] = (row["floor"]["ops_per_s"] /
                                                 row["torch"]["ops_per_s"])
                row["floor_cpu_per_op_ratio"] = (row["floor"]["server_cpu_us_per_op"] /
                                                 row["torch"]["server_cpu_us_per_op"])
            rows.append(row)
        result = {"torch": version, "clients": counts, "floor_args": a.floor_args, "duration_s": a.duration,
                  "repeats": a.repeats, "value_bytes": a.value_bytes, "rows": rows,
                  "goals": {"throughput_ratio": ">= 1.2", "cpu_per_op_ratio": "<= 0.5"}}
        if a.json:
            print(json.dumps(result, indent=1))
        else:
            print(f"store, PyTorch {version} TCPStore clients (set+get, {a.value_bytes} B values,"
                  f" {a.repeats} x {a.duration} s per server and count)")
            print(f"{'clients':>7} {'musterd op/s':>13} {'cpu us/op':>9} {'torch op/s':>11} "
                  f"{'cpu us/op':>9} {'thr ratio':>9} {'cpu ratio':>9}")
            for r in rows:
                m, t = r["musterd"], r["torch"]
                print(f"{r['clients']:>7} {m['ops_per_s']:>13.0f} {m['server_cpu_us_per_op']:>9.2f} "
                      f"{t['ops_per_s']:>11.0f} {t['server_cpu_us_per_op']:>9.2f} "
                      f"{r['throughput_ratio']:>8.2f}x {r['cpu_per_op_ratio']:>8.2f}x")
            print("goals: throughput ratio (musterd/torch) >= 1.2x, server CPU per op ratio <= 0.5x")
            if "floor" in names:
                print(f"floor server (tools/store_floor_server.cc {a.floor_args}".rstrip() +
                      "): no logging, no durability, only this benchmark's requests")
                print(f"{'clients':>7} {'floor op/s':>13} {'cpu us/op':>9} {'thr ratio':>9} "
                      f"{'cpu ratio':>9}  (floor/torch)")
                for r in rows:
                    f = r["floor"]
                    print(f"{r['clients']:>7} {f['ops_per_s']:>13.0f} "
                          f"{f['server_cpu_us_per_op']:>9.2f} "
                          f"{r['floor_throughput_ratio']:>8.2f}x "
                          f"{r['floor_cpu_per_op_ratio']:>8.2f}x")
        return 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for p in procs:
            try:
                p.wait(timeout=10)
            except Exception:
                pass


if __name__ == "__main__":
    sys.exit(main())
