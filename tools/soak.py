#!/usr/bin/env python3
"""Soak test of musterd (not in CI): an hour of mixed load, then a verdict.

    sudo tools/soak.sh [--minutes 60] [--out DIR] [--seed N] [--workers 4] [--flat-minutes 10]

Needs root and setpriv (ranks also run as `nobody`), and daemon/musterd,
tools/musterctl, test/muster-test-rank under $MUSTER_BIN_DIR (default: this
checkout's bazel-bin), copied first to a temporary directory every user may
enter (a rebuild meanwhile changes nothing); $TMPDIR needs ~2 GB an hour (the
flight-recorder dumps of the killed jobs). One musterd (root, --state-dir,
socket mode 0666, metrics on 127.0.0.1) serves, all at once:
  store     threads on the store's TCP protocol (PyTorch 1.13 dialect): counters
            (ADD), small keys set, deleted and read back; one thread overwrites
            100 KiB-1 MiB values (the log compacts). A ledger holds what each key
            may hold: its last acknowledged value, plus that of a write in flight
            when its connection broke. SET has no reply: the CHECK after it acks it.
  jobs      2-4 muster-test-rank processes as root or nobody: most run `init;arloop
            world` and one rank is SIGKILLed (the others must report it and exit
            within 60 s); the rest run barriers, a store loop, every collective.
  scrapes   GET /metrics every second, `musterctl status` every 10 s (root, nobody).
  restarts  every few minutes except in the middle 40% of the run (a lifetime long
            enough to judge leaks), and at the end: SIGTERM (exit within 30 s) or
            SIGKILL under store traffic, the same --state-dir (--store-fsync on or
            off), then every key in the ledgers is read back and checked.
  samples   every 10 s: musterd's RSS, threads, fds, shm segments, store keys.
A timeout while musterd is up is a hang; an error while it is up, a failure.
--out gets report.txt, samples.csv, musterd.log and failed-jobs/. Exit 0 only
with no acknowledged write lost, no hang, no failure, and flat fds and threads
in each lifetime of at least --flat-minutes (the median of its last 20% of
samples against that of 20-40%: at most +10% +8 fds, +10% +4 threads).
"""
import argparse
import hashlib
import http.client
import json
import os
import random
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BINARIES = {"musterd": "daemon/musterd", "musterctl": "tools/musterctl",
            "rank": "test/muster-test-rank"}
AS_NOBODY = ["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
HANG_S = 60  # a killed job's survivors must exit within this
COLUMNS = {"t": "t_s", "life": "lifetime", "pid": "pid", "rss": "rss_kib", "threads": "threads",
           "fds": "fds", "shm": "shm_segments", "keys": "store_keys", "event": "event"}


class StoreClient:
    """One store connection, PyTorch 1.13 wire format (little-endian)."""
    SET, GET, ADD, CHECK, DELETE = 0, 2, 3, 4, 8

    def __init__(self, port, gen, timeout=10):
        self.gen = gen  # the musterd lifetime it was opened in
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def call(self, op, *fields, reply=None):
        """Sends a request (ints as 8 bytes, byte strings after their length);
        reads a reply: 1 byte, an int (8 bytes) or a byte string."""
        self.sock.sendall(bytes([op]) + b"".join(
            struct.pack("<q", f) if isinstance(f, int) else struct.pack("<Q", len(f)) + f
            for f in fields))
        if reply == "byte":
            return self._recv(1)
        if reply in ("int", "bytes"):
            n = struct.unpack("<q", self._recv(8))[0]
            return n if reply == "int" else self._recv(n)

    def _recv(self, size):
        buf = bytearray()
        while len(buf) < size:
            chunk = self.sock.recv(min(size - len(buf), 1 << 20))
            if not chunk:
                raise ConnectionError("the store closed the connection")
            buf += chunk
        return bytes(buf)

    def present(self, key):
        return self.call(self.CHECK, 1, key, reply="byte") == b"\0"  # (a list of one key)

    def set(self, key, value):
        self.call(self.SET, key, value)
        if not self.present(key):
            raise RuntimeError(f"{key!r} missing right after its SET")

    def get(self, key):  # None: no such key
        return self.call(self.GET, key, reply="bytes") if self.present(key) else None


def describe(value):
    if value is None or len(value) <= 64:
        return "absent" if value is None else repr(value)
    return f"{value[:20]!r}... ({len(value)} bytes, sha1 {hashlib.sha1(value).hexdigest()[:10]})"


class Ledger:
    """What each key of one worker may hold: {sha1: value} (None: absent; a
    value over 64 bytes is kept as its description). Only that worker writes
    them, never while a restart's verification runs."""

    def __init__(self):
        self.possible = {}

    def values(self, key):
        return list(self.possible.get(key, {None: None}).values())

    def begin(self, key, value):  # a write in flight: it may land or not
        kept = value if value is None or len(value) <= 64 else describe(value)
        self.possible.setdefault(key, {None: None})[value and hashlib.sha1(value).digest()] = kept

    def ack(self, key, value):
        self.possible[key] = {}
        self.begin(key, value)

    def allows(self, key, value):
        return (value and hashlib.sha1(value).digest()) in self.possible.get(key, {None: None})

    def expected(self, key):
        return " or ".join(v if isinstance(v, str) else describe(v) for v in self.values(key))


class Daemon:
    """The soak's musterd; each start is a new lifetime."""

    def __init__(self, soak):
        self.soak, self.proc, self.life, self.pids = soak, None, 0, []
        self.up, self.gen = False, 0  # gen changes whenever `up` does
        self.store_port = self.metrics_port = 0  # 0 at first: free ports, kept after
        self.state_dir = soak.tmp / "state"
        self.state_dir.mkdir(mode=0o700)
        self.ready = soak.tmp / "ready.json"

    def start(self, fsync):
        self.ready.unlink(missing_ok=True)
        args = [self.soak.bins["musterd"], f"--socket={self.soak.socket}", "--socket-mode=0666",
                "--listen=127.0.0.1", "--grpc-port=0", f"--store-port={self.store_port}",
                f"--state-dir={self.state_dir}", f"--metrics-listen=127.0.0.1:{self.metrics_port}",
                f"--ready-file={self.ready}", f"--store-fsync={str(fsync).lower()}"]
        with open(self.soak.out / "musterd.log", "ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=log, start_new_session=True)
        deadline = time.time() + 30
        while time.time() < deadline and self.proc.poll() is None:
            try:
                ready = json.loads(self.ready.read_text())
                if ready["pid"] == self.proc.pid:
                    break
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.05)
        else:
            raise RuntimeError(f"musterd not ready in 30 s (exit {self.proc.poll()}); "
                               "see musterd.log")
        self.store_port, self.metrics_port = ready["store_port"], ready["metrics_port"]
        self.life += 1
        self.pids.append(self.proc.pid)
        self.gen, self.up = self.gen + 1, True
        self.soak.sample(f"start fsync={'on' if fsync else 'off'}")

    def stop(self, sig):
        """SIGTERM or SIGKILL; False if it has not exited 30 s later (then SIGKILL)."""
        self.soak.sample(f"stop {sig.name}")
        self.gen, self.up = self.gen + 1, False
        self.proc.send_signal(sig)
        try:
            code = self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return False
        if sig == signal.SIGTERM and code != 0:
            self.soak.failure(f"musterd exited {code} on SIGTERM (expected 0)")
        return True

    def stable(self, gen):  # up, and not restarted since lifetime `gen`
        return self.up and self.gen == gen


class Soak:
    def __init__(self, args, tmp):
        self.args, self.tmp, self.out = args, tmp, Path(args.out)
        self.rng = random.Random(args.seed)
        self.stop_event, self.interrupted = threading.Event(), False
        self.lock = threading.Lock()  # counts, problems, samples
        self.counts = dict.fromkeys([
            "store ops", "store errors in restarts", "acked writes checked", "verifications",
            "restarts", "SIGTERM", "SIGKILL", "fsync lifetimes", "jobs", "root jobs",
            "nobody jobs", "finished jobs", "rank kills", "metrics scrapes", "musterctl status"], 0)
        self.lost, self.hangs, self.failures = [], [], []
        self.samples, self.metrics = [], {}
        self.t0 = time.time()
        self.socket = tmp / "musterd.sock"
        self.bins = self.copy_binaries()
        self.daemon = Daemon(self)
        self.ledgers = [Ledger() for _ in range(args.workers)]
        self.worker_locks = [threading.Lock() for _ in range(args.workers)]
        self.jobs_lock = threading.Lock()  # held by a job; a restart waits for it
        self.ranks = set()  # live rank processes, for cleanup
        self.csv = open(self.out / "samples.csv", "w")
        self.csv.write(",".join(COLUMNS.values()) + "\n")

    def copy_binaries(self):
        bin_dir = Path(os.environ.get("MUSTER_BIN_DIR", REPO / "bazel-bin"))
        (self.tmp / "bin").mkdir(mode=0o755)
        for name, rel in BINARIES.items():
            shutil.copyfile(bin_dir / rel, self.tmp / "bin" / name)
            (self.tmp / "bin" / name).chmod(0o755)
        return {name: str(self.tmp / "bin" / name) for name in BINARIES}

    def count(self, name, n=1):
        with self.lock:
            self.counts[name] += n

    def minutes(self):
        return (time.time() - self.t0) / 60

    def note(self, where, text):
        with self.lock:
            where.append(f"[{self.minutes():.1f} min] {text}")
        sys.stdout.write(f"soak: {text}\n")  # (one write: other threads print too)
        sys.stdout.flush()

    def hang(self, text):
        self.note(self.hangs, "HANG: " + text)

    def failure(self, text):
        self.note(self.failures, "FAILURE: " + text)

    def problem(self, gen, what, error):
        """An error: a hang (a timeout) or a failure if musterd was up throughout."""
        if not self.daemon.stable(gen):
            self.count("store errors in restarts", what.startswith("store"))
        elif isinstance(error, (TimeoutError, subprocess.TimeoutExpired)):
            self.hang(f"{what}: {error}")
        else:
            self.failure(f"{what}: {error!r}")

    def every(self, seconds, fn):  # a thread's body
        while not self.stop_event.wait(seconds):
            fn()

    def sample(self, event=""):
        pid = self.daemon.proc.pid
        row = dict(t=round(time.time() - self.t0, 1), life=self.daemon.life, pid=pid, event=event)
        try:
            status = dict(line.split(":", 1) for line in
                          Path(f"/proc/{pid}/status").read_text().splitlines())
            row.update(rss=int(status["VmRSS"].split()[0]), threads=int(status["Threads"]),
                       fds=len(os.listdir(f"/proc/{pid}/fd")))
        except (OSError, KeyError, ValueError):
            row.update(rss="", threads="", fds="")
        row["shm"] = sum(n.startswith(f"muster.{pid}.") for n in os.listdir("/dev/shm"))
        row["keys"] = int(float(self.metrics["muster_store_keys"])) \
            if "muster_store_keys" in self.metrics else ""
        with self.lock:
            self.samples.append(row)
            self.csv.write(",".join(str(row[k]) for k in COLUMNS) + "\n")
            self.csv.flush()

    # -- store traffic --------------------------------------------------------
    def store_worker(self, wid):
        rng, client, seq = random.Random(self.args.seed * 1000 + wid), None, 0
        while not self.stop_event.is_set():
            with self.worker_locks[wid]:
                gen = client.gen if client else self.daemon.gen
                try:
                    client = client or StoreClient(self.daemon.store_port, gen)
                    seq += 1
                    self.store_op(client, rng, self.ledgers[wid], f"soak/w{wid}/", wid == 0, seq)
                    self.count("store ops")
                except (OSError, RuntimeError) as e:
                    if client:
                        client.sock.close()
                    client = None
                    self.problem(gen, f"store worker {wid}", e)
            time.sleep(1.0 if wid == 0 else 0.01 if client else 0.2)

    def store_op(self, client, rng, ledger, prefix, big, seq):
        """One operation on this worker's keys, checked against its ledger."""
        key = f"{prefix}k{rng.randrange(20)}".encode()
        op = rng.random()
        if big:  # large values, overwritten: the log outgrows 2x its data and compacts
            key = f"{prefix}big{rng.randrange(6)}".encode()
            value = (key + f"#{seq};".encode()) * 60000
            value = value[:rng.randint(100 << 10, 1 << 20)]
            ledger.begin(key, value)
            client.set(key, value)
            ledger.ack(key, value)
        elif op < 0.4:  # a counter (the store keeps it as decimal text)
            key, delta = f"{prefix}ctr{rng.randrange(5)}".encode(), rng.randint(1, 9)
            for value in ledger.values(key):
                ledger.begin(key, str(int(value or 0) + delta).encode())
            got = str(client.call(client.ADD, key, delta, reply="int")).encode()
            self.check(ledger, key, got)
        elif op < 0.75:
            value = f"{key.decode()}={seq}".encode()
            ledger.begin(key, value)
            client.set(key, value)
            ledger.ack(key, value)
        elif op < 0.85:
            ledger.begin(key, None)
            client.call(client.DELETE, key, reply="int")
            ledger.ack(key, None)
        else:
            self.check(ledger, key, client.get(key))

    def check(self, ledger, key, got):
        """`got` was read from `key`: it must be a value the ledger allows."""
        if not ledger.allows(key, got):
            self.note(self.lost, f"LOST: {key.decode()}: expected {ledger.expected(key)}, "
                                 f"got {describe(got)}")
        ledger.ack(key, got)

    def verify(self):
        """After a restart: every key of every ledger holds an allowed value."""
        client = StoreClient(self.daemon.store_port, self.daemon.gen, timeout=30)
        try:
            for ledger in self.ledgers:
                for key in list(ledger.possible):
                    self.check(ledger, key, client.get(key))
                    self.count("acked writes checked")
        finally:
            client.sock.close()
        self.count("verifications")

    # -- jobs -----------------------------------------------------------------
    def job_loop(self):
        rng = random.Random(self.args.seed + 7)
        while not self.stop_event.is_set():
            with self.jobs_lock:
                if self.daemon.up:
                    self.run_job(rng)
            self.stop_event.wait(rng.uniform(0.5, 2))

    def spawn_ranks(self, job, world, nobody, script):
        env = dict(os.environ, WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(self.daemon.store_port),
                   MUSTER_SOCKET=str(self.socket), MUSTER_JOB_ID=job,
                   MUSTER_TEST_INIT_TIMEOUT_MS="30000")
        jobdir = self.tmp / "jobs" / job
        jobdir.mkdir(parents=True)
        ranks = []
        for r in range(world):
            env.update(RANK=str(r), LOCAL_RANK=str(r))
            with open(jobdir / f"rank{r}.out", "wb") as out:
                ranks.append(subprocess.Popen(
                    (AS_NOBODY if nobody else []) + [self.bins["rank"], script], env=env,
                    stdout=out, stderr=subprocess.STDOUT, cwd=self.tmp, start_new_session=True))
            self.ranks.add(ranks[-1])
        return jobdir, ranks

    @staticmethod
    def outputs(jobdir, world):
        return [(jobdir / f"rank{r}.out").read_text(errors="replace") for r in range(world)]

    @staticmethod
    def wait_ranks(ranks, deadline):
        """Waits for the ranks to exit; returns those still running at the deadline."""
        for p in ranks:
            try:
                p.wait(max(0.01, deadline - time.time()))
            except subprocess.TimeoutExpired:
                pass
        return [p for p in ranks if p.poll() is None]

    def run_job(self, rng):
        world, nobody, kill = rng.randint(2, 4), rng.random() < 0.5, rng.random() < 0.7
        self.count("jobs")
        self.count("nobody jobs" if nobody else "root jobs")
        job = f"soak-{self.counts['jobs']}-{'nobody' if nobody else 'root'}"
        script = "init;arloop world" if kill else \
            "init;barrier world;storeloop world 20;xops world;barrier world"
        jobdir, ranks = self.spawn_ranks(job, world, nobody, script)
        ok = False
        try:
            ok = (self.killed_job if kill else self.finished_job)(rng, job, jobdir, ranks)
        finally:
            for p in self.wait_ranks(ranks, time.time() + (0 if ok else 5)):
                p.kill()
                p.wait()
            self.ranks.difference_update(ranks)
            if ok:
                shutil.rmtree(jobdir)
            else:
                shutil.move(str(jobdir), str(self.out / "failed-jobs" / job))

    def killed_job(self, rng, job, jobdir, ranks):
        world, deadline = len(ranks), time.time() + HANG_S
        while not all("arloop world running" in o for o in self.outputs(jobdir, world)):
            if any(p.poll() is not None for p in ranks):
                self.failure(f"job {job}: a rank exited before its all_reduce loop ran")
                return False
            if time.time() > deadline:
                self.hang(f"job {job}: the all_reduce loop did not start in {HANG_S} s")
                return False
            time.sleep(0.1)
        time.sleep(rng.uniform(0.5, 3))
        victim = rng.randrange(world)
        ranks[victim].kill()
        self.count("rank kills")
        stuck = self.wait_ranks(ranks, time.time() + HANG_S)
        if stuck:
            self.hang(f"job {job}: rank(s) {[ranks.index(p) for p in stuck]} still running "
                      f"{HANG_S} s after rank {victim} was killed")
            return False
        outs = self.outputs(jobdir, world)
        silent = [r for r in range(world) if r != victim and "arloop world error" not in outs[r]]
        if silent:
            self.failure(f"job {job}: rank(s) {silent} exited without reporting the failure")
        return not silent

    def finished_job(self, rng, job, jobdir, ranks):
        if self.wait_ranks(ranks, time.time() + 2 * HANG_S):
            self.hang(f"job {job}: not finished in {2 * HANG_S} s")
            return False
        codes = [p.returncode for p in ranks]
        if any(codes) or any(" error " in o for o in self.outputs(jobdir, len(ranks))):
            self.failure(f"job {job}: exit codes {codes}; see failed-jobs/{job}")
            return False
        self.count("finished jobs")
        return True

    # -- scrapes --------------------------------------------------------------
    def scrape(self):
        gen = self.daemon.gen
        try:
            url = f"http://127.0.0.1:{self.daemon.metrics_port}/metrics"
            with urllib.request.urlopen(url, timeout=10) as reply:
                text = reply.read().decode()
        except (OSError, http.client.HTTPException) as e:
            return self.problem(gen, "GET /metrics", getattr(e, "reason", e))
        for line in text.splitlines():
            if line.startswith(("muster_store_keys ", "muster_store_value_bytes ")):
                self.metrics.update([line.split()])
        self.count("metrics scrapes")

    def status(self, rng):
        gen, who = self.daemon.gen, rng.choice(["root", "nobody"])
        argv = (AS_NOBODY if who == "nobody" else []) + [
            self.bins["musterctl"], f"--socket={self.socket}", "--timeout=5", "status"]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=20)
            if done.returncode != 0:  # (musterctl's own --timeout: a hang)
                error = TimeoutError if "Deadline Exceeded" in done.stderr else RuntimeError
                raise error(f"exit {done.returncode}: {done.stdout}{done.stderr}".strip())
            self.count("musterctl status")
        except (subprocess.TimeoutExpired, TimeoutError, RuntimeError) as e:
            self.problem(gen, f"musterctl status as {who}", e)

    # -- restarts and the run -------------------------------------------------
    def restart(self, sig, final=False):
        """Stops musterd under store traffic (no job running), starts it again, verifies."""
        with self.jobs_lock:
            if not self.daemon.stop(sig):
                self.hang(f"musterd (pid {self.daemon.proc.pid}) still running 30 s after "
                          f"{sig.name}")
            self.count("restarts")
            self.count(sig.name)
            for lock in self.worker_locks:
                lock.acquire()
            try:
                fsync = self.rng.random() < 0.5 and not final
                self.count("fsync lifetimes", fsync)
                self.daemon.start(fsync)
                self.verify()
            except (OSError, RuntimeError) as e:  # no musterd: the soak ends here
                self.failure(f"restart {self.counts['restarts']}: {e!r}")
                self.stop_event.set()
            finally:
                for lock in self.worker_locks:
                    lock.release()

    def schedule(self):
        """Restart times: every ~T/15 (45 s to 5 min), none in [0.3 T, 0.7 T)."""
        total, times, t = self.args.minutes * 60, [], 0.0
        step = min(300.0, max(45.0, total / 15))
        while True:
            t += step * self.rng.uniform(0.75, 1.25)
            if 0.3 * total <= t < 0.7 * total:
                t = 0.7 * total
            if t > total - step / 2:
                return times
            times.append(t)

    def run(self):
        try:
            self.daemon.start(fsync=False)
        except (OSError, RuntimeError) as e:
            return self.failure(f"musterd did not start: {e}")
        srng = random.Random(self.args.seed + 3)
        bodies = [lambda: self.every(10, lambda: self.daemon.up and self.sample()),
                  self.job_loop, lambda: self.every(1, self.scrape),
                  lambda: self.every(10, lambda: self.status(srng))]
        bodies += [lambda w=w: self.store_worker(w) for w in range(self.args.workers)]
        threads = [threading.Thread(target=b, daemon=True) for b in bodies]
        for t in threads:
            t.start()
        restarts, progress = self.schedule(), 1
        while self.minutes() < self.args.minutes and not self.stop_event.is_set():
            time.sleep(0.5)
            if restarts and self.minutes() * 60 >= restarts[0]:
                restarts.pop(0)
                self.restart(self.rng.choice([signal.SIGTERM, signal.SIGKILL]))
            if self.minutes() >= progress:
                progress += 1
                self.progress()
        ended_early = self.stop_event.is_set()  # Ctrl-C, or musterd did not start
        self.stop_event.set()
        for t in threads:
            t.join(3 * HANG_S)
            if t.is_alive():
                self.hang(f"soak thread {t.name} did not stop in {3 * HANG_S} s")
        if not ended_early:
            self.restart(signal.SIGTERM, final=True)  # a last check of every acked write
        if self.daemon.up and not self.daemon.stop(signal.SIGTERM):
            self.hang("musterd still running 30 s after the final SIGTERM")

    def progress(self):
        s = next((s for s in reversed(self.samples) if s["fds"] != ""), {})
        c = self.counts
        print(f"[{self.minutes():.1f} min] store ops {c['store ops']}, jobs {c['jobs']} (kills "
              f"{c['rank kills']}), scrapes {c['metrics scrapes']}, restarts {c['restarts']}, "
              f"compactions {self.compactions()}; lost {len(self.lost)}, hangs {len(self.hangs)},"
              f" failures {len(self.failures)}; musterd pid {s.get('pid')}: fds {s.get('fds')}, "
              f"threads {s.get('threads')}, rss {(s.get('rss') or 0) / 1024:.1f} MiB", flush=True)

    def compactions(self):
        return (self.out / "musterd.log").read_text(errors="replace").count("compacted store log")

    # -- report ---------------------------------------------------------------
    def flatness(self):
        """(lines, flat): per lifetime, the last 20% of samples against 20-40%."""
        lines, flat = [], True
        for life in range(1, self.daemon.life + 1):
            rows = [s for s in self.samples if s["life"] == life and s["fds"] != ""]
            span = (rows[-1]["t"] - rows[0]["t"]) / 60 if rows else 0
            head = f"lifetime {life} (pid {self.daemon.pids[life - 1]}, {span:.1f} min, " \
                   f"{len(rows)} samples)"
            if span < self.args.flat_minutes or len(rows) < 10:
                lines.append(f"{head}: not judged (shorter than {self.args.flat_minutes:g} min)")
                continue
            n = len(rows)
            parts = rows[n // 5:max(2 * n // 5, n // 5 + 1)], rows[4 * n // 5:]
            a, b = ({k: statistics.median([r[k] for r in part if r[k] != ""] or [float("nan")])
                     for k in ["fds", "threads", "rss", "shm", "keys"]} for part in parts)
            ok = b["fds"] <= a["fds"] * 1.1 + 8 and b["threads"] <= a["threads"] * 1.1 + 4
            flat = flat and ok
            lines.append(f"{head}: fds {a['fds']:g} -> {b['fds']:g}, threads {a['threads']:g} -> "
                         f"{b['threads']:g}: {'flat' if ok else 'GROWING'}; RSS "
                         f"{a['rss'] / 1024:.1f} -> {b['rss'] / 1024:.1f} MiB "
                         f"({(b['rss'] / a['rss'] - 1) * 100:+.0f}%), shm segments "
                         f"{a['shm']:g} -> {b['shm']:g}, store keys {a['keys']:g} -> {b['keys']:g}")
        return lines, flat

    def report(self):
        flat_lines, flat = self.flatness()
        left = [n for n in os.listdir("/dev/shm")
                if any(n.startswith(f"muster.{pid}.") for pid in self.daemon.pids)]
        if left:
            self.failure(f"shared memory left after musterd stopped: {left[:5]}")
        dumps = list((self.daemon.state_dir / "dumps").glob("*.json"))
        log = (self.out / "musterd.log").read_text(errors="replace").splitlines()
        errors = [line for line in log if " E musterd" in line or " F musterd" in line]
        c, m = self.counts, self.metrics
        ok = not (self.lost or self.hangs or self.failures or self.interrupted) and flat
        listed = lambda items: [f"  {line}" for line in items[:20]]  # noqa: E731
        text = [
            f"muster soak: {self.minutes():.1f} min{' (INTERRUPTED)' * self.interrupted}, "
            f"seed {self.args.seed}, {self.args.workers} store workers",
            f"store ops: {c['store ops']} ({c['store errors in restarts']} errors in restarts)",
            f"acked writes checked: {c['acked writes checked']} in {c['verifications']} "
            "verifications after restarts",
            f"compactions: {self.compactions()}",
            f"restarts: {c['restarts']} (SIGTERM {c['SIGTERM']}, SIGKILL {c['SIGKILL']}; "
            f"{c['fsync lifetimes']} of {self.daemon.life} lifetimes with --store-fsync)",
            f"jobs: {c['jobs']} (root {c['root jobs']}, nobody {c['nobody jobs']}; finished "
            f"{c['finished jobs']}), rank kills: {c['rank kills']}",
            f"scrapes: {c['metrics scrapes']} GET /metrics, {c['musterctl status']} musterctl status",
            f"store at the last scrape: {m.get('muster_store_keys', '?')} keys, "
            f"{m.get('muster_store_value_bytes', '?')} bytes",
            f"flight-recorder dumps: {len(dumps)} files, "
            f"{sum(d.stat().st_size for d in dumps) / 2**20:.0f} MiB",
            f"musterd log: {len(log)} lines, {len(errors)} at ERROR or worse", *listed(errors),
            f"acknowledged writes lost: {len(self.lost)}", *listed(self.lost),
            f"hangs: {len(self.hangs)}", *listed(self.hangs),
            f"failures: {len(self.failures)}", *listed(self.failures),
            *flat_lines,
            f"fds/threads: {'flat' if flat else 'GROWING'}",
            f"verdict: {'PASS' if ok else 'FAIL'}"]
        (self.out / "report.txt").write_text("\n".join(text) + "\n")
        print("\n".join(text), flush=True)
        return ok

    def interrupt(self, *_):
        """Ctrl-C: stop and report; a second one: stop at once (cleanup still runs)."""
        if self.interrupted:
            raise KeyboardInterrupt
        self.interrupted = True
        self.stop_event.set()
        print("soak: interrupted; stopping (Ctrl-C again to skip the report)", flush=True)

    def cleanup(self):
        self.stop_event.set()
        for p in list(self.ranks) + ([self.daemon.proc] if self.daemon.proc else []):
            if p.poll() is None:
                p.kill()
                p.wait()
        self.csv.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument("--out", default=f"/tmp/muster-soak-{time.strftime('%Y%m%dT%H%M%S')}")
    parser.add_argument("--seed", type=int, default=int(time.time()) % 100000)
    parser.add_argument("--workers", type=int, default=4, help="store threads (one of them "
                        "writes the large values)")
    parser.add_argument("--flat-minutes", type=float, default=10,
                        help="judge fds and threads in the lifetimes at least this long")
    args = parser.parse_args()
    if os.geteuid() != 0 or not os.access(AS_NOBODY[0], os.X_OK):
        sys.exit("soak: needs root and /usr/bin/setpriv (ranks also run as nobody)")
    out = Path(args.out)
    shutil.rmtree(out / "failed-jobs", ignore_errors=True)
    (out / "failed-jobs").mkdir(parents=True)
    (out / "musterd.log").unlink(missing_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="muster-soak-"))
    tmp.chmod(0o755)  # nobody's ranks reach the socket and the binaries
    try:
        soak = Soak(args, tmp)
    except OSError as e:
        shutil.rmtree(tmp)
        sys.exit(f"soak: {e} (set MUSTER_BIN_DIR to the bazel-bin with the binaries)")
    signal.signal(signal.SIGINT, soak.interrupt)
    signal.signal(signal.SIGTERM, soak.interrupt)
    print(f"soak: {args.minutes:g} min, seed {args.seed}, out {out}", flush=True)
    ok = False
    try:
        soak.run()
        ok = soak.report()
    finally:
        soak.cleanup()
    sys.exit(0 if ok else 130 if soak.interrupted else 1)


if __name__ == "__main__":
    main()
