#!/usr/bin/env bash
# CPU collectives, side by side on this machine: muster (muster-bench
# collectives under muster-run), torch.distributed gloo (Debian's
# python3-torch 1.13, tools/bench_torch_collectives.py) and Open MPI over its
# shared-memory transport (tools/bench_mpi_collectives.c, built here with
# mpicc -O2 into a temporary directory). Same ops, sizes, dtype, iterations,
# timing and JSON fields for all three; each runs with its own defaults
# (Open MPI's process binding included, see docs/benchmarks.md).
#
# Usage: tools/bench_collectives.sh [--worlds "2 4"] [--repeats R] [--max-load L]
#                                   [--no-build] [--no-doc] [--keep DIR] [--quick]
#                                   [--shared] [--ops LIST] [--sizes LIST] [--iters LIST]
#                                   [--hog N [--hog-cpu C]] [--muster-bind cores|none]
#                                   [--cpuset CPUS] [--muster-node-cpus N] [--plan]
#        tools/bench_collectives.sh --report DIR [--no-doc]
#   --worlds      world sizes (default "2 4")
#   --hog N       CPU contention: every system also runs each pass with N
#                 busy processes (a shell loop each) beside it, started before
#                 and stopped after that system's run, the same for all three;
#                 the idle and the loaded runs are reported side by side (p50
#                 and p99 of the small sizes) against the contention targets
#   --hog-cpu C   pin the first busy process to CPU C (taskset), e.g.
#                 `--hog 1 --hog-cpu 0`: one busy process on one core
#   --muster-bind cores|none  muster-run's --bind for muster's ranks (default
#                 none, muster-run's default; Open MPI binds to cores by its
#                 own default)
#   --cpuset CPUS run every system's job inside a new cgroup cpuset of
#                 these CPUs (e.g. 0, or 0-3: as a container limited with
#                 --cpuset-cpus; cgroup v1 or v2, as root); the hogs stay
#                 outside it. Prints the table only (no doc)
#   --muster-node-cpus N  muster's embedded musterd runs with --node-cpus N
#                 (default: musterd measures its affinity); with --cpuset,
#                 shows how muster waited before musterd read the cpuset.
#                 Prints the table only (no doc)
#   --shared      also run muster with AllocShared buffers (muster-bench
#                 --shared: zero-copy), shown next to muster's ordinary buffers;
#                 the doc block is then the "zero-copy" one (see below)
#   --ops, --sizes, --iters  override the ops, sizes (bytes, K/M suffixes) and
#                 iterations (one per size) of every system
#   --repeats     full passes, the three systems taking turns within each pass
#                 (muster and Open MPI back to back, which goes first
#                 alternating between passes, then gloo);
#                 the table shows the median over the passes (default 3)
#   --max-load    first wait (up to 10 min) until the 1-minute load average is
#                 below L (default: do not wait)
#   --no-build    use the -c opt binaries already in bazel-out/k8-opt
#   --no-doc      print the table only; leave docs/benchmarks.md alone
#   --keep DIR    keep the raw JSON lines (results.jsonl) and the run's details
#                 (meta.env) in DIR
#   --report DIR  run nothing: make the table again from a --keep directory
#   --quick       a short run (small sizes, few iterations, one pass, no doc)
#   --plan        print the order of the runs the other options ask for, one
#                 "PASS WORLD LOAD SYSTEM" line each, and exit (nothing is
#                 built or run)
#
# Needs: Bazel (muster-bench, muster-run), /usr/bin/python3 with torch, and
# Open MPI (mpicc, mpirun: `tools/setup.sh --bench` installs them).
# The table and the targets go to stdout and, unless --no-doc, into the
# section "## CPU collectives: muster vs torch gloo vs Open MPI" of
# docs/benchmarks.md (between its generated-block markers; text around them
# is kept); with --shared, into "## Zero-copy collectives (AllocShared): ..."
# instead. Progress goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
cmdline="tools/bench_collectives.sh${*:+ $*}"

worlds="2 4"
repeats=3
max_load=""
build=1
doc=1
keep=""
report=""
quick=0
shared=0
ops_arg=""
sizes_arg=""
iters_arg=""
hog=0
hog_cpu=""
muster_bind=none
cpuset=""
node_cpus=""
plan_only=0
while (($#)); do
  case "$1" in
    --worlds) worlds="$2"; shift 2 ;;
    --repeats) repeats="$2"; shift 2 ;;
    --max-load) max_load="$2"; shift 2 ;;
    --no-build) build=0; shift ;;
    --no-doc) doc=0; shift ;;
    --keep) keep="$2"; shift 2 ;;
    --quick) quick=1; doc=0; repeats=1; shift ;;
    --report) report="$2"; build=0; shift 2 ;;
    --shared) shared=1; shift ;;
    --ops) ops_arg="$2"; shift 2 ;;
    --sizes) sizes_arg="$2"; shift 2 ;;
    --iters) iters_arg="$2"; shift 2 ;;
    --hog) hog="$2"; shift 2 ;;
    --hog-cpu) hog_cpu="$2"; shift 2 ;;
    --muster-bind) muster_bind="$2"; shift 2 ;;
    --cpuset) cpuset="$2"; doc=0; shift 2 ;;
    --muster-node-cpus) node_cpus="$2"; doc=0; shift 2 ;;
    --plan) plan_only=1; shift ;;
    -h|--help) awk 'NR == 1 { next } !/^#/ { exit } { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    *) echo "bench_collectives: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

OPS=all_reduce,broadcast,all_gather,reduce_scatter,barrier
DTYPE=float32
# Small sizes: 20,000 iterations, enough for a p99.
SIZES=4,4096,262144,4194304,16777216,67108864
ITERS=20000,20000,1000,100,20,10
if ((quick)); then
  SIZES=4,4096,262144
  ITERS=200,200,50
fi
[[ $muster_bind == cores || $muster_bind == none ]] ||
  { echo "bench_collectives: --muster-bind takes cores or none, not '$muster_bind'" >&2; exit 2; }
[[ $repeats =~ ^[1-9][0-9]*$ ]] ||
  { echo "bench_collectives: --repeats takes a count of 1 or more, not '$repeats'" >&2; exit 2; }
for w in $worlds; do
  if [[ ! $w =~ ^[0-9]+$ ]] || ((w < 2)); then
    echo "bench_collectives: --worlds takes world sizes of 2 or more, not '$w'" >&2; exit 2
  fi
done
[[ -n ${worlds// /} ]] || { echo "bench_collectives: --worlds is empty" >&2; exit 2; }
[[ -z $report ]] || ((!plan_only)) ||
  { echo "bench_collectives: --plan is for a run; --report DIR runs nothing" >&2; exit 2; }
[[ $hog =~ ^[0-9]+$ ]] || { echo "bench_collectives: --hog takes a count, not '$hog'" >&2; exit 2; }
if [[ -n $hog_cpu ]]; then
  [[ $hog_cpu =~ ^[0-9]+$ ]] || { echo "bench_collectives: --hog-cpu takes a CPU number, not '$hog_cpu'" >&2; exit 2; }
  ((hog > 0)) || { echo "bench_collectives: --hog-cpu needs --hog N (N >= 1)" >&2; exit 2; }
fi
[[ -z $cpuset || $cpuset =~ ^[0-9,-]+$ ]] ||
  { echo "bench_collectives: --cpuset takes a CPU list like 0 or 0-3, not '$cpuset'" >&2; exit 2; }
[[ -z $node_cpus || $node_cpus =~ ^[0-9]+$ ]] ||
  { echo "bench_collectives: --muster-node-cpus takes a count, not '$node_cpus'" >&2; exit 2; }
[[ -n $ops_arg ]] && OPS="$ops_arg"
[[ -n $sizes_arg ]] && SIZES="$sizes_arg"
[[ -n $iters_arg ]] && ITERS="$iters_arg"
PY=/usr/bin/python3
OPT=bazel-out/k8-opt/bin/tools
say() { echo "bench_collectives: $*" >&2; }

# The order of the runs, one "PASS WORLD LOAD SYSTEM" line each. muster and
# Open MPI run back to back (the ratios compare them: the machine drifts less
# between them than across gloo's longer run), the first of the two
# alternating between passes; then the others. In each world the idle runs
# come before the runs beside the busy processes.
plan() {
  local pass w load system systems loads=(idle)
  ((hog > 0)) && loads+=(hog)
  for ((pass = 1; pass <= repeats; pass++)); do
    if ((pass % 2 == 1)); then systems=(muster mpi); else systems=(mpi muster); fi
    ((shared)) && systems+=(muster-shared)
    systems+=(gloo)
    for w in $worlds; do
      for load in "${loads[@]}"; do
        for system in "${systems[@]}"; do echo "$pass $w $load $system"; done
      done
    done
  done
}
if ((plan_only)); then
  plan
  exit 0
fi

if [[ -n $report ]]; then
  [[ -f $report/results.jsonl && -f $report/meta.env ]] ||
    { say "$report has no results.jsonl and meta.env (made by --keep)"; exit 2; }
  # shellcheck disable=SC1091
  source "$report/meta.env"
  # A --cpuset or --muster-node-cpus run is not the doc's table.
  [[ $REPORT_SETUP == *"cgroup cpuset"* || $REPORT_SETUP == *"--node-cpus"* ]] && doc=0
  REPORT_RESULTS="$report/results.jsonl"
  failed=0
else
  command -v mpicc >/dev/null && command -v mpirun >/dev/null || {
    say "Open MPI is missing (mpicc, mpirun): run tools/setup.sh --bench"
    exit 1
  }
  "$PY" -c 'import torch.distributed' 2>/dev/null || {
    say "$PY cannot import torch.distributed (Debian's python3-torch)"
    exit 1
  }

  # Where the bazel-bin link pointed before the -c opt build moved it (empty
  # in a fresh clone: nothing to point back to, and no fastbuild to wait for).
  bin_before="$(readlink bazel-bin 2>/dev/null || true)"
  if ((build)); then
    say "building muster-bench and muster-run (-c opt)"
    bazel build -c opt //tools:muster-bench //tools:muster-run >&2
  fi
  for b in muster-bench muster-run; do
    [[ -x $OPT/$b ]] || { say "$OPT/$b is missing (build with -c opt)"; exit 1; }
  done
  [[ -x bazel-out/k8-opt/bin/daemon/musterd ]] || { say "musterd (-c opt) is missing"; exit 1; }

  tmp="$(mktemp -d /tmp/bench-collectives-XXXXXX)"
  trap 'rm -rf "$tmp"' EXIT
  if [[ -n $hog_cpu ]] && ! command -v taskset >/dev/null; then
    say "--hog-cpu needs taskset (util-linux)"; exit 1
  fi
  # --cpuset: a cgroup every system's job joins (limited, below, runs a
  # command in it); removed at exit.
  cgroup=""
  if [[ -n $cpuset ]]; then
    if [[ -d /sys/fs/cgroup/cpuset && ! -f /sys/fs/cgroup/cgroup.controllers ]]; then
      cgroup="/sys/fs/cgroup/cpuset/muster-bench-$$"  # cgroup v1
      mkdir "$cgroup" || { say "cannot make $cgroup (root?)"; exit 1; }
      trap 'rm -rf "$tmp"; rmdir "$cgroup" 2>/dev/null' EXIT
      cat /sys/fs/cgroup/cpuset/cpuset.mems >"$cgroup/cpuset.mems"
    else
      grep -qw cpuset /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null ||
        echo +cpuset >/sys/fs/cgroup/cgroup.subtree_control ||
        { say "cannot enable the cpuset controller in /sys/fs/cgroup (root? a container?)"; exit 1; }
      cgroup="/sys/fs/cgroup/muster-bench-$$"
      mkdir "$cgroup" || { say "cannot make $cgroup (root?)"; exit 1; }
      trap 'rm -rf "$tmp"; rmdir "$cgroup" 2>/dev/null' EXIT
    fi
    echo "$cpuset" >"$cgroup/cpuset.cpus" || { say "cannot make a cpuset of CPUs $cpuset"; exit 1; }
    say "every system runs in cgroup $cgroup (cpuset.cpus $cpuset)"
  fi
  limited() {  # COMMAND...: runs it in the --cpuset cgroup, if any
    if [[ -n $cgroup ]]; then
      bash -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$cgroup" "$@"
    else
      "$@"
    fi
  }
  musterd_flag=()
  if [[ -n $node_cpus ]]; then
    printf '#!/usr/bin/env bash\nexec %q "$@" --node-cpus %q\n' \
      "$PWD/bazel-out/k8-opt/bin/daemon/musterd" "$node_cpus" >"$tmp/musterd"
    chmod +x "$tmp/musterd"
    musterd_flag=(--musterd "$tmp/musterd")
  fi
  say "compiling tools/bench_mpi_collectives.c (mpicc -O2)"
  mpicc -O2 -o "$tmp/bench_mpi_collectives" tools/bench_mpi_collectives.c

  if [[ -n $max_load ]]; then
    for ((i = 0; i < 120; i++)); do
      load1="$(cut -d' ' -f1 /proc/loadavg)"
      awk -v l="$load1" -v m="$max_load" 'BEGIN { exit !(l < m) }' && break
      ((i % 12 == 0)) && say "waiting for the 1-minute load ($load1) to drop below $max_load"
      sleep 5
    done
  fi

  load_start="$(cut -d' ' -f1-3 /proc/loadavg)"
  date_start="$(date -u '+%Y-%m-%d %H:%M')"
  t_start=$SECONDS
  results="$tmp/results.jsonl"
  : >"$results"
  # Every line gets "pass" (the repeat) and "load" (idle, or hog: beside the
  # busy processes) so that the report can take medians.
  tag() {
    sed -n "s/^\(\[rank 0\] \)\{0,1\}\({.*}\)\$/\2/p" |
      sed "s/^{/{\"pass\":$1,\"load\":\"$2\",/" >>"$results"
  }
  hog_pids=()
  start_hogs() {
    for ((h = 0; h < hog; h++)); do
      if ((h == 0)) && [[ -n $hog_cpu ]]; then
        taskset -c "$hog_cpu" bash -c 'while :; do :; done' &
      else
        bash -c 'while :; do :; done' &
      fi
      hog_pids+=($!)
    done
    sleep 0.2  # let the scheduler place them
  }
  stop_hogs() {
    ((${#hog_pids[@]})) || return 0
    kill "${hog_pids[@]}" 2>/dev/null || true
    wait "${hog_pids[@]}" 2>/dev/null || true
    hog_pids=()
  }
  trap 'stop_hogs; rm -rf "$tmp"; [[ -z $cgroup ]] || rmdir "$cgroup" 2>/dev/null' EXIT
  # One system's run: run_system PASS WORLD LOAD SYSTEM.
  run_system() {
    local pass=$1 w=$2 load=$3 system=$4 rc=0
    say "pass $pass/$repeats, world $w, $load: $system"
    [[ $load == hog ]] && start_hogs
    case "$system" in
      muster)
        # A socket nobody serves: muster-run starts an embedded musterd.
        MUSTER_SOCKET="$tmp/no-daemon.sock" limited "$OPT/muster-run" "${musterd_flag[@]}" \
          --bind "$muster_bind" --nproc-per-node "$w" -- "$OPT/muster-bench" collectives \
          "${common[@]}" --json \
          2>"$tmp/err" | tag "$pass" "$load" || rc=1 ;;
      muster-shared)
        MUSTER_SOCKET="$tmp/no-daemon.sock" limited "$OPT/muster-run" "${musterd_flag[@]}" \
          --bind "$muster_bind" --nproc-per-node "$w" -- "$OPT/muster-bench" collectives \
          "${common[@]}" --shared --json \
          2>"$tmp/err" | tag "$pass" "$load" || rc=1 ;;
      gloo)
        limited "$PY" tools/bench_torch_collectives.py --world "$w" "${common[@]}" \
          2>"$tmp/err" | tag "$pass" "$load" || rc=1 ;;
      mpi)
        limited mpirun --allow-run-as-root --oversubscribe -np "$w" --mca btl self,vader \
          "$tmp/bench_mpi_collectives" "${common[@]}" 2>"$tmp/err" | tag "$pass" "$load" || rc=1 ;;
    esac
    stop_hogs
    if ((rc)); then
      say "$system failed (world $w, $load):"; tail -20 "$tmp/err" >&2; failed=1
    fi
  }
  common=(--op "$OPS" --bytes "$SIZES" --iters "$ITERS" --dtype "$DTYPE" --verify)
  failed=0
  mapfile -t runs < <(plan)
  for run in "${runs[@]}"; do
    read -r pass w load system <<<"$run"
    run_system "$pass" "$w" "$load" "$system"
  done
  load_end="$(cut -d' ' -f1-3 /proc/loadavg)"
  elapsed=$((SECONDS - t_start))

  cpu_model="$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
  mem_gib="$(awk '/MemTotal/ { printf "%.1f", $2 / 1048576 }' /proc/meminfo)"
  rev="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  git diff --quiet HEAD 2>/dev/null || rev="$rev plus the working tree"
  ompi="$(mpirun --version 2>/dev/null | head -1)"
  torch_v="$("$PY" -c 'import torch; print(torch.__version__)')"
  torch_pkg="$(dpkg-query -W -f='${Version}' python3-torch 2>/dev/null || echo '?')"

  REPORT_RESULTS="$results"
  REPORT_CMD="$cmdline"
  REPORT_DATE="$date_start"
  REPORT_LOAD_START="$load_start"
  REPORT_LOAD_END="$load_end"
  REPORT_ELAPSED="$elapsed"
  REPORT_MACHINE="$(nproc) vCPUs ($cpu_model), $mem_gib GiB RAM, kernel $(uname -sr)"
  REPORT_VERSIONS="muster $rev (-c opt); torch $torch_v (python3-torch $torch_pkg), gloo backend, OMP_NUM_THREADS=1; $ompi, --mca btl self,vader"
  REPORT_SETUP="ops $OPS, sizes $SIZES B, iters $ITERS, warm-up max(2, iters/10), dtype $DTYPE, --verify, $repeats pass(es), muster-run --bind $muster_bind${cpuset:+, every job in a cgroup cpuset of CPUs $cpuset}${node_cpus:+, musterd --node-cpus $node_cpus}"
  REPORT_SHARED=$shared
  REPORT_HOG="$hog busy process(es) beside each system's run${hog_cpu:+, the first pinned to CPU $hog_cpu}"
  if [[ -n $keep ]]; then
    mkdir -p "$keep"
    cp "$results" "$keep/results.jsonl"
    declare -p REPORT_CMD REPORT_DATE REPORT_LOAD_START REPORT_LOAD_END REPORT_ELAPSED \
      REPORT_MACHINE REPORT_VERSIONS REPORT_SETUP REPORT_SHARED REPORT_HOG >"$keep/meta.env"
  fi
fi
REPORT_SHARED=${REPORT_SHARED:-0}
REPORT_HOG=${REPORT_HOG:-}
export REPORT_RESULTS REPORT_CMD REPORT_DATE REPORT_LOAD_START REPORT_LOAD_END REPORT_ELAPSED \
  REPORT_MACHINE REPORT_VERSIONS REPORT_SETUP REPORT_SHARED REPORT_HOG
REPORT_DOC=$doc "$PY" - <<'EOF'
import json, os, statistics

env = os.environ
rows = [json.loads(l) for l in open(env["REPORT_RESULTS"]) if l.strip()]
OPS = ["all_reduce", "broadcast", "all_gather", "reduce_scatter", "barrier"]

# (system, world, op, bytes) -> list of rows over passes
runs = {}
for r in rows:
    runs.setdefault((r["system"], r["world"], r["op"], r["bytes"], r.get("load", "idle")),
                    []).append(r)
keys = sorted({(r["world"], OPS.index(r["op"]), r["bytes"]) for r in rows})
HOG = any(r.get("load") == "hog" for r in rows)


def med(system, world, op, nbytes, load="idle"):
    """Median p50 (and p99) over the passes, busbw from p50, the p50 range."""
    rs = runs.get((system, world, op, nbytes, load), [])
    if not rs:
        return None
    if any(r.get("unsupported") for r in rs):
        return {"unsupported": rs[0]["unsupported"]}
    p50s = [r["p50_us"] for r in rs]
    p = statistics.median(p50s)
    bus = None
    if rs[0]["busbw_gbps"] is not None and p > 0:
        bus = rs[0]["busbw_gbps"] * rs[0]["p50_us"] / p  # same bytes and factor
    ok = all(r["verified"] is True for r in rs)
    p99 = statistics.median(r["p99_us"] for r in rs) if all(r.get("p99_us") for r in rs) else None
    return {"p50": p, "p99": p99, "lo": min(p50s), "hi": max(p50s), "bus": bus, "verified": ok,
            "passes": len(rs), "vcsw": statistics.median(r.get("vol_csw_per_iter", 0) for r in rs)}


def size_text(b):
    if b == 0:
        return "-"
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return "%d %s" % (b >> shift, unit)
    return "%d B" % b


def f_us(m):
    if m is None:
        return "n/a"
    if "unsupported" in m:
        return "unsupported"
    v = m["p50"]
    return ("%.2f" if v < 10 else "%.1f" if v < 1000 else "%.0f") % v


def f_bw(m):
    if m is None or "unsupported" in m or m["bus"] is None:
        return "-"
    return "%.3f" % m["bus"] if m["bus"] < 1 else "%.2f" % m["bus"]


def ratio(a, b, key):
    if a is None or b is None or "unsupported" in a or "unsupported" in b:
        return "-"
    x, y = a[key], b[key]
    if x is None or y is None or y == 0:
        return "-"
    v = x / y
    return ("%.2fx" if v >= 0.1 else "%.2gx") % v


SHARED = env.get("REPORT_SHARED") == "1"
lines = []
out = lines.append
if SHARED:
    out("| world | op | bytes | muster p50 µs | shared p50 µs | gloo p50 µs | MPI p50 µs "
        "| muster busbw | shared busbw | gloo busbw | MPI busbw | busbw muster/gloo "
        "| busbw muster/MPI | busbw shared/gloo | busbw shared/MPI |")
    out("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
else:
    out("| world | op | bytes | muster p50 µs | gloo p50 µs | MPI p50 µs | muster busbw "
        "| gloo busbw | MPI busbw | busbw muster/gloo | busbw muster/MPI | p50 muster/gloo "
        "| p50 muster/MPI |")
    out("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
unverified = []
for world, oi, nbytes in keys:
    op = OPS[oi]
    m, g, p = (med(s, world, op, nbytes) for s in ("muster", "gloo", "mpi"))
    z = med("muster-shared", world, op, nbytes)
    for s, x in (("muster", m), ("muster shared", z), ("gloo", g), ("MPI", p)):
        if x is not None and "unsupported" not in x and not x["verified"]:
            unverified.append("%s %s %s world %d" % (s, op, size_text(nbytes), world))
    if SHARED:
        out("| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            world, op, size_text(nbytes), f_us(m), f_us(z), f_us(g), f_us(p), f_bw(m), f_bw(z),
            f_bw(g), f_bw(p), ratio(m, g, "bus"), ratio(m, p, "bus"), ratio(z, g, "bus"),
            ratio(z, p, "bus")))
        continue
    out("| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
        world, op, size_text(nbytes), f_us(m), f_us(g), f_us(p), f_bw(m), f_bw(g), f_bw(p),
        ratio(m, g, "bus"), ratio(m, p, "bus"), ratio(m, g, "p50"), ratio(m, p, "p50")))
table = "\n".join(lines)

# Small-message latency, p50 and p99 (idle, and beside the busy processes).
lat = ["| world | load | op | muster p50 / p99 µs | MPI p50 / p99 µs | gloo p50 / p99 µs "
       "| p50 muster/MPI | p99 muster/MPI |", "|---:|---|---|---:|---:|---:|---:|---:|"]
for world in sorted({k[0] for k in keys}):
    for load in ("idle", "hog") if HOG else ("idle",):
        for op, nbytes in (("all_reduce", 4), ("barrier", 0)):
            m, p, g = (med(s, world, op, nbytes, load) for s in ("muster", "mpi", "gloo"))
            if m is None:
                continue
            pair = lambda x: "n/a" if x is None or "unsupported" in x else "%s / %s" % (
                f_us(x), f_us({"p50": x["p99"]}) if x.get("p99") else "-")
            lat.append("| %d | %s | %s | %s | %s | %s | %s | %s |" % (
                world, load, op + (" 4 B" if nbytes else ""), pair(m), pair(p), pair(g),
                ratio(m, p, "p50"), ratio(m, p, "p99")))
latency_text = "\n".join(lat)

# Issue 19's targets.
targets = ["| target | world | status | figure |", "|---|---:|---|---|"]
met_all = True


def target(name, world, value, goal, figure, at_most=True):
    global met_all
    if value is None:
        targets.append("| %s | %d | not measured | |" % (name, world))
        return
    met = value <= goal if at_most else value >= goal
    met_all &= met
    targets.append("| %s | %d | %s | %s |" % (name, world, "**met**" if met else "**missed**",
                                              figure))


def rat(a, b, key):
    if a is None or b is None or "unsupported" in a or "unsupported" in b:
        return None
    if not a.get(key) or not b.get(key):
        return None
    return a[key] / b[key]


worlds_seen = sorted({k[0] for k in keys})
for world in worlds_seen:
    goal = 1.5 if world <= 2 else 2.0
    for op, nbytes, label in (("all_reduce", 4, "4 B all_reduce"), ("barrier", 0, "barrier")):
        m, p = med("muster", world, op, nbytes), med("mpi", world, op, nbytes)
        for key in ("p50", "p99"):
            r = rat(m, p, key)
            target("%s %s <= %gx Open MPI" % (label, key, goal), world, r, goal,
                   "%s vs %s µs = %.2fx" % (f_us({"p50": m[key]}), f_us({"p50": p[key]}), r)
                   if r is not None else "")
        if not HOG:
            continue
        mh, ph = med("muster", world, op, nbytes, "hog"), med("mpi", world, op, nbytes, "hog")
        for key in ("p50", "p99"):
            r = rat(mh, ph, key)
            target("%s %s under load <= 2x Open MPI under load" % (label, key), world, r, 2.0,
                   "%s vs %s µs = %.2fx" % (f_us({"p50": mh[key]}), f_us({"p50": ph[key]}), r)
                   if r is not None else "")
            r = rat(mh, m, key)
            target("%s %s under load <= 10x its idle %s" % (label, key, key), world, r, 10.0,
                   "%s vs %s µs = %.2fx" % (f_us({"p50": mh[key]}), f_us({"p50": m[key]}), r)
                   if r is not None else "")
    for op in ("all_reduce", "broadcast", "all_gather", "reduce_scatter"):
        for nbytes in sorted({k[2] for k in keys if k[0] == world and OPS[k[1]] == op}):
            if nbytes < 256 << 10:
                continue
            goal = 1.0 if nbytes <= 4 << 20 else 1.5 if nbytes >= 16 << 20 else None
            if goal is None:
                continue
            m, p = med("muster", world, op, nbytes), med("mpi", world, op, nbytes)
            r = rat(m, p, "bus")
            target("%s busbw %s >= %gx Open MPI" % (op, size_text(nbytes), goal), world, r, goal,
                   "%.2f vs %.2f GB/s = %.2fx (muster p50 %s..%s µs over %d passes)" % (
                       m["bus"], p["bus"], r, f_us({"p50": m["lo"]}), f_us({"p50": m["hi"]}),
                       m["passes"]) if r is not None else "", at_most=False)
            if SHARED and nbytes >= 4 << 20:
                z = med("muster-shared", world, op, nbytes)
                r = rat(z, p, "bus")
                target("%s busbw %s >= 2x Open MPI (AllocShared)" % (op, size_text(nbytes)),
                       world, r, 2.0, "%.2f vs %.2f GB/s = %.2fx" % (z["bus"], p["bus"], r)
                       if r is not None else "", at_most=False)
targets_text = "\n".join(targets)

block = []
block.append("Command: `%s` (%s s). Date: %s UTC. Load average (1/5/15 min) at the start: %s; "
             "at the end: %s." % (env["REPORT_CMD"], env["REPORT_ELAPSED"], env["REPORT_DATE"],
                                  env["REPORT_LOAD_START"], env["REPORT_LOAD_END"]))
block.append("")
block.append("- Machine: %s." % env["REPORT_MACHINE"])
block.append("- Versions: %s." % env["REPORT_VERSIONS"])
block.append("- Run: %s. p50 is the median over the timed iterations of the slowest rank's "
             "time; each cell is the median of that p50 over the passes, busbw (GB/s, 1e9 B/s, "
             "nccl-tests' definition) is computed from it. busbw ratio > 1: muster is faster; "
             "p50 ratio < 1: muster is faster." % env["REPORT_SETUP"])
if unverified:
    block.append("- **Wrong results** (--verify): " + "; ".join(unverified) + ".")
else:
    block.append("- --verify: every result of every system checked correct on every rank "
                 "(gloo reduce_scatter: not run, gloo has none).")
block.append("")
block.append(table)
block.append("")
block.append("Small messages: p50 and p99 (median over the passes)%s:" % (
    "; \"hog\": %s" % env["REPORT_HOG"] if HOG else ""))
block.append("")
block.append(latency_text)
block.append("")
block.append(targets_text)
text = "\n".join(block)
print(text)

if env.get("REPORT_DOC") == "1":
    path = "docs/benchmarks.md"
    title = "## CPU collectives: muster vs torch gloo vs Open MPI"
    begin = "<!-- tools/bench_collectives.sh: generated block, begin -->"
    end = "<!-- tools/bench_collectives.sh: generated block, end -->"
    if SHARED:
        title = "## Zero-copy collectives (AllocShared): muster vs torch gloo vs Open MPI"
        begin = "<!-- tools/bench_collectives.sh --shared: generated block, begin -->"
        end = "<!-- tools/bench_collectives.sh --shared: generated block, end -->"
    doc = open(path).read()
    generated = begin + "\n\n" + text + "\n\n" + end
    if begin in doc and end in doc:
        doc = doc[:doc.index(begin)] + generated + doc[doc.index(end) + len(end):]
    else:
        if title not in doc:
            doc = doc.rstrip("\n") + "\n\n" + title + "\n\n"
        doc = doc.rstrip("\n") + "\n\n" + generated + "\n"
    open(path, "w").write(doc)
    print("\n(written into %s, section \"%s\")" % (path, title[3:]))
EOF

if ((build)) && [[ ${bin_before:-} == *-fastbuild/* ]]; then
  # -c opt moved the shared bazel-bin link; point it back to the default
  # build it showed before (only then: in a fresh clone that build is every
  # target from scratch, minutes of both CPUs after the run).
  say "pointing bazel-bin back to the default (fastbuild) build"
  bazel build //tools:muster-bench >/dev/null 2>&1 || say "note: bazel build //tools:muster-bench (fastbuild) failed"
fi
exit $failed
