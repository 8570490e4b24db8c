#include "tools/run_command_line.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/flags.h"
#include "common/spawn.h"

namespace muster {
namespace {

// Bounds on the numeric flags: every count and rank the launcher derives
// from them (world size = nodes x ranks per node) fits an int.
constexpr int64_t kMaxNodes = 100000;
constexpr int64_t kMaxRanksPerNode = 4096;
constexpr int64_t kMaxRestarts = 1000000;

constexpr char kUsage[] =
    "muster-run: start a job's ranks on this node, like torchrun.\n"
    "Usage: muster-run [flags] TRAINING_SCRIPT.py [ARGS...]   (run with the Python that has "
    "torch)\n"
    "       muster-run [flags] -m MODULE [ARGS...]\n"
    "       muster-run [flags] --no-python PROGRAM [ARGS...]\n"
    "       muster-run [flags] -- PROGRAM [ARGS...]\n"
    "\n"
    "torchrun's flags work with their meanings, in both spellings (--nproc-per-node,\n"
    "--nproc_per_node) and from PET_* environment variables; a torchrun flag muster\n"
    "cannot honour is refused by name. Uses the musterd serving this node, or starts\n"
    "an embedded one for the job's lifetime (the one on the store's node serves the\n"
    "job's store). Each rank gets torchrun's environment (RANK, LOCAL_RANK,\n"
    "WORLD_SIZE, GROUP_RANK, ROLE_RANK, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_*,\n"
    "...) plus MUSTER_SOCKET, MUSTER_JOB_ID, MUSTER_GENERATION, so unmodified PyTorch\n"
    "scripts rendezvous through musterd's store. Output lines are prefixed with\n"
    "[rank R]. When a rank fails the others are stopped and, up to --max-restarts\n"
    "times, all are restarted with a new generation; otherwise muster-run exits 1\n"
    "naming the failed rank, its exit status or signal, its error file's message\n"
    "and its last output. With --restart-policy rank only the failed rank is\n"
    "restarted (the others keep running and call muster's Reconfigure; the new\n"
    "process gets the same RANK and MUSTER_RESTART_COUNT). While ranks or nodes are\n"
    "missing, a progress line says who and how long is left.";

bool IsLocalAddress(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) return false;
  std::vector<std::string> wanted;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    char text[INET6_ADDRSTRLEN] = {0};
    if (a->ai_family == AF_INET) {
      auto* in = reinterpret_cast<sockaddr_in*>(a->ai_addr);
      if ((ntohl(in->sin_addr.s_addr) >> 24) == 127) {
        ::freeaddrinfo(found);
        return true;
      }
      ::inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text));
    } else if (a->ai_family == AF_INET6) {
      auto* in6 = reinterpret_cast<sockaddr_in6*>(a->ai_addr);
      if (IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr)) {
        ::freeaddrinfo(found);
        return true;
      }
      ::inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof(text));
    }
    if (text[0] != 0) wanted.push_back(text);
  }
  ::freeaddrinfo(found);
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) return false;
  bool local = false;
  for (ifaddrs* i = ifs; i != nullptr && !local; i = i->ifa_next) {
    if (i->ifa_addr == nullptr) continue;
    char text[INET6_ADDRSTRLEN] = {0};
    if (i->ifa_addr->sa_family == AF_INET) {
      ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, text,
                  sizeof(text));
    } else if (i->ifa_addr->sa_family == AF_INET6) {
      ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr, text,
                  sizeof(text));
    }
    for (const std::string& w : wanted) local |= w == text;
  }
  ::freeifaddrs(ifs);
  return local;
}

// GPUs this process may use: CUDA_VISIBLE_DEVICES if set, else the NVIDIA
// driver's list.
int GpuCount() {
  if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES")) {
    int n = 0;
    for (absl::string_view d : absl::StrSplit(visible, ',', absl::SkipWhitespace())) {
      if (d == "-1") break;
      ++n;
    }
    return n;
  }
  int n = 0;
  if (DIR* dir = ::opendir("/proc/driver/nvidia/gpus")) {
    while (dirent* e = ::readdir(dir)) n += e->d_name[0] != '.';
    ::closedir(dir);
  }
  return n;
}

absl::Status Bad(const std::string& message) { return absl::InvalidArgumentError(message); }

// "0".."3" for every rank, or "LOCAL_RANK:VALUE,..." (torchrun's format).
absl::StatusOr<std::map<int, int>> ParseStd(const std::string& flag, const std::string& text) {
  std::map<int, int> out;
  int all;
  if (absl::SimpleAtoi(text, &all)) {
    if (all < 0 || all > 3) return Bad(absl::StrCat("--", flag, " ", text, ": want 0-3"));
    out[-1] = all;
    return out;
  }
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    std::vector<std::string> kv = absl::StrSplit(part, ':');
    int rank, value;
    if (kv.size() != 2 || !absl::SimpleAtoi(kv[0], &rank) || !absl::SimpleAtoi(kv[1], &value) ||
        rank < 0 || value < 0 || value > 3) {
      return Bad(
          absl::StrCat("--", flag, " ", text, ": want 0-3 or LOCAL_RANK:VALUE,... (e.g. 0:1,1:2)"));
    }
    out[rank] = value;
  }
  return out;
}

absl::StatusOr<std::vector<int>> ParseSignals(const std::string& text) {
  static const std::pair<const char*, int> kNames[] = {{"SIGTERM", SIGTERM}, {"SIGINT", SIGINT},
                                                       {"SIGHUP", SIGHUP},   {"SIGQUIT", SIGQUIT},
                                                       {"SIGUSR1", SIGUSR1}, {"SIGUSR2", SIGUSR2}};
  std::vector<int> out;
  for (absl::string_view name : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    bool known = false;
    for (const auto& [n, sig] : kNames) {
      if (name == n) {
        out.push_back(sig);
        known = true;
      }
    }
    if (!known) {
      return Bad(absl::StrCat("--signals-to-handle: unknown signal '", name,
                              "' (muster-run forwards SIGTERM, SIGINT, SIGHUP, SIGQUIT, "
                              "SIGUSR1, SIGUSR2)"));
    }
  }
  return out;
}

bool HasTorch(const std::string& python) {
  SpawnOptions o;
  o.argv = {python, "-c",
            "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)"};
  o.search_path = true;
  o.null_stdin = true;
  o.who = "muster-run";
  absl::StatusOr<pid_t> pid = Spawn(o);
  if (!pid.ok()) return false;
  int status = 0;
  if (::waitpid(*pid, &status, 0) != *pid) return false;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

std::string RandomId() {
  std::random_device rd;
  std::mt19937_64 gen(rd());
  return absl::StrCat(absl::Hex(gen(), absl::kZeroPad16));
}

}  // namespace

std::string PythonWithTorch() {
  if (const char* python = std::getenv("MUSTER_PYTHON"); python != nullptr && *python != 0) {
    return python;
  }
  for (const char* candidate : {"python3", "/usr/bin/python3"}) {
    if (HasTorch(candidate)) return candidate;
  }
  return "python3";
}

absl::StatusOr<RunCommandLine> ParseRunCommandLine(const std::vector<std::string>& args) {
  RunCommandLine out;
  LaunchOptions& o = out.options;
  FlagSet flags("muster-run", kUsage);
  flags.set_underscores_as_dashes(true);
  flags.set_stop_at_first_positional(true);
  flags.set_env_prefix("PET_");

  // torchrun's flags.
  std::string nnodes = "1", nproc = "1", rdzv_backend = "static", rdzv_endpoint, rdzv_id = "none",
              rdzv_conf, start_method = "spawn", event_log_handler = "null", redirects = "0",
              tee = "0", ranks_filter, duplicate_out, duplicate_err, local_addr, logs_specs,
              numa_binding;
  int64_t max_restarts = 0, node_rank = 0, master_port = 0;
  double monitor_interval = 0.1;
  bool standalone = false, module = false, no_python = false, run_path = false;
  flags.AddString("nnodes", &nnodes, "Nodes in the job: N, or MIN:MAX (with --rdzv-backend c10d).");
  flags.AddString("nproc-per-node", &nproc,
                  "Ranks on this node: N, auto (GPUs if any, else CPUs), gpu, cpu.");
  flags.AddString("rdzv-backend", &rdzv_backend,
                  "static (--node-rank given; node 0 serves the store), or c10d / muster (nodes\n"
                  "join through the store at --rdzv-endpoint in arrival order).");
  flags.AddString("rdzv-endpoint", &rdzv_endpoint,
                  "HOST[:PORT] of the job's store (default port 29400; static: overrides\n"
                  "--master-addr/--master-port).");
  flags.AddString("rdzv-id", &rdzv_id, "The job's id (TORCHELASTIC_RUN_ID; muster's job id).");
  flags.AddString("rdzv-conf", &rdzv_conf,
                  "KEY=VALUE,...: join_timeout (s, 600), last_call_timeout (s, 30), is_host,\n"
                  "read_timeout, close_timeout, timeout.");
  flags.AddBool("standalone", &standalone,
                "One node; the store on a free local port, a random job id.");
  flags.AddInt("max-restarts", &max_restarts,
               "How many times to restart after a failure (see --restart-policy).");
  flags.AddDouble("monitor-interval", &monitor_interval,
                  "Seconds between checks of the job's state (other nodes' failures).");
  flags.AddString("start-method", &start_method,
                  "spawn, fork or forkserver: no effect (ranks are programs, as with torchrun\n"
                  "for scripts).");
  flags.AddString("event-log-handler", &event_log_handler,
                  "Only 'null' (muster has no torchelastic event handlers).");
  flags.AddString("role", &o.role, "The workers' role (ROLE_NAME).");
  flags.AddBool("module", &module, "The script is a Python module (python -m).");
  flags.AddBool("no-python", &no_python, "The script is a program: run it directly.");
  flags.AddBool("run-path", &run_path, "Run the script with runpy.run_path.");
  flags.AddString("log-dir", &o.log_dir,
                  "Directory for the ranks' logs: <dir>/<run id>_<random>/attempt_<n>/<local\n"
                  "rank>/{stdout,stderr}.log and error.json, as torchrun lays them out.");
  flags.AddString("redirects", &redirects,
                  "Streams to files only (needs --log-dir): 0 none, 1 stdout, 2 stderr, 3 both;\n"
                  "or LOCAL_RANK:VALUE,...");
  flags.AddString("tee", &tee, "Streams to files and the console (values as --redirects).");
  flags.AddString("local-ranks-filter", &ranks_filter,
                  "Local ranks whose output shows on the console (e.g. 0,1; default all).");
  flags.AddString("duplicate-stdout-filters", &duplicate_out, "Not supported (refused if set).");
  flags.AddString("duplicate-stderr-filters", &duplicate_err, "Not supported (refused if set).");
  flags.AddInt("node-rank", &node_rank,
               "This node's index (static rendezvous); 0 serves the store.");
  flags.AddString("master-addr", &o.master_addr,
                  "Address of the store's node (static rendezvous). Default for one node:\n"
                  "127.0.0.1.");
  flags.AddInt("master-port", &master_port,
               "Store port there. Default for one node: the daemon's store port (embedded: a\n"
               "free one).");
  flags.AddString("local-addr", &local_addr, "Not supported (refused if set).");
  flags.AddString("logs-specs", &logs_specs, "Not supported (refused if set).");
  flags.AddString("numa-binding", &numa_binding, "Not supported (refused if set).");
  flags.AddString("signals-to-handle", &o.signals_text,
                  "Signals muster-run forwards to the ranks.");
  flags.AddBool("virtual-local-rank", &o.virtual_local_rank,
                "Every rank sees LOCAL_RANK=0 and CUDA_VISIBLE_DEVICES=<its local rank>.");
  flags.AddAlias('m', "module");
  flags.AddAlias('r', "redirects");
  flags.AddAlias('t', "tee");

  // muster's own.
  std::string policy = "job", bind = "none";
  double grace = 5, exit_barrier = 300;
  flags.AddString("bind", &bind,
                  "cores: pin local rank i to the i-th CPU muster-run may use (like mpirun's\n"
                  "--bind-to core; with more ranks than CPUs none is bound, as mpirun does);\n"
                  "none: let the ranks float.");
  flags.AddString("job-id", &o.job_id,
                  "Job name (default: --rdzv-id, else run-<pid> on one node, run-<master-port>\n"
                  "on several).");
  flags.AddString("restart-policy", &policy,
                  "job: restart every rank after a failure (a new generation; the default).\n"
                  "rank: restart only the failed rank, in the running job (elastic jobs).");
  flags.AddString("socket", &o.socket,
                  "Use the musterd at this socket (default: $MUSTER_SOCKET or musterd's default\n"
                  "if one answers there, else start an embedded musterd).");
  flags.AddString("musterd", &o.musterd_path,
                  "musterd binary for the embedded daemon (default: next to muster-run, or PATH).");
  flags.AddString("token-file", &o.token_file,
                  "Store token: an embedded daemon requires it; ranks get MUSTER_STORE_TOKEN.");
  flags.AddDouble("stop-grace-seconds", &grace,
                  "After SIGTERM to the ranks, how long before SIGKILL.");
  flags.AddDouble("exit-barrier-seconds", &exit_barrier,
                  "Several nodes: how long the store's node waits for the other nodes to finish\n"
                  "with the store before stopping it.");

  absl::StatusOr<std::vector<std::string>> positional = flags.Parse(args);
  out.usage = flags.Usage();
  if (flags.help_requested()) {
    out.help = true;
    return out;
  }
  if (flags.version_requested()) {
    out.version = true;
    return out;
  }
  if (!positional.ok()) return positional.status();

  // Flags muster cannot honour.
  for (const auto& [name, value] :
       std::vector<std::pair<std::string, std::string>>{{"duplicate-stdout-filters", duplicate_out},
                                                        {"duplicate-stderr-filters", duplicate_err},
                                                        {"local-addr", local_addr},
                                                        {"logs-specs", logs_specs},
                                                        {"numa-binding", numa_binding}}) {
    if (flags.IsSet(name) && !value.empty()) {
      return Bad(absl::StrCat("--", name,
                              " is not supported by muster-run (see the README's "
                              "torchrun table)"));
    }
  }
  if (event_log_handler != "null") {
    return Bad(absl::StrCat("--event-log-handler ", event_log_handler,
                            " is not supported by muster-run (only 'null')"));
  }
  if (start_method != "spawn" && start_method != "fork" && start_method != "forkserver") {
    return Bad(absl::StrCat("--start-method ", start_method, ": want spawn, fork or forkserver"));
  }

  // Nodes and rendezvous.
  std::vector<std::string> range = absl::StrSplit(nnodes, ':');
  int64_t min_nodes = 0, max_nodes = 0;
  if (range.size() > 2 || !absl::SimpleAtoi(range[0], &min_nodes) ||
      !absl::SimpleAtoi(range.back(), &max_nodes) || min_nodes < 1 || max_nodes < min_nodes) {
    return Bad(absl::StrCat("--nnodes ", nnodes, ": want N or MIN:MAX with 1 <= MIN <= MAX"));
  }
  if (max_nodes > kMaxNodes) {
    return Bad(absl::StrCat("--nnodes ", nnodes, ": at most ", kMaxNodes, " nodes"));
  }
  o.nnodes = static_cast<int>(max_nodes);
  o.min_nodes = static_cast<int>(min_nodes);
  if (standalone) {
    if (max_nodes != 1) return Bad("--standalone runs one node; --nnodes must be 1");
    rdzv_backend = "static";
    rdzv_endpoint.clear();
    if (o.job_id.empty() && rdzv_id == "none") rdzv_id = RandomId();
  }
  std::string endpoint_host;
  int endpoint_port = 0;
  if (!rdzv_endpoint.empty()) {
    // HOST, HOST:PORT or [V6]:PORT; torchrun's default port 29400.
    std::string port_text;
    bool has_port = false;
    if (rdzv_endpoint[0] == '[') {
      size_t close = rdzv_endpoint.find(']');
      if (close == std::string::npos ||
          (close + 1 < rdzv_endpoint.size() && rdzv_endpoint[close + 1] != ':')) {
        return Bad(absl::StrCat("--rdzv-endpoint ", rdzv_endpoint, ": want [ADDRESS]:PORT"));
      }
      endpoint_host = rdzv_endpoint.substr(1, close - 1);
      has_port = close + 1 < rdzv_endpoint.size();
      if (has_port) port_text = rdzv_endpoint.substr(close + 2);
    } else if (std::count(rdzv_endpoint.begin(), rdzv_endpoint.end(), ':') == 1) {
      size_t colon = rdzv_endpoint.find(':');
      endpoint_host = rdzv_endpoint.substr(0, colon);
      port_text = rdzv_endpoint.substr(colon + 1);
      has_port = true;
    } else {
      endpoint_host = rdzv_endpoint;
    }
    if (endpoint_host.empty()) {
      return Bad(absl::StrCat("--rdzv-endpoint ", rdzv_endpoint, ": no host"));
    }
    endpoint_port = 29400;
    if (has_port && (!absl::SimpleAtoi(port_text, &endpoint_port) || endpoint_port <= 0 ||
                     endpoint_port > 65535)) {
      return Bad(absl::StrCat("--rdzv-endpoint ", rdzv_endpoint, ": bad port"));
    }
  }
  if (rdzv_backend == "static") {
    if (min_nodes != max_nodes) {
      return Bad(absl::StrCat("--nnodes ", nnodes,
                              ": a range needs --rdzv-backend c10d (static has a fixed size)"));
    }
    o.rendezvous = LaunchOptions::Rendezvous::kStatic;
    if (!endpoint_host.empty()) {
      o.master_addr = endpoint_host;
      master_port = endpoint_port;
    }
    if (node_rank < 0 || node_rank >= max_nodes) {
      return Bad(absl::StrCat("--node-rank ", node_rank, ": want 0 to ", max_nodes - 1,
                              " (--nnodes ", nnodes, ")"));
    }
    o.node_rank = static_cast<int>(node_rank);
    o.serves_store = node_rank == 0;
  } else if (rdzv_backend == "c10d" || rdzv_backend == "muster") {
    if (endpoint_host.empty()) {
      return Bad(absl::StrCat("--rdzv-backend ", rdzv_backend, " needs --rdzv-endpoint HOST:PORT"));
    }
    o.rendezvous = LaunchOptions::Rendezvous::kStore;
    o.master_addr = endpoint_host;
    master_port = endpoint_port;
    o.node_rank = 0;  // assigned by the rendezvous
    o.serves_store = IsLocalAddress(endpoint_host);
  } else {
    return Bad(absl::StrCat("--rdzv-backend ", rdzv_backend,
                            " is not supported by muster-run (static, c10d or muster)"));
  }
  for (absl::string_view kv : absl::StrSplit(rdzv_conf, ',', absl::SkipWhitespace())) {
    std::vector<std::string> p = absl::StrSplit(kv, absl::MaxSplits('=', 1));
    double seconds = 0;
    const bool number = p.size() == 2 && absl::SimpleAtod(p[1], &seconds) && seconds >= 0;
    if (p.size() == 2 && p[0] == "is_host") {
      bool host;
      if (!absl::SimpleAtob(p[1], &host)) return Bad(absl::StrCat("--rdzv-conf ", kv));
      o.serves_store = host;
    } else if (number && (p[0] == "join_timeout" || p[0] == "timeout")) {
      o.join_timeout = absl::Seconds(seconds);
    } else if (number && p[0] == "last_call_timeout") {
      o.last_call = absl::Seconds(seconds);
    } else if (number && (p[0] == "read_timeout" || p[0] == "close_timeout")) {
      // Store reads and the rendezvous's closing are bounded by join_timeout here.
    } else {
      return Bad(absl::StrCat("--rdzv-conf ", kv,
                              ": muster-run knows join_timeout, last_call_timeout, timeout, "
                              "is_host, read_timeout, close_timeout (numbers in seconds)"));
    }
  }
  if (rdzv_id != "none" && o.job_id.empty()) o.job_id = rdzv_id;
  if (master_port < 0 || master_port > 65535) return Bad("--master-port out of range");
  o.master_port = static_cast<int>(master_port);

  // Ranks per node.
  int64_t n = 0;
  if (nproc == "gpu") {
    n = GpuCount();
    if (n == 0) return Bad("--nproc-per-node gpu: no GPU is visible to this process");
  } else if (nproc == "cpu") {
    n = std::thread::hardware_concurrency();
  } else if (nproc == "auto") {
    n = GpuCount();
    if (n == 0) n = std::thread::hardware_concurrency();
  } else if (!absl::SimpleAtoi(nproc, &n) || n < 1) {
    return Bad(absl::StrCat("--nproc-per-node ", nproc, ": want a number >= 1, auto, gpu or cpu"));
  }
  if (n > kMaxRanksPerNode) {
    return Bad(absl::StrCat("--nproc-per-node ", nproc, ": at most ", kMaxRanksPerNode));
  }
  o.nproc_per_node = static_cast<int>(n);
  if (o.nproc_per_node > 1 && std::getenv("OMP_NUM_THREADS") == nullptr) {
    out.notice =
        "setting OMP_NUM_THREADS=1 for each rank (as torchrun does) to avoid overloading the "
        "machine; set it yourself to tune";
  }

  // Restarts, signals, output.
  if (max_restarts < 0 || max_restarts > kMaxRestarts) {
    return Bad(absl::StrCat("--max-restarts ", max_restarts, ": want 0 to ", kMaxRestarts));
  }
  o.max_restarts = static_cast<int>(max_restarts);
  if (policy == "rank") {
    o.restart_policy = RestartPolicy::kRank;
  } else if (policy != "job") {
    return Bad(absl::StrCat("--restart-policy must be 'job' or 'rank', not '", policy, "'"));
  }
  if (bind != "cores" && bind != "none") {
    return Bad(absl::StrCat("--bind must be 'cores' or 'none', not '", bind, "'"));
  }
  o.bind_cores = bind == "cores";
  // (!(x >= 0) also refuses NaN.)
  if (!(grace >= 0) || std::isinf(grace)) return Bad("--stop-grace-seconds: want a number >= 0");
  if (!(exit_barrier >= 0) || std::isinf(exit_barrier)) {
    return Bad("--exit-barrier-seconds: want a number >= 0");
  }
  if (!(monitor_interval >= 0.001 && monitor_interval <= 3600)) {
    return Bad("--monitor-interval: want 0.001 to 3600 seconds");
  }
  o.stop_grace = absl::Seconds(grace);
  o.exit_barrier = absl::Seconds(exit_barrier);
  o.monitor_interval = absl::Seconds(monitor_interval);
  absl::StatusOr<std::vector<int>> signals = ParseSignals(o.signals_text);
  if (!signals.ok()) return signals.status();
  o.forward_signals = *signals;
  absl::StatusOr<std::map<int, int>> r = ParseStd("redirects", redirects);
  if (!r.ok()) return r.status();
  absl::StatusOr<std::map<int, int>> t = ParseStd("tee", tee);
  if (!t.ok()) return t.status();
  o.redirect = *r;
  o.tee = *t;
  for (absl::string_view part : absl::StrSplit(ranks_filter, ',', absl::SkipWhitespace())) {
    int rank;
    if (!absl::SimpleAtoi(part, &rank) || rank < 0) {
      return Bad(absl::StrCat("--local-ranks-filter ", ranks_filter, ": want LOCAL_RANK,..."));
    }
    o.console_ranks.insert(rank);
  }

  // The program.
  if (positional->empty()) {
    return Bad("no training script or program (muster-run [flags] SCRIPT.py ARGS..., or -- CMD)");
  }
  if (no_python && module) return Bad("--no-python and -m/--module cannot be used together");
  if (no_python && run_path) return Bad("--no-python and --run-path cannot be used together");
  std::vector<std::string>& cmd = o.command;
  const std::vector<std::string>& words = *positional;
  if (flags.saw_double_dash() || no_python) {
    cmd = words;
  } else {
    std::string python = PythonWithTorch();
    cmd = {python, "-u"};
    if (module) {
      cmd.push_back("-m");
    } else if (run_path) {
      cmd.insert(cmd.end(), {"-c",
                             "import runpy, sys; sys.argv = sys.argv[1:]; "
                             "runpy.run_path(sys.argv[0], run_name='__main__')"});
    }
    cmd.insert(cmd.end(), words.begin(), words.end());
  }
  return out;
}

}  // namespace muster
