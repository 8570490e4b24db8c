#include "tools/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/cpus.h"
#include "common/job_id.h"
#include "common/json.h"
#include "common/paths.h"
#include "common/spawn.h"
#include "muster/tcp_store.h"
#include "proto/admin.grpc.pb.h"
#include "tools/daemon_client.h"

extern char** environ;

namespace muster {
namespace {

// How long processes a rank started may hold its output after it ended.
constexpr absl::Duration kLeftoverGrace = absl::Seconds(2);

void Say(const std::string& message) { std::fprintf(stderr, "muster-run: %s\n", message.c_str()); }

std::string Describe(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return absl::StrCat("was killed by signal ", WTERMSIG(status), " (",
                        strsignal(WTERMSIG(status)), ")");
  }
  return "ended";
}

bool FileExecutable(const std::string& path) { return ::access(path.c_str(), X_OK) == 0; }

std::string FindMusterd(const std::string& flag) {
  if (!flag.empty()) return flag;
  std::error_code ec;
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  std::filesystem::path dir = self.parent_path();
  for (const std::filesystem::path& candidate :
       {dir / "musterd", dir / "../daemon/musterd",
        dir / "muster-run.runfiles/muster/daemon/musterd"}) {
    if (FileExecutable(candidate.string())) return candidate.lexically_normal().string();
  }
  if (const char* path = std::getenv("PATH")) {
    std::stringstream ss(path);
    std::string d;
    while (std::getline(ss, d, ':')) {
      if (FileExecutable(d + "/musterd")) return d + "/musterd";
    }
  }
  return "";
}

// Asks a daemon for its status over its socket; nullopt if nobody answers.
std::optional<v1::StatusResponse> ProbeDaemon(const std::string& socket) {
  struct stat st;
  if (::stat(socket.c_str(), &st) != 0) return std::nullopt;
  DaemonTarget target;
  target.socket_path = socket;
  auto admin = v1::Admin::NewStub(ConnectToDaemon(target));
  auto context = ContextWithTimeout(target, absl::Seconds(2));
  v1::StatusResponse status;
  if (!admin->Status(context.get(), v1::StatusRequest(), &status).ok()) return std::nullopt;
  return status;
}

// One child process with its output pipes.
struct Child {
  int rank = -1;  // -1: the embedded daemon
  int local_rank = -1;
  pid_t pid = -1;
  // torchrun's --log-dir files (-1: none) and whether each stream shows on
  // the console (--redirects sends it to the file only; --local-ranks-filter).
  int out_file = -1, err_file = -1;
  bool out_console = true, err_console = true;
  std::string error_file;  // TORCHELASTIC_ERROR_FILE
  int out_fd = -1;
  int err_fd = -1;
  std::string out_partial, err_partial;
  std::deque<std::string> tail;
  bool running = false;
  int status = 0;
  // When the rank's process ended. Processes it started may hold its pipes
  // a little longer (kLeftoverGrace); then its process group gets SIGTERM,
  // and SIGKILL --stop-grace-seconds later (leftovers_kill_at).
  absl::Time exited_at = absl::InfiniteFuture();
  absl::Time leftovers_kill_at = absl::InfiniteFuture();
};

class Launcher {
 public:
  explicit Launcher(LaunchOptions o) : o_(std::move(o)) {}

  int Run() {
    if (int bad = Validate(); bad != 0) return bad;
    if (o_.forward_signals.empty()) o_.forward_signals = {SIGTERM, SIGINT, SIGHUP, SIGQUIT};
    sigset_t mask;
    sigemptyset(&mask);
    for (int sig : o_.forward_signals) sigaddset(&mask, sig);
    sigaddset(&mask, SIGCHLD);
    sigprocmask(SIG_BLOCK, &mask, &old_mask_);
    signal_fd_ = ::signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    if (o_.bind_cores) {
      for (int cpu : AllowedCpus()) {
        if (cpu < CPU_SETSIZE) allowed_cpus_.push_back(cpu);  // what Spawn can pin
      }
      if (o_.nproc_per_node > static_cast<int>(allowed_cpus_.size())) {
        // As mpirun does by default: oversubscribed ranks are not bound. Two
        // ranks pinned to one core beside a busy process wait out its whole
        // time slice in every collective (4-byte all_reduce p50 2.2 ms at 4
        // ranks on 2 CPUs, against microseconds unbound; docs/benchmarks.md).
        Say(absl::StrCat("--bind cores: ", o_.nproc_per_node, " ranks on ", allowed_cpus_.size(),
                         " CPU(s): oversubscribed, so the ranks are not bound"));
        allowed_cpus_.clear();
      }
    }
    if (!PrepareDaemon() || !PrepareLogs()) {
      StopDaemon(interrupted_ != 0 ? absl::Seconds(1) : absl::Seconds(10));
      if (interrupted_ != 0) {
        Say(absl::StrCat("interrupted by ", strsignal(interrupted_), " before any rank started"));
        return 128 + interrupted_;
      }
      return 1;
    }
    int code = RunAttempts();
    StopDaemon();
    if (!temp_log_root_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(temp_log_root_, ec);
    }
    return code;
  }

 private:
  int Validate() {
    if (o_.command.empty()) return Usage("no command to run (muster-run [flags] -- CMD ARGS...)");
    if (o_.nproc_per_node < 1) return Usage("--nproc-per-node must be >= 1");
    if (o_.nnodes < 1) return Usage("--nnodes must be >= 1");
    if (o_.rendezvous == LaunchOptions::Rendezvous::kStatic) {
      if (o_.node_rank < 0 || o_.node_rank >= o_.nnodes) {
        return Usage(absl::StrCat("--node-rank must be in [0, ", o_.nnodes - 1, "]"));
      }
      o_.serves_store = o_.node_rank == 0;
      o_.min_nodes = o_.nnodes;
    }
    for (const auto* streams : {&o_.redirect, &o_.tee}) {
      for (const auto& [rank, bits] : *streams) {
        if (bits != 0 && o_.log_dir.empty()) {
          return Usage("--redirects and --tee write under --log-dir: give one");
        }
      }
    }
    if (o_.max_restarts < 0) return Usage("--max-restarts must be >= 0");
    if (MultiNode() && (o_.master_addr.empty() || o_.master_port <= 0)) {
      return Usage("with --nnodes > 1, --master-addr and --master-port are required");
    }
    if (o_.master_port < 0 || o_.master_port > 65535) return Usage("--master-port out of range");
    if (o_.job_id.empty()) {
      o_.job_id =
          MultiNode() ? absl::StrCat("run-", o_.master_port) : absl::StrCat("run-", ::getpid());
    }
    // It names --log-dir's subdirectory and store keys: no path in it.
    if (absl::Status s = ValidateJobId(o_.job_id); !s.ok()) {
      return Usage(absl::StrCat("--job-id / --rdzv-id: ", s.message()));
    }
    if (!o_.token_file.empty()) {
      std::ifstream in(o_.token_file);
      std::stringstream ss;
      ss << in.rdbuf();
      token_ = std::string(absl::StripAsciiWhitespace(ss.str()));
      if (token_.empty()) return Usage(absl::StrCat("no token in --token-file ", o_.token_file));
    }
    return 0;
  }

  // Several nodes may take part (a store shared through the network).
  bool MultiNode() const { return o_.nnodes > 1; }

  int Usage(const std::string& message) {
    Say(message);
    return 2;
  }

  // Uses a running musterd, or starts an embedded one.
  bool PrepareDaemon() {
    std::string socket = o_.socket.empty() ? ClientSocketPath() : o_.socket;
    if (absl::Status s = CheckDefaultSocketOwner(socket); !s.ok()) {
      Say(std::string(s.message()));
      return false;
    }
    if (auto status = ProbeDaemon(socket)) {
      socket_ = socket;
      if (o_.master_addr.empty()) o_.master_addr = "127.0.0.1";
      if (o_.master_port == 0) o_.master_port = status->store_port();
      if (o_.master_port == 0) {
        Say(absl::StrCat("the musterd at ", socket, " runs no store; pass --master-port"));
        return false;
      }
      Say(absl::StrCat("using musterd ", status->version(), " (pid ", status->pid(), ") at ",
                       socket));
      existing_daemon_ = true;
      return true;
    }
    if (!o_.socket.empty()) {
      Say(absl::StrCat("no musterd answers at --socket ", o_.socket));
      return false;
    }
    if (interrupted_ != 0) return false;
    std::string musterd = FindMusterd(o_.musterd_path);
    if (musterd.empty()) {
      Say("no musterd is running and none was found next to muster-run or on PATH "
          "(pass --musterd PATH)");
      return false;
    }
    char tmpl[] = "/tmp/muster-run-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) {
      Say(absl::StrCat("mkdtemp: ", std::strerror(errno)));
      return false;
    }
    work_dir_ = tmpl;
    socket_ = work_dir_ + "/musterd.sock";
    std::string ready = work_dir_ + "/ready.json";
    bool serves_store = o_.serves_store;
    std::vector<std::string> argv = {
        musterd,
        "--socket=" + socket_,
        "--grpc-port=0",
        "--listen=" + std::string(MultiNode() ? "0.0.0.0" : "127.0.0.1"),
        "--ready-file=" + ready,
        "--log-level=warning"};
    if (serves_store) {
      argv.push_back(absl::StrCat("--store-port=", o_.master_port));
      if (!o_.token_file.empty()) argv.push_back("--store-token-file=" + o_.token_file);
    } else {
      argv.push_back("--store=false");
      if (!o_.token_file.empty()) argv.push_back("--store-token-file=" + o_.token_file);
    }
    daemon_log_ = work_dir_ + "/musterd.log";
    daemon_pid_ = Spawn(argv, {}, nullptr, daemon_log_);
    if (daemon_pid_ < 0) return false;
    absl::Time deadline = absl::Now() + absl::Seconds(15);
    while (true) {
      std::ifstream in(ready);
      std::stringstream ss;
      ss << in.rdbuf();
      auto parsed = ParseFlatJsonObject(ss.str());
      if (parsed.ok()) {
        int port = 0;
        (void)absl::SimpleAtoi((*parsed)["store_port"], &port);
        if (serves_store && o_.master_port == 0) o_.master_port = port;
        // One node serving its own store listens on loopback only: the ranks
        // reach it there, whatever address --master-addr or
        // --rdzv-endpoint named for this node.
        if (o_.master_addr.empty() || (serves_store && !MultiNode())) {
          o_.master_addr = "127.0.0.1";
        }
        break;
      }
      // Ctrl-C while musterd starts stops muster-run at once (StopDaemon
      // then ends musterd); SIGCHLD here reaps musterd if it died.
      ReadSignals();
      if (interrupted_ != 0) return false;
      int status;
      if (daemon_pid_ > 0 && ::waitpid(daemon_pid_, &status, WNOHANG) == daemon_pid_) {
        daemon_pid_ = -1;
        daemon_died_reason_ = Describe(status);
      }
      if (daemon_pid_ < 0) {
        Say(absl::StrCat("the embedded musterd ", daemon_died_reason_, ":"));
        std::ifstream log(daemon_log_);
        std::fprintf(stderr, "%s", std::string(std::istreambuf_iterator<char>(log), {}).c_str());
        return false;
      }
      if (absl::Now() > deadline) {
        Say("the embedded musterd did not become ready within 15 s");
        return false;
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
    Say(absl::StrCat("started an embedded musterd for this job (socket ", socket_,
                     serves_store ? absl::StrCat(", store port ", o_.master_port) : "", ")"));
    return true;
  }

  // SIGTERM, and SIGKILL after `grace`. musterd reads SIGTERM only once it
  // serves: one interrupted while starting gets a short grace.
  void StopDaemon(absl::Duration grace = absl::Seconds(10)) {
    if (daemon_pid_ > 0) {
      ::kill(daemon_pid_, SIGTERM);
      int status = 0;
      absl::Time deadline = absl::Now() + grace;
      while (::waitpid(daemon_pid_, &status, WNOHANG) == 0 && absl::Now() < deadline) {
        absl::SleepFor(absl::Milliseconds(5));
      }
      if (absl::Now() >= deadline) {
        ::kill(daemon_pid_, SIGKILL);
        ::waitpid(daemon_pid_, &status, 0);
      }
      daemon_pid_ = -1;
    }
    if (!work_dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(work_dir_, ec);
    }
  }

  // fork+exec with extra environment; stdout/stderr to pipes (child) or a
  // log file (daemon). Returns the pid or -1.
  pid_t Spawn(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
              Child* child, const std::string& log_file) {
    int out[2] = {-1, -1}, err[2] = {-1, -1};
    if (child != nullptr && (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0)) {
      Say(absl::StrCat("pipe: ", std::strerror(errno)));
      return -1;
    }
    SpawnOptions options;
    options.argv = argv;
    options.search_path = true;
    options.env = env;
    options.null_stdin = false;  // ranks keep muster-run's stdin, as with torchrun
    // Ranks and the embedded musterd get a process group of their own:
    // signals reach a rank's whole group only through muster-run. Reading
    // the terminal fails in a rank instead of stopping it (SIGTTIN ignored).
    // They stay in muster-run's session, unlike torchrun's
    // (start_new_session): with autogroup scheduling a session is a
    // scheduling group, and a waiting rank's sched_yield would not hand its
    // CPU to a rank in another (docs/benchmarks.md, "ranks in one session").
    options.ignore_terminal_stops = child != nullptr;
    options.new_process_group = true;
    // Killed if muster-run dies without stopping them (SIGKILL, a crash).
    options.die_with_parent = true;
    options.signal_mask = old_mask_;
    options.who = "muster-run";
    if (child != nullptr && o_.bind_cores && !allowed_cpus_.empty()) {
      options.cpus = {allowed_cpus_[child->local_rank % allowed_cpus_.size()]};
    }
    int log_fd = -1;
    if (child != nullptr) {
      options.stdout_fd = out[1];
      options.stderr_fd = err[1];
    } else {
      log_fd = ::open(log_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      options.stdout_fd = log_fd;
      options.stderr_fd = log_fd;
    }
    absl::StatusOr<pid_t> spawned = muster::Spawn(options);
    if (log_fd >= 0) ::close(log_fd);
    if (!spawned.ok()) {
      Say(std::string(spawned.status().message()));
      if (child != nullptr) {
        for (int fd : {out[0], out[1], err[0], err[1]}) ::close(fd);
      }
      return -1;
    }
    pid_t pid = *spawned;
    if (child != nullptr) {
      ::close(out[1]);
      ::close(err[1]);
      child->pid = pid;
      child->out_fd = out[0];
      child->err_fd = err[0];
      child->running = true;
    }
    return pid;
  }

  // torchrun's environment for a rank (and muster's). `child` gets its
  // error file's path.
  std::map<std::string, std::string> RankEnv(int local_rank, int generation, int restarts,
                                             Child* child) {
    int world = o_.nnodes * o_.nproc_per_node;
    int rank = o_.node_rank * o_.nproc_per_node + local_rank;
    std::map<std::string, std::string> env = {
        {"RANK", absl::StrCat(rank)},
        {"LOCAL_RANK", absl::StrCat(o_.virtual_local_rank ? 0 : local_rank)},
        {"WORLD_SIZE", absl::StrCat(world)},
        {"LOCAL_WORLD_SIZE", absl::StrCat(o_.nproc_per_node)},
        {"GROUP_RANK", absl::StrCat(o_.node_rank)},
        {"GROUP_WORLD_SIZE", absl::StrCat(o_.nnodes)},
        {"ROLE_NAME", o_.role},
        {"ROLE_RANK", absl::StrCat(rank)},
        {"ROLE_WORLD_SIZE", absl::StrCat(world)},
        {"TORCHELASTIC_SIGNALS_TO_HANDLE", o_.signals_text},
        {"MASTER_ADDR", o_.master_addr},
        {"MASTER_PORT", absl::StrCat(o_.master_port)},
        {"MUSTER_SOCKET", socket_},
        {"MUSTER_JOB_ID", o_.job_id},
        {"MUSTER_GENERATION", absl::StrCat(generation)},
        // How many processes held this rank before this one (restart
        // policy "rank"); 0 under "job", where the generation counts.
        {"MUSTER_RESTART_COUNT", absl::StrCat(restarts)},
        // Unmodified PyTorch: every rank is a store client of musterd.
        {"TORCHELASTIC_USE_AGENT_STORE", "True"},
        {"TORCHELASTIC_RESTART_COUNT", absl::StrCat(generation)},
        {"TORCHELASTIC_RUN_ID", o_.job_id},
        {"TORCHELASTIC_MAX_RESTARTS", absl::StrCat(o_.max_restarts)},
    };
    if (!token_.empty()) env["MUSTER_STORE_TOKEN"] = token_;
    if (std::getenv("PYTHONUNBUFFERED") == nullptr) env["PYTHONUNBUFFERED"] = "1";
    if (std::getenv("TORCH_NCCL_ASYNC_ERROR_HANDLING") == nullptr) {
      env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1";
    }
    if (o_.nproc_per_node > 1 && std::getenv("OMP_NUM_THREADS") == nullptr) {
      env["OMP_NUM_THREADS"] = "1";
    }
    if (o_.virtual_local_rank) env["CUDA_VISIBLE_DEVICES"] = absl::StrCat(local_rank);
    if (child != nullptr) {
      std::string dir =
          absl::StrCat(log_root_, "/attempt_", generation + restarts, "/", local_rank);
      std::error_code ec;
      std::filesystem::create_directories(dir, ec);
      child->error_file = dir + "/error.json";
      std::filesystem::remove(child->error_file, ec);
      env["TORCHELASTIC_ERROR_FILE"] = child->error_file;
      OpenLogs(*child, local_rank, dir);
    }
    return env;
  }

  // <log dir>/<run id>_<random>/, torchrun's layout (or a temporary
  // directory for the error files alone).
  bool PrepareLogs() {
    std::string base = o_.log_dir;
    if (base.empty()) {
      char tmpl[] = "/tmp/muster-run-logs-XXXXXX";
      if (::mkdtemp(tmpl) == nullptr) {
        Say(absl::StrCat("mkdtemp: ", std::strerror(errno)));
        return false;
      }
      base = temp_log_root_ = tmpl;
    }
    std::string suffix(8, ' ');
    const char* letters = "abcdefghijklmnopqrstuvwxyz0123456789_";
    uint64_t seed = absl::ToUnixNanos(absl::Now()) ^ (static_cast<uint64_t>(::getpid()) << 20);
    for (char& c : suffix) {
      seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
      c = letters[(seed >> 33) % 37];
    }
    log_root_ = absl::StrCat(base, "/", o_.job_id, "_", suffix);
    std::error_code ec;
    std::filesystem::create_directories(log_root_, ec);
    if (ec) {
      Say(absl::StrCat("cannot create the log directory ", log_root_, ": ", ec.message()));
      return false;
    }
    return true;
  }

  // Which of the rank's streams go to files in `dir`, and which show on
  // the console (torchrun's --redirects, --tee, --local-ranks-filter).
  void OpenLogs(Child& c, int local_rank, const std::string& dir) {
    auto bits = [local_rank](const std::map<int, int>& m) {
      auto it = m.find(local_rank);
      if (it != m.end()) return it->second;
      it = m.find(-1);
      return it == m.end() ? 0 : it->second;
    };
    const int redirect = bits(o_.redirect), tee = bits(o_.tee);
    const bool shown = o_.console_ranks.empty() || o_.console_ranks.count(local_rank) > 0;
    c.out_console = shown && (redirect & 1) == 0;
    c.err_console = shown && (redirect & 2) == 0;
    if (((redirect | tee) & 1) != 0) {
      c.out_file =
          ::open((dir + "/stdout.log").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    }
    if (((redirect | tee) & 2) != 0) {
      c.err_file =
          ::open((dir + "/stderr.log").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    }
  }

  // The message of a rank's error file (torch's @record writes
  // {"message": {"message": "...", "extraInfo": ...}}), or "".
  static std::string ErrorFileMessage(const std::string& path) {
    std::ifstream in(path);
    if (!in) return "";
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    // The innermost "message" whose value is a string.
    size_t at = 0;
    while ((at = text.find("\"message\"", at)) != std::string::npos) {
      size_t colon = text.find(':', at);
      size_t value =
          colon == std::string::npos ? colon : text.find_first_not_of(" \t\n", colon + 1);
      at += 9;
      if (value == std::string::npos || text[value] != '"') continue;
      std::string message;
      for (size_t i = value + 1; i < text.size() && text[i] != '"'; ++i) {
        if (text[i] == '\\' && i + 1 < text.size()) {
          char e = text[++i];
          message += e == 'n' ? '\n' : e == 't' ? '\t' : e;
        } else {
          message += text[i];
        }
      }
      return message;
    }
    return "";
  }

  // Prints complete lines from `data` with the rank prefix (unless the
  // stream is not shown on the console) and writes `data` to the stream's
  // log file, if any; keeps a tail.
  void Emit(Child& c, std::string& partial, const char* data, size_t n, FILE* to, bool flush_all) {
    const bool is_out = &partial == &c.out_partial;
    const int file = is_out ? c.out_file : c.err_file;
    const bool console = is_out ? c.out_console : c.err_console;
    for (size_t done = 0; file >= 0 && done < n;) {
      ssize_t w = ::write(file, data + done, n - done);
      if (w <= 0) break;
      done += static_cast<size_t>(w);
    }
    partial.append(data, n);
    // Lines end at "\n", "\r\n" or a lone "\r" (a progress bar redrawn in
    // place); a line longer than kMaxLine is cut, so that output without
    // line ends still shows and the buffer stays bounded.
    constexpr size_t kMaxLine = 64 * 1024;
    size_t start = 0;
    while (true) {
      size_t end = partial.find_first_of("\r\n", start);
      size_t next;
      if (end == std::string::npos) {
        if (partial.size() - start <= kMaxLine) break;
        end = start + kMaxLine;
        next = end;
      } else if (partial[end] == '\r' && end + 1 == partial.size() && !flush_all) {
        break;  // "\r" or "\r\n": the next read tells
      } else {
        next = end + 1 +
               (partial[end] == '\r' && end + 1 < partial.size() && partial[end + 1] == '\n');
      }
      std::string line = partial.substr(start, end - start);
      if (console) std::fprintf(to, "[rank %d] %s\n", c.rank, line.c_str());
      c.tail.push_back(line);
      if (c.tail.size() > static_cast<size_t>(o_.tail_lines)) c.tail.pop_front();
      start = next;
    }
    partial.erase(0, start);
    if (flush_all && !partial.empty()) {
      if (console) std::fprintf(to, "[rank %d] %s\n", c.rank, partial.c_str());
      c.tail.push_back(partial);
      if (c.tail.size() > static_cast<size_t>(o_.tail_lines)) c.tail.pop_front();
      partial.clear();
    }
    std::fflush(to);
  }

  // One read of a rank's stream: emits what came, or at EOF (or an error)
  // its last partial line, and closes the stream. Returns the bytes read.
  ssize_t DrainFd(Child& c, int& fd, std::string& partial, FILE* to) {
    char buf[65536];
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n > 0) {
      Emit(c, partial, buf, n, to, false);
    } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
      CloseStream(c, fd, partial, to);
    }
    return n;
  }

  // Emits the stream's last partial line; closes its pipe and log file.
  void CloseStream(Child& c, int& fd, std::string& partial, FILE* to) {
    Emit(c, partial, "", 0, to, true);
    ::close(fd);
    fd = -1;
    int& file = &partial == &c.out_partial ? c.out_file : c.err_file;
    if (file >= 0) ::close(file);
    file = -1;
  }

  // Sends `sig` to every running rank's process group (to the rank itself
  // while it has not made its session yet, just after fork).
  void SignalRanks(int sig) {
    for (Child& c : ranks_) {
      if (c.running && ::kill(-c.pid, sig) != 0 && errno == ESRCH) ::kill(c.pid, sig);
    }
  }

  // Ranks that ended while processes they started still hold their output
  // pipes (a rank has ended when its own process has, as with torchrun):
  // kLeftoverGrace after it ended its process group gets SIGTERM, and
  // --stop-grace-seconds later SIGKILL; then what is left in its pipes is
  // read and they are closed.
  void EndLeftovers() {
    const absl::Time now = absl::Now();
    for (Child& c : ranks_) {
      if (c.running || (c.out_fd < 0 && c.err_fd < 0) || now < c.exited_at + kLeftoverGrace) {
        continue;
      }
      if (c.leftovers_kill_at == absl::InfiniteFuture()) {
        Say(absl::StrCat("rank ", c.rank, " ended ", absl::FormatDuration(kLeftoverGrace),
                         " ago but processes it started still hold its output; stopping its "
                         "process group"));
        ::kill(-c.pid, SIGTERM);
        c.leftovers_kill_at = now + o_.stop_grace;
        continue;
      }
      if (now < c.leftovers_kill_at) continue;
      ::kill(-c.pid, SIGKILL);
      for (int* fd : {&c.out_fd, &c.err_fd}) {
        if (*fd < 0) continue;
        const bool is_out = fd == &c.out_fd;
        std::string& partial = is_out ? c.out_partial : c.err_partial;
        FILE* to = is_out ? stdout : stderr;
        // What is in the pipe still counts (at most 1 MiB: a writer outside
        // the group may go on writing).
        ::fcntl(*fd, F_SETFL, ::fcntl(*fd, F_GETFL) | O_NONBLOCK);
        for (size_t total = 0; *fd >= 0 && total < (1u << 20);) {
          ssize_t n = DrainFd(c, *fd, partial, to);
          if (n <= 0) break;
          total += static_cast<size_t>(n);
        }
        if (*fd >= 0) CloseStream(c, *fd, partial, to);
      }
    }
  }

  bool AnyRunning() const {
    for (const Child& c : ranks_) {
      if (c.running || c.out_fd >= 0 || c.err_fd >= 0) return true;
    }
    return false;
  }

  void Reap() {
    while (true) {
      int status;
      pid_t pid = ::waitpid(-1, &status, WNOHANG);
      if (pid <= 0) return;
      if (pid == daemon_pid_) {
        daemon_pid_ = -1;
        if (!daemon_died_reason_.size()) daemon_died_reason_ = Describe(status);
        continue;
      }
      for (Child& c : ranks_) {
        if (c.pid == pid && c.running) {
          c.running = false;
          c.status = status;
          c.exited_at = absl::Now();
        }
      }
    }
  }

  // Pumps output and signals until every rank ended, or `until` says stop.
  // Sets interrupted_ when a forwarded signal arrives.
  void Pump(int timeout_ms) {
    EndLeftovers();
    std::vector<pollfd> fds;
    std::vector<std::pair<Child*, bool>> owners;  // child, is_stderr
    fds.push_back({signal_fd_, POLLIN, 0});
    owners.push_back({nullptr, false});
    for (Child& c : ranks_) {
      if (c.out_fd >= 0) {
        fds.push_back({c.out_fd, POLLIN, 0});
        owners.push_back({&c, false});
      }
      if (c.err_fd >= 0) {
        fds.push_back({c.err_fd, POLLIN, 0});
        owners.push_back({&c, true});
      }
    }
    int n = ::poll(fds.data(), fds.size(), timeout_ms);
    if (n <= 0) return;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      if (i == 0) {
        ReadSignals();
        continue;
      }
      Child& c = *owners[i].first;
      if (owners[i].second) {
        DrainFd(c, c.err_fd, c.err_partial, stderr);
      } else {
        DrainFd(c, c.out_fd, c.out_partial, stdout);
      }
    }
  }

  // Reads what signalfd holds: SIGCHLD reaps, the first forwarded signal
  // sets interrupted_ and goes on to the running ranks.
  void ReadSignals() {
    signalfd_siginfo si;
    while (::read(signal_fd_, &si, sizeof(si)) == sizeof(si)) {
      if (si.ssi_signo == SIGCHLD) {
        Reap();
      } else if (interrupted_ == 0) {
        interrupted_ = static_cast<int>(si.ssi_signo);
        const bool ranks_run =
            std::any_of(ranks_.begin(), ranks_.end(), [](const Child& c) { return c.running; });
        Say(absl::StrCat("received ", strsignal(interrupted_),
                         ranks_run ? "; forwarding it to the ranks" : "; stopping"));
        SignalRanks(interrupted_);
        kill_deadline_ = absl::Now() + o_.stop_grace;
      }
    }
  }

  // The first rank that failed, if any.
  const Child* FirstFailure() const {
    for (const Child& c : ranks_) {
      if (!c.running && c.pid > 0 && !(WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0)) {
        return &c;
      }
    }
    return nullptr;
  }

  void StopAll(const std::string& why) {
    bool any = false;
    for (const Child& c : ranks_) any |= c.running;
    if (!any) return;
    Say(absl::StrCat(why, "; stopping the other ranks"));
    SignalRanks(SIGTERM);
    absl::Time deadline = absl::Now() + o_.stop_grace;
    bool killed = false;
    while (AnyRunning()) {
      Pump(50);
      if (!killed && absl::Now() > deadline) {
        SignalRanks(SIGKILL);
        killed = true;
      }
    }
  }

  std::unique_ptr<TcpStore> JobStore() {
    if (!MultiNode()) return nullptr;
    TcpStoreOptions so;
    so.host = o_.master_addr;
    so.port = o_.master_port;
    so.token = token_;
    so.connect_timeout = absl::Seconds(60);
    auto store = TcpStore::Connect(so);
    if (!store.ok()) {
      Say(absl::StrCat("cannot reach the job's store: ", store.status().message()));
      return nullptr;
    }
    return std::move(*store);
  }

  // Restart policy "rank": starts each rank that failed again, in place,
  // while restarts are left (the others keep running).
  void RestartFailedRanks(int generation) {
    for (size_t i = 0; i < ranks_.size(); ++i) {
      Child& c = ranks_[i];
      if (c.running || c.pid <= 0 || (WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0)) {
        continue;
      }
      if (rank_restarts_used_ >= o_.max_restarts) return;
      if (c.out_fd >= 0 || c.err_fd >= 0) continue;  // its last output first
      ++rank_restarts_used_;
      int restarts = ++restarts_of_rank_[c.rank];
      Say(absl::StrCat("rank ", c.rank, " (pid ", c.pid, ") ", Describe(c.status),
                       "; restarting it (restart ", rank_restarts_used_, " of ", o_.max_restarts,
                       "), the other ranks keep running"));
      Child fresh;
      fresh.rank = c.rank;
      c = std::move(fresh);
      c.local_rank = static_cast<int>(i);
      if (Spawn(o_.command, RankEnv(static_cast<int>(i), generation, restarts, &c), &c, "") < 0) {
        Say(absl::StrCat("cannot restart rank ", c.rank));
      }
    }
  }

  // The embedded musterd of a node that does not serve the job's store
  // died: stops this node's ranks (they cannot go on without it), records
  // each as gone in the job's store (a failure record, and gone/<r> so that
  // a new process may take the rank over) -- the daemon that would have
  // done it is dead -- and starts a new musterd. The ranks are then
  // restarted like any failed rank. False if that is not possible.
  bool RecoverDaemon(TcpStore& store, int generation) {
    Say(absl::StrCat("the embedded musterd ", daemon_died_reason_,
                     "; this node's ranks fail with it: restarting musterd, then the ranks"));
    for (Child& c : ranks_) {
      if (c.running) ::kill(-c.pid, SIGKILL);
    }
    while (AnyRunning()) Pump(50);
    if (interrupted_ != 0) return false;
    const std::string prefix = absl::StrCat("muster/", o_.job_id, "/", generation, "/");
    int64_t epoch = 0;
    if (auto present = store.Check({prefix + "epoch"}); present.ok() && *present) {
      auto value = store.Get(prefix + "epoch", absl::Seconds(5));
      if (value.ok()) (void)absl::SimpleAtoi(*value, &epoch);
    }
    for (const Child& c : ranks_) {
      const std::string key = absl::StrCat(prefix, "rank/", c.rank);
      auto present = store.Check({key});
      if (!present.ok() || !*present) continue;  // it never registered
      auto held = store.Get(key, absl::Seconds(5));
      if (!held.ok()) continue;
      std::vector<std::string> f = absl::StrSplit(*held, '\t');
      std::string host = f.size() > 0 ? f[0] : "", pid = f.size() > 1 ? f[1] : "0";
      auto n = store.Add(prefix + "failures", 1);
      absl::Status s = n.status();
      if (n.ok()) {
        s = store.Set(
            absl::StrCat(prefix, "failure/", *n),
            absl::StrCat(c.rank, "\t", host, "\t", pid, "\t", epoch, "\tits musterd (node ",
                         o_.node_rank, ") ", daemon_died_reason_));
      }
      if (s.ok()) s = store.Set(absl::StrCat(prefix, "gone/", c.rank), *held);
      if (!s.ok()) {
        Say(absl::StrCat("cannot record rank ", c.rank, " as failed: ", s.message()));
        return false;
      }
    }
    if (!work_dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(work_dir_, ec);
      work_dir_.clear();
    }
    daemon_died_reason_.clear();
    return PrepareDaemon();
  }

  // Several nodes, this node's ranks done: says so in the job's store, and
  // on node 0 (whose daemon serves the store) waits for the other nodes to
  // say so too, so a node finishing a moment later still finds the store
  // to check the job's outcome (torchrun's exit barrier).
  void ExitBarrier(TcpStore& store, int generation, const std::string& failed_key) {
    const std::string key = absl::StrCat("muster-run/", o_.job_id, "/exited/", generation);
    absl::StatusOr<int64_t> n = store.Add(key, 1);
    if (!n.ok()) {
      Say(absl::StrCat("cannot tell the job's store this node is done: ", n.status().message()));
      return;
    }
    if (!o_.serves_store || *n >= o_.nnodes) return;
    Say(absl::StrCat("waiting up to ", absl::FormatDuration(o_.exit_barrier), " for ",
                     o_.nnodes - *n, " other node(s) to finish before stopping the job's store"));
    absl::Time give_up = absl::Now() + o_.exit_barrier;
    while (absl::Now() < give_up && interrupted_ == 0) {
      Pump(100);
      n = store.Add(key, 0);
      if (!n.ok() || *n >= o_.nnodes) return;
      auto failed = store.Check({failed_key});
      if (failed.ok() && *failed) return;  // that node reports its failure itself
    }
    if (interrupted_ == 0) {
      Say(absl::StrCat("gave up waiting: ", o_.nnodes - *n,
                       " node(s) did not finish within the exit barrier"));
    }
  }

  // One progress line: on a terminal rewritten in place (at most once a
  // second), else printed when `what` (the line without its countdown)
  // changes, or every 10 s.
  void Progress(const std::string& what, const std::string& countdown) {
    const bool tty = ::isatty(STDERR_FILENO) == 1;
    absl::Time now = absl::Now();
    if (now - last_progress_ < absl::Seconds(1)) return;
    if (tty) {
      std::fprintf(stderr, "\r\033[Kmuster-run: %s%s", what.c_str(), countdown.c_str());
      std::fflush(stderr);
      progress_open_ = true;
    } else {
      if (what == last_progress_line_ && now - last_progress_ < absl::Seconds(10)) return;
      Say(what + countdown);
    }
    last_progress_ = now;
    last_progress_line_ = what;
  }
  void EndProgress(const std::string& line) {
    if (progress_open_) std::fprintf(stderr, "\r\033[K");
    progress_open_ = false;
    if (!last_progress_line_.empty()) Say(line);
    last_progress_line_.clear();
    last_progress_ = absl::InfinitePast();
  }

  // Rendezvous kStore: this node joins the job's nodes through the store;
  // it closes with nnodes nodes, or with min_nodes..nnodes once no node
  // came for last_call. Sets node_rank (arrival order) and nnodes.
  bool JoinNodes(TcpStore& store) {
    const std::string prefix = absl::StrCat("muster-run/", o_.job_id, "/rdzv/");
    absl::StatusOr<int64_t> me = store.Add(prefix + "joined", 1);
    if (!me.ok()) {
      Say(absl::StrCat("cannot join the job's nodes: ", me.status().message()));
      return false;
    }
    const int64_t index = *me - 1;
    const std::string wanted = o_.min_nodes == o_.nnodes
                                   ? absl::StrCat(o_.nnodes)
                                   : absl::StrCat(o_.min_nodes, "..", o_.nnodes);
    absl::Time start = absl::Now(), give_up = start + o_.join_timeout, last_change = start;
    int64_t seen = *me;
    std::string size_text;
    while (true) {
      auto closed = store.Check({prefix + "size"});
      if (closed.ok() && *closed) {
        auto v = store.Get(prefix + "size", absl::Seconds(10));
        if (v.ok()) size_text = *v;
        break;
      }
      absl::StatusOr<int64_t> joined = store.Add(prefix + "joined", 0);
      if (!joined.ok()) {
        Say(absl::StrCat("cannot read the job's nodes: ", joined.status().message()));
        return false;
      }
      if (*joined != seen) last_change = absl::Now();
      seen = *joined;
      const int64_t n = std::min<int64_t>(seen, o_.nnodes);
      if (n >= o_.nnodes || (n >= o_.min_nodes && absl::Now() - last_change >= o_.last_call)) {
        (void)store.CompareSet(prefix + "size", "", absl::StrCat(n));
        continue;
      }
      if (absl::Now() >= give_up) {
        Say(absl::StrCat("the job's nodes did not gather: ", seen, " of ", wanted,
                         " joined within the join timeout (", absl::FormatDuration(o_.join_timeout),
                         ")"));
        return false;
      }
      if (absl::Now() - start >= absl::Seconds(1)) {
        std::string closes =
            n >= o_.min_nodes
                ? absl::StrCat("; closing in ",
                               absl::ToInt64Seconds(o_.last_call - (absl::Now() - last_change)) + 1,
                               " s unless more come")
                : "";
        Progress(absl::StrCat("waiting for nodes: ", seen, " of ", wanted, " joined"),
                 absl::StrCat(closes, "; ", absl::ToInt64Seconds(give_up - absl::Now()),
                              " s left of the join timeout"));
      }
      Pump(static_cast<int>(absl::ToInt64Milliseconds(o_.monitor_interval)));
      if (interrupted_ != 0) return false;
    }
    int64_t size = 0;
    if (!absl::SimpleAtoi(size_text, &size) || size < 1) {
      Say(absl::StrCat("bad rendezvous record '", size_text, "'"));
      return false;
    }
    if (index >= size) {
      Say(absl::StrCat("this node came after the job's nodes gathered (", size,
                       " nodes); muster-run does not add nodes to a running job"));
      return false;
    }
    EndProgress(absl::StrCat("the job's nodes gathered: ", size));
    o_.nnodes = static_cast<int>(size);
    o_.node_rank = static_cast<int>(index);
    Say(absl::StrCat("node ", o_.node_rank, " of ", o_.nnodes,
                     o_.serves_store ? " (serving the job's store)" : ""));
    return true;
  }

  // While some of the job's ranks have registered with muster and others
  // not yet, a progress line names the missing ones (ranks that never use
  // muster's World, e.g. torch's gloo backend, register nothing: no line).
  // Only the launcher next to the store asks (one request while all are
  // there; a request per rank while some are missing, once a second), so a
  // large job's nodes do not each poll the store for every rank.
  void WatchRegistrations(TcpStore* store, int generation, bool now = false) {
    if (store == nullptr || all_registered_ || (MultiNode() && !o_.serves_store)) return;
    if (!now && absl::Now() < next_registration_check_) return;
    next_registration_check_ = absl::Now() + absl::Seconds(1);
    const int world = o_.nnodes * o_.nproc_per_node;
    std::vector<std::string> keys;
    for (int r = 0; r < world; ++r) {
      keys.push_back(absl::StrCat("muster/", o_.job_id, "/", generation, "/rank/", r));
    }
    auto all = store->Check(keys);
    if (!all.ok()) return;
    std::vector<int> missing;
    int present = *all ? world : 0;
    for (int r = 0; r < world && !*all; ++r) {
      auto p = store->Check({keys[r]});
      if (!p.ok()) return;
      if (*p) {
        ++present;
      } else {
        missing.push_back(r);
      }
    }
    if (present == 0) return;
    if (missing.empty()) {
      all_registered_ = true;
      EndProgress(absl::StrCat("all ", world, " ranks joined"));
      return;
    }
    if (first_registration_ == absl::InfiniteFuture()) first_registration_ = absl::Now();
    const absl::Duration waited = absl::Now() - first_registration_;
    if (waited < absl::Seconds(1)) return;
    const size_t missing_count = missing.size();
    if (missing.size() > 8) missing.resize(8);
    Progress(absl::StrCat("waiting for ranks: ", present, " of ", world, " joined (missing: ",
                          absl::StrJoin(missing, ", "), missing_count > 8 ? ", ..." : "", ")"),
             absl::StrCat("; ", absl::ToInt64Seconds(absl::Minutes(30) - waited),
                          " s left of the ranks' default 30 min timeout"));
  }

  // A store connection for the progress line on one node (several nodes
  // use the job's store).
  std::unique_ptr<TcpStore> LocalStore() {
    if (o_.master_port <= 0) return nullptr;
    TcpStoreOptions so;
    so.host = o_.master_addr.empty() ? "127.0.0.1" : o_.master_addr;
    so.port = o_.master_port;
    so.token = token_;
    so.connect_timeout = absl::Seconds(2);
    auto store = TcpStore::Connect(so);
    if (!store.ok()) return nullptr;
    return std::move(*store);
  }

  int RunAttempts() {
    std::unique_ptr<TcpStore> store = JobStore();
    if (MultiNode() && store == nullptr) return 1;
    if (o_.rendezvous == LaunchOptions::Rendezvous::kStore && store != nullptr &&
        !JoinNodes(*store)) {
      if (interrupted_ != 0) {
        Say(absl::StrCat("interrupted by ", strsignal(interrupted_), " before any rank started"));
        return 128 + interrupted_;
      }
      return 1;
    }
    std::unique_ptr<TcpStore> local_store = store == nullptr ? LocalStore() : nullptr;
    TcpStore* progress_store = store != nullptr ? store.get() : local_store.get();
    int base = 0;
    if (existing_daemon_ && !MultiNode()) {
      // A persistent daemon may have seen this job id: never reuse a
      // generation (its keys would be stale).
      TcpStoreOptions so;
      so.host = o_.master_addr;
      so.port = o_.master_port;
      so.token = token_;
      auto s = TcpStore::Connect(so);
      if (s.ok()) {
        auto n = (*s)->Add(absl::StrCat("muster-run/", o_.job_id, "/attempts"), 1);
        if (n.ok()) base = static_cast<int>(*n - 1);
      }
    }
    std::string failure_summary;
    const int attempts =
        o_.restart_policy == RestartPolicy::kRank ? 0 : o_.max_restarts;  // kRank: in place
    for (int attempt = 0; attempt <= attempts; ++attempt) {
      int generation = base + attempt;
      if (attempt > 0) {
        Say(absl::StrCat("restarting all ", o_.nproc_per_node, " local rank(s): attempt ",
                         attempt + 1, " of ", attempts + 1, ", generation ", generation));
      }
      ranks_.clear();
      ranks_.resize(o_.nproc_per_node);
      for (int i = 0; i < o_.nproc_per_node; ++i) {
        ranks_[i].rank = o_.node_rank * o_.nproc_per_node + i;
        ranks_[i].local_rank = i;
        if (Spawn(o_.command, RankEnv(i, generation, 0, &ranks_[i]), &ranks_[i], "") < 0) {
          StopAll(absl::StrCat("cannot start local rank ", i));
          return 1;
        }
      }
      std::string failed_key = absl::StrCat("muster-run/", o_.job_id, "/failed/", generation);
      std::string remote_failure;
      absl::Time next_check = absl::Now();
      all_registered_ = false;
      first_registration_ = absl::InfiniteFuture();
      while (AnyRunning()) {
        Pump(100);
        if (interrupted_ == 0) WatchRegistrations(progress_store, generation);
        if (interrupted_ != 0 && kill_deadline_ < absl::Now()) {
          SignalRanks(SIGKILL);
          kill_deadline_ = absl::InfiniteFuture();
        }
        if (interrupted_ == 0 && daemon_pid_ < 0 && !existing_daemon_ &&
            !daemon_died_reason_.empty() && o_.restart_policy == RestartPolicy::kRank &&
            rank_restarts_used_ < o_.max_restarts && MultiNode() && !o_.serves_store &&
            store != nullptr) {
          // Restart policy "rank" on a node whose musterd died: its ranks
          // are failed ranks of the job (restarted with a new musterd).
          if (!RecoverDaemon(*store, generation)) break;
        }
        if (interrupted_ == 0 && o_.restart_policy == RestartPolicy::kRank &&
            (existing_daemon_ || daemon_pid_ > 0)) {
          RestartFailedRanks(generation);
        }
        const bool may_restart =
            o_.restart_policy == RestartPolicy::kRank && rank_restarts_used_ < o_.max_restarts;
        if (interrupted_ == 0 && !may_restart && FirstFailure() != nullptr) break;
        if (interrupted_ == 0 && daemon_pid_ < 0 && !existing_daemon_ &&
            !daemon_died_reason_.empty()) {
          break;
        }
        if (store != nullptr && interrupted_ == 0 && absl::Now() >= next_check) {
          next_check = absl::Now() + o_.monitor_interval;
          auto present = store->Check({failed_key});
          if (present.ok() && *present) {
            auto v = store->Get(failed_key, absl::Seconds(5));
            remote_failure = v.ok() ? *v : "another node failed";
            break;
          }
        }
      }
      if (!last_progress_line_.empty()) {
        // The ranks ended while a progress line was up: its last word.
        WatchRegistrations(progress_store, generation, /*now=*/true);
        if (progress_open_) std::fprintf(stderr, "\n");
        progress_open_ = false;
        last_progress_line_.clear();
      }
      if (interrupted_ != 0) {
        while (AnyRunning()) Pump(50);
        Say(absl::StrCat("interrupted by ", strsignal(interrupted_), "; all ranks stopped"));
        return 128 + interrupted_;
      }
      if (store != nullptr && remote_failure.empty() && FirstFailure() == nullptr) {
        // Our ranks are done; did the job fail on another node meanwhile?
        auto present = store->Check({failed_key});
        if (present.ok() && *present) {
          auto v = store->Get(failed_key, absl::Seconds(5));
          remote_failure = v.ok() ? *v : "another node failed";
        }
      }
      const Child* failed = FirstFailure();
      if (failed == nullptr && remote_failure.empty() && daemon_died_reason_.empty()) {
        Say(absl::StrCat("all ", o_.nproc_per_node, " local rank(s) exited 0"));
        if (store != nullptr) ExitBarrier(*store, generation, failed_key);
        return 0;
      }
      std::string what;
      if (failed != nullptr) {
        what = absl::StrCat("rank ", failed->rank, " (pid ", failed->pid, ") ",
                            Describe(failed->status));
        if (std::string m = ErrorFileMessage(failed->error_file); !m.empty()) {
          absl::StrAppend(&what, ": ", m, " (its error file ", failed->error_file, ")");
        }
        std::vector<std::string> tail(failed->tail.begin(), failed->tail.end());
        failure_summary = absl::StrCat(what, tail.empty() ? "" : "; its last output:\n  ",
                                       absl::StrJoin(tail, "\n  "));
        if (store != nullptr) {
          // The first node to fail records the root cause; a later local
          // failure is usually its consequence (an aborted collective).
          std::string mine = absl::StrCat("node ", o_.node_rank, ": ", what);
          auto first = store->CompareSet(failed_key, "", mine);
          if (first.ok() && *first != mine) {
            failure_summary = absl::StrCat("the job failed on another node (", *first, "); here ",
                                           failure_summary);
          }
        }
      } else if (!remote_failure.empty()) {
        what = absl::StrCat("the job failed elsewhere (", remote_failure, ")");
        failure_summary = what;
      } else {
        what = absl::StrCat("the embedded musterd ", daemon_died_reason_);
        failure_summary = what;
      }
      StopAll(what);
      if (interrupted_ != 0) {
        // Interrupted while stopping: no new generation.
        Say(absl::StrCat("interrupted by ", strsignal(interrupted_), "; all ranks stopped"));
        return 128 + interrupted_;
      }
      // Output of ranks that failed while stopping is part of the record.
      const Child* first = FirstFailure();
      if (failed == nullptr && first != nullptr && remote_failure.empty()) failed = first;
      if (!daemon_died_reason_.empty()) break;
    }
    Say(absl::StrCat("job ", o_.job_id, " failed: ", failure_summary));
    return 1;
  }

  LaunchOptions o_;
  std::string token_;
  std::string socket_;
  std::string work_dir_;
  std::string daemon_log_;
  pid_t daemon_pid_ = -1;
  std::string daemon_died_reason_;
  bool existing_daemon_ = false;
  // The progress line.
  absl::Time last_progress_ = absl::InfinitePast();
  std::string last_progress_line_;
  bool progress_open_ = false;
  bool all_registered_ = false;
  absl::Time first_registration_ = absl::InfiniteFuture();
  absl::Time next_registration_check_ = absl::InfinitePast();
  std::vector<int> allowed_cpus_;  // --bind cores: the CPUs muster-run may use
  std::string log_root_;           // <log dir>/<run id>_<random>
  std::string temp_log_root_;      // removed at the end: no --log-dir
  int signal_fd_ = -1;
  sigset_t old_mask_;
  std::vector<Child> ranks_;
  int interrupted_ = 0;
  absl::Time kill_deadline_ = absl::InfiniteFuture();
  // Restart policy "rank": restarts used on this node, and per rank.
  int rank_restarts_used_ = 0;
  std::map<int, int> restarts_of_rank_;
};

}  // namespace

int RunLaunch(LaunchOptions options) { return Launcher(std::move(options)).Run(); }

}  // namespace muster
