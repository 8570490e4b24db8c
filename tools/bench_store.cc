#include "tools/bench_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/json.h"
#include "common/spawn.h"
#include "muster/tcp_store.h"

namespace muster::bench {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

void Progress(const std::string& message) {
  std::fprintf(stderr, "muster-bench: %s\n", message.c_str());
  std::fflush(stderr);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string Tail(const std::string& text, size_t bytes) {
  return text.size() <= bytes ? text : "..." + text.substr(text.size() - bytes);
}

// Releases every waiting thread at once (one FUTEX_WAKE), so N clients start
// together; a mutex-based notification would hand its lock from waiter to
// waiter and stagger the start.
class StartGate {
 public:
  void Wait() {
    while (open_.load(std::memory_order_acquire) == 0) {
      ::syscall(SYS_futex, reinterpret_cast<int*>(&open_), FUTEX_WAIT_PRIVATE, 0, nullptr, nullptr,
                0);
    }
  }
  void Open() {
    open_.store(1, std::memory_order_release);
    ::syscall(SYS_futex, reinterpret_cast<int*>(&open_), FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr,
              nullptr, 0);
  }

 private:
  std::atomic<int32_t> open_{0};
  static_assert(sizeof(std::atomic<int32_t>) == sizeof(int32_t), "futex word");
};

// ---------------------------------------------------------------------------
// Child processes (musterd, the PyTorch master).

class Child {
 public:
  // Starts argv[0] with stderr to `stderr_path`; with `stdout_fd`, stdout is
  // a pipe whose read end is returned there (else stdout goes to the file
  // too). The child is SIGKILLed if this process dies.
  static absl::StatusOr<std::unique_ptr<Child>> Start(const std::vector<std::string>& argv,
                                                      const std::string& stderr_path,
                                                      int* stdout_fd) {
    int err_fd = ::open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (err_fd < 0)
      return absl::InternalError(absl::StrCat("open ", stderr_path, ": ", strerror(errno)));
    int pipe_fds[2] = {-1, -1};
    if (stdout_fd != nullptr && ::pipe2(pipe_fds, O_CLOEXEC) != 0) {
      ::close(err_fd);
      return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
    }
    SpawnOptions options;
    options.argv = argv;
    options.stdout_fd = stdout_fd != nullptr ? pipe_fds[1] : err_fd;
    options.stderr_fd = err_fd;
    options.die_with_parent = true;
    options.who = "muster-bench";
    absl::StatusOr<pid_t> spawned = muster::Spawn(options);
    if (!spawned.ok()) {
      ::close(err_fd);
      if (stdout_fd != nullptr) {
        ::close(pipe_fds[0]);
        ::close(pipe_fds[1]);
      }
      return spawned.status();
    }
    pid_t pid = *spawned;
    ::close(err_fd);
    if (stdout_fd != nullptr) {
      ::close(pipe_fds[1]);
      *stdout_fd = pipe_fds[0];
    }
    return std::unique_ptr<Child>(new Child(pid, stderr_path));
  }

  ~Child() { Stop(SIGTERM, 5); }

  pid_t pid() const { return pid_; }
  const std::string& stderr_path() const { return stderr_path_; }

  bool Running() {
    if (exited_) return false;
    int status = 0;
    pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      exited_ = true;
      status_ = status;
      return false;
    }
    return r == 0;
  }

  std::string Describe() const {
    if (!exited_) return "running";
    if (WIFEXITED(status_)) return absl::StrCat("exited with status ", WEXITSTATUS(status_));
    if (WIFSIGNALED(status_)) return absl::StrCat("killed by signal ", WTERMSIG(status_));
    return "ended";
  }

  // Sends `sig`, waits up to `timeout_s`, then SIGKILLs. True if the child
  // ended from `sig` within the timeout.
  bool Stop(int sig, double timeout_s) {
    if (!Running()) return true;
    ::kill(pid_, sig);
    Clock::time_point start = Clock::now();
    while (SecondsSince(start) < timeout_s) {
      if (!Running()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &status_, 0);
    exited_ = true;
    return false;
  }

 private:
  Child(pid_t pid, std::string stderr_path) : pid_(pid), stderr_path_(std::move(stderr_path)) {}
  pid_t pid_;
  std::string stderr_path_;
  bool exited_ = false;
  int status_ = 0;
};

// Resident memory (bytes) and CPU seconds (user + system) of a process.
int64_t RssBytes(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      int64_t kb = 0;
      std::string digits;
      for (char c : line) {
        if (c >= '0' && c <= '9') digits += c;
      }
      if (absl::SimpleAtoi(digits, &kb)) return kb * 1024;
    }
  }
  return 0;
}

// CPU time of every thread of a process, from /proc/PID/task/*/schedstat
// (nanoseconds; /proc/PID/stat only has clock ticks).
double CpuSeconds(pid_t pid) {
  if (pid <= 0) return 0;
  double total = 0;
  std::error_code ec;
  for (const auto& task :
       std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/task"), ec)) {
    std::string stat = ReadFile(task.path().string() + "/schedstat");
    std::vector<std::string> fields = absl::StrSplit(stat, ' ');
    int64_t ns = 0;
    if (!fields.empty() && absl::SimpleAtoi(fields[0], &ns)) total += static_cast<double>(ns) / 1e9;
  }
  return total;
}

double SelfCpuSeconds() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec +
         (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

// Sets the CPU affinity of every thread of process `pid`.
void PinProcess(pid_t pid, const cpu_set_t& cpus) {
  std::error_code ec;
  for (const auto& task :
       std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/task"), ec)) {
    int64_t tid = 0;
    if (absl::SimpleAtoi(task.path().filename().string(), &tid)) {
      ::sched_setaffinity(static_cast<pid_t>(tid), sizeof(cpus), &cpus);
    }
  }
}

cpu_set_t OneCpu(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return set;
}

// A port nobody listens on now, on every IPv4 and IPv6 address.
absl::StatusOr<int> PickFreePort() {
  int fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    int off = 0;
    ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof(off));
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
      socklen_t len = sizeof(a);
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
      ::close(fd);
      return ntohs(a.sin6_port);
    }
    ::close(fd);
  }
  fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", strerror(errno)));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return absl::InternalError(absl::StrCat("bind: ", strerror(errno)));
  }
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// One store server under test.
struct Target {
  std::string name;  // "musterd" or "torch"
  TcpStoreOptions::Protocol protocol = TcpStoreOptions::Protocol::kNative;
  int port = 0;
  std::unique_ptr<Child> child;
  int stdout_fd = -1;

  ~Target() {
    if (stdout_fd >= 0) ::close(stdout_fd);
  }

  absl::StatusOr<std::unique_ptr<TcpStore>> Connect(
      absl::Duration timeout = absl::Seconds(120),
      absl::Duration connect_timeout = absl::Seconds(30)) const {
    TcpStoreOptions o;
    o.host = "127.0.0.1";
    o.port = port;
    o.protocol = protocol;
    o.timeout = timeout;
    o.connect_timeout = connect_timeout;
    return TcpStore::Connect(o);
  }
  pid_t pid() const { return child != nullptr ? child->pid() : 0; }
};

absl::StatusOr<std::unique_ptr<Target>> StartMusterd(const std::string& binary,
                                                     const std::string& dir, double timeout_s) {
  auto t = std::make_unique<Target>();
  t->name = "musterd";
  t->protocol = TcpStoreOptions::Protocol::kNative;
  std::string ready = dir + "/ready.json";
  std::vector<std::string> argv = {
      binary, "--socket", dir + "/s.sock", "--grpc-port",  "0",  "--store-port",
      "0",    "--listen", "127.0.0.1",     "--ready-file", ready};
  auto child = Child::Start(argv, dir + "/musterd.log", nullptr);
  if (!child.ok()) return child.status();
  t->child = std::move(*child);
  Clock::time_point start = Clock::now();
  while (true) {
    struct stat st;
    if (::stat(ready.c_str(), &st) == 0) break;
    if (!t->child->Running()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "musterd (", binary, ") ", t->child->Describe(), " before it was ready; its log:\n",
          Tail(ReadFile(t->child->stderr_path()), 2000)));
    }
    if (SecondsSince(start) > timeout_s) {
      return absl::DeadlineExceededError(
          absl::StrCat("musterd not ready after ", timeout_s, " s; its log:\n",
                       Tail(ReadFile(t->child->stderr_path()), 2000)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  auto fields = ParseFlatJsonObject(ReadFile(ready));
  int64_t port = 0;
  if (!fields.ok() || !absl::SimpleAtoi((*fields)["store_port"], &port) || port <= 0) {
    return absl::InternalError(absl::StrCat("bad ready file ", ready, ": ", ReadFile(ready)));
  }
  t->port = static_cast<int>(port);
  return t;
}

absl::StatusOr<std::unique_ptr<Target>> StartTorch(const std::string& python,
                                                   const std::string& dir, double timeout_s) {
  auto t = std::make_unique<Target>();
  t->name = "torch";
  t->protocol = TcpStoreOptions::Protocol::kTorch113;
  auto port = PickFreePort();
  if (!port.ok()) return port.status();
  t->port = *port;
  std::string script = absl::StrReplaceAll(
      "import torch.distributed as d, datetime, time, sys; "
      "s=d.TCPStore('127.0.0.1', PORT, 1, True, datetime.timedelta(seconds=300), "
      "wait_for_workers=False); print('ready', flush=True); time.sleep(1e9)",
      {{"PORT", absl::StrCat(*port)}});
  auto child = Child::Start({python, "-c", script}, dir + "/torch.log", &t->stdout_fd);
  if (!child.ok()) return child.status();
  t->child = std::move(*child);
  std::string out;
  Clock::time_point start = Clock::now();
  while (out.find("ready") == std::string::npos) {
    double left = timeout_s - SecondsSince(start);
    if (left <= 0) {
      return absl::DeadlineExceededError(
          absl::StrCat("the PyTorch TCPStore master did not print 'ready' within ", timeout_s,
                       " s; its stderr:\n", Tail(ReadFile(t->child->stderr_path()), 2000)));
    }
    pollfd p{t->stdout_fd, POLLIN, 0};
    int r = ::poll(&p, 1, static_cast<int>(std::min(left, 0.2) * 1000) + 1);
    if (r > 0) {
      char buf[256];
      ssize_t n = ::read(t->stdout_fd, buf, sizeof(buf));
      if (n > 0) out.append(buf, n);
      if (n == 0 && !t->child->Running()) {
        return absl::FailedPreconditionError(absl::StrCat(
            python, " (PyTorch TCPStore master) ", t->child->Describe(),
            " before it was ready; its stderr:\n", Tail(ReadFile(t->child->stderr_path()), 2000)));
      }
    } else if (!t->child->Running()) {
      return absl::FailedPreconditionError(absl::StrCat(
          python, " (PyTorch TCPStore master) ", t->child->Describe(),
          " before it was ready; its stderr:\n", Tail(ReadFile(t->child->stderr_path()), 2000)));
    }
  }
  return t;
}

// ---------------------------------------------------------------------------
// Results.

struct LatencyResult {
  bool ran = false;
  double p50_us = 0, p99_us = 0, mean_us = 0;
  double server_cpu_us = 0;  // server CPU per call (warm-up included)
  int64_t samples = 0, errors = 0;
  std::string first_error;
};

struct ThroughputResult {
  bool ran = false;
  double ops_per_second = 0;
  int64_t ops = 0, errors = 0;
  double seconds = 0;
  double server_cpu_percent = 0, client_cpu_percent = 0;
  std::string first_error;
};

struct BarrierResult {
  bool ran = false;
  double median_ms = 0, min_ms = 0, max_ms = 0;
  // Of the median run: until the last Add was answered, and server CPU.
  double arrive_ms = 0, server_cpu_ms = 0, client_cpu_ms = 0;
  int64_t repeats = 0, errors = 0;
  std::string first_error;
};

struct ConnectionsResult {
  bool ran = false;
  int64_t requested = 0, opened = 0, connect_errors = 0, add_errors = 0;
  int64_t final_count = 0;
  double open_seconds = 0, add_seconds = 0;
  int64_t rss_before = 0, rss_held = 0;
  std::string first_error;
  int64_t errors() const { return connect_errors + add_errors; }
};

// Keeps the first error message seen by several threads.
class ErrorSink {
 public:
  void Record(const absl::Status& s) {
    errors_.fetch_add(1);
    absl::MutexLock lock(&mu_);
    if (first_.empty()) first_ = s.ToString();
  }
  int64_t count() const { return errors_.load(); }
  std::string first() {
    absl::MutexLock lock(&mu_);
    return first_;
  }

 private:
  std::atomic<int64_t> errors_{0};
  absl::Mutex mu_;
  std::string first_ ABSL_GUARDED_BY(mu_);
};

double Percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  size_t i = static_cast<size_t>(q * static_cast<double>(sorted.size()));
  return sorted[std::min(i, sorted.size() - 1)];
}

// ---------------------------------------------------------------------------
// Workload: per-op latency from one client.

// One client timing one op against one target. The calls are numbered
// 0..total-1 and may be run in several chunks, so that the targets can take
// turns (conditions on a shared 2-core machine drift; interleaving gives
// both systems the same ones).
class LatencyProbe {
 public:
  LatencyProbe(const Target& target, const std::string& op, int64_t warmup, int64_t iterations,
               const std::string& value)
      : target_(target), op_(op), warmup_(warmup), value_(value), prefix_("lat/" + op + "/") {
    r_.ran = true;
    us_.reserve(iterations);
    auto conn = target.Connect();
    if (!conn.ok()) {
      Fail(conn.status());
      return;
    }
    s_ = std::move(*conn);
    const int64_t total = warmup + iterations;
    if (op == "get" || op == "check" || op == "wait") {
      Check(s_->Set(prefix_ + "k", value));
    } else if (op == "compare_set") {
      Check(s_->Set(prefix_ + "k", "0"));
    } else if (op == "delete_key") {
      for (int64_t i = 0; i < total; ++i) {
        keys_.push_back(absl::StrCat(prefix_, i));
        Check(s_->Set(keys_.back(), value));
      }
    } else if (op != "set" && op != "add" && op != "num_keys") {
      Fail(absl::InvalidArgumentError(absl::StrCat("unknown op ", op)));
      s_.reset();
      return;
    }
    // The set-up writes have no reply: make sure the server has done them.
    Check(s_->NumKeys().status());
  }

  // Runs calls [from, to); those past the warm-up are timed.
  void Run(int64_t from, int64_t to) {
    if (s_ == nullptr) return;
    const double cpu0 = CpuSeconds(target_.pid());
    for (int64_t i = from; i < to; ++i) {
      Clock::time_point t0 = Clock::now();
      absl::Status st = Call(i);
      double elapsed = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
      if (!st.ok()) {
        Fail(st);
        continue;
      }
      if (i >= warmup_) us_.push_back(elapsed);
    }
    server_cpu_s_ += CpuSeconds(target_.pid()) - cpu0;
    calls_ += to - from;
  }

  LatencyResult Finish() {
    std::sort(us_.begin(), us_.end());
    r_.samples = static_cast<int64_t>(us_.size());
    r_.p50_us = Percentile(us_, 0.50);
    r_.p99_us = Percentile(us_, 0.99);
    double sum = 0;
    for (double u : us_) sum += u;
    r_.mean_us = us_.empty() ? 0 : sum / static_cast<double>(us_.size());
    r_.server_cpu_us = calls_ > 0 ? server_cpu_s_ * 1e6 / static_cast<double>(calls_) : 0;
    return r_;
  }

 private:
  void Fail(const absl::Status& st) {
    if (++r_.errors == 1) r_.first_error = st.ToString();
  }
  void Check(const absl::Status& st) {
    if (!st.ok()) Fail(st);
  }

  absl::Status Call(int64_t i) {
    TcpStore& s = *s_;
    const std::string key = prefix_ + "k";
    if (op_ == "set") return s.Set(key, value_);
    if (op_ == "get") {
      auto v = s.Get(key);
      if (!v.ok()) return v.status();
      if (*v != value_) return absl::DataLossError("get returned a different value");
      return absl::OkStatus();
    }
    if (op_ == "add") {
      auto v = s.Add(key, 1);
      if (!v.ok()) return v.status();
      if (*v != ++counter_) return absl::DataLossError(absl::StrCat("add returned ", *v));
      return absl::OkStatus();
    }
    if (op_ == "compare_set") {
      std::string expected = cas_ ? "1" : "0";
      std::string desired = cas_ ? "0" : "1";
      auto v = s.CompareSet(key, expected, desired);
      if (!v.ok()) return v.status();
      if (*v != desired) return absl::DataLossError(absl::StrCat("compare_set returned ", *v));
      cas_ = !cas_;
      return absl::OkStatus();
    }
    if (op_ == "check") {
      auto v = s.Check({key});
      if (!v.ok()) return v.status();
      if (!*v) return absl::DataLossError("check: existing key reported missing");
      return absl::OkStatus();
    }
    if (op_ == "wait") return s.Wait({key});
    if (op_ == "delete_key") {
      auto v = s.DeleteKey(keys_[i]);
      if (!v.ok()) return v.status();
      if (!*v) return absl::DataLossError("delete_key: existing key reported missing");
      return absl::OkStatus();
    }
    return s.NumKeys().status();  // num_keys
  }

  const Target& target_;
  const std::string op_;
  const int64_t warmup_;
  const std::string value_;
  const std::string prefix_;
  std::unique_ptr<TcpStore> s_;
  std::vector<std::string> keys_;
  std::vector<double> us_;
  int64_t counter_ = 0;
  bool cas_ = false;
  double server_cpu_s_ = 0;
  int64_t calls_ = 0;
  LatencyResult r_;
};

// Times `op` on every target: warm-up on each, then `rounds` chunks of the
// timed calls, the targets taking turns.
std::vector<LatencyResult> MeasureLatency(const std::vector<const Target*>& targets,
                                          const std::string& op, int64_t warmup, int64_t iterations,
                                          int64_t rounds, const std::string& value) {
  std::vector<std::unique_ptr<LatencyProbe>> probes;
  for (const Target* t : targets) {
    probes.push_back(std::make_unique<LatencyProbe>(*t, op, warmup, iterations, value));
  }
  for (auto& p : probes) p->Run(0, warmup);
  rounds = std::max<int64_t>(1, std::min(rounds, iterations));
  for (int64_t r = 0; r < rounds; ++r) {
    int64_t from = warmup + iterations * r / rounds;
    int64_t to = warmup + iterations * (r + 1) / rounds;
    for (auto& p : probes) p->Run(from, to);
  }
  std::vector<LatencyResult> results;
  for (auto& p : probes) results.push_back(p->Finish());
  return results;
}

// ---------------------------------------------------------------------------
// Workload: set+get throughput, one thread and connection per client.

ThroughputResult MeasureThroughput(const Target& target, int64_t clients, double duration_s,
                                   const std::string& value) {
  ThroughputResult r;
  r.ran = true;
  ErrorSink errors;
  std::vector<std::unique_ptr<TcpStore>> stores;
  std::vector<std::vector<std::string>> keys(clients);
  for (int64_t c = 0; c < clients; ++c) {
    auto conn = target.Connect();
    if (!conn.ok()) {
      errors.Record(conn.status());
      break;
    }
    for (int k = 0; k < 16; ++k) keys[c].push_back(absl::StrCat("tp/", clients, "/", c, "/", k));
    // Warm the connection (and create the keys) before the clock starts.
    if (auto st = (*conn)->Set(keys[c][0], value); !st.ok()) errors.Record(st);
    if (auto v = (*conn)->Get(keys[c][0]); !v.ok()) errors.Record(v.status());
    stores.push_back(std::move(*conn));
  }
  if (static_cast<int64_t>(stores.size()) < clients) {
    r.errors = errors.count();
    r.first_error = errors.first();
    return r;
  }
  StartGate go;
  Clock::time_point start;
  std::atomic<int64_t> pairs{0};
  std::vector<std::thread> threads;
  for (int64_t c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      TcpStore& s = *stores[c];
      go.Wait();
      const Clock::time_point end = start + std::chrono::duration_cast<Clock::duration>(
                                                std::chrono::duration<double>(duration_s));
      int64_t done = 0;
      for (size_t i = 0; Clock::now() < end; ++i) {
        const std::string& key = keys[c][i % keys[c].size()];
        absl::Status st = s.Set(key, value);
        if (st.ok()) {
          auto v = s.Get(key);
          st = v.ok() ? (v->size() == value.size() ? absl::OkStatus()
                                                   : absl::DataLossError("get: wrong value size"))
                      : v.status();
        }
        if (!st.ok()) {
          errors.Record(st);
          continue;
        }
        if (Clock::now() <= end) ++done;
      }
      pairs.fetch_add(done);
    });
  }
  double server_cpu0 = CpuSeconds(target.pid());
  double client_cpu0 = SelfCpuSeconds();
  start = Clock::now();
  go.Open();
  for (auto& t : threads) t.join();
  double server_cpu = CpuSeconds(target.pid()) - server_cpu0;
  double client_cpu = SelfCpuSeconds() - client_cpu0;
  r.seconds = duration_s;
  r.ops = 2 * pairs.load();
  r.ops_per_second = static_cast<double>(r.ops) / duration_s;
  r.server_cpu_percent = 100 * server_cpu / duration_s;
  r.client_cpu_percent = 100 * client_cpu / duration_s;
  r.errors = errors.count();
  r.first_error = errors.first();
  return r;
}

// ---------------------------------------------------------------------------
// Workload: rendezvous barrier of N clients.

struct BarrierRun {
  double total_ms = 0;   // start signal -> last client released
  double arrive_ms = 0;  // start signal -> the last arrival's Add answered
  double server_cpu_ms = 0;
  double client_cpu_ms = 0;  // this process (the N client threads)
};

// One run, or an error.
absl::StatusOr<BarrierRun> RunBarrierOnce(const Target& target, int64_t n, const std::string& tag,
                                          ErrorSink* errors) {
  std::vector<std::unique_ptr<TcpStore>> stores;
  stores.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    auto conn = target.Connect(absl::Seconds(60));
    if (!conn.ok()) return conn.status();
    stores.push_back(std::move(*conn));
  }
  const std::string counter = absl::StrCat("barrier/", tag);
  const std::string release = absl::StrCat("release/", tag);
  // Connections are ready on the server side too (torch has no handshake).
  for (auto& s : stores) {
    if (auto c = s->Check({release}); !c.ok()) return c.status();
  }
  StartGate go;
  std::vector<Clock::time_point> released(n);
  Clock::time_point last_arrival;
  std::atomic<int64_t> failed{0};
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      TcpStore& s = *stores[i];
      go.Wait();
      auto arrived = s.Add(counter, 1);
      absl::Status st = arrived.status();
      if (arrived.ok()) {
        if (*arrived == n) {
          last_arrival = Clock::now();
          st = s.Set(release, "1");
        } else {
          st = s.Get(release).status();
        }
      }
      released[i] = Clock::now();
      if (!st.ok()) {
        failed.fetch_add(1);
        errors->Record(st);
      }
    });
  }
  // Let every thread reach the gate before the clock starts.
  std::this_thread::sleep_for(std::chrono::milliseconds(n >= 256 ? 300 : 50));
  double server_cpu0 = CpuSeconds(target.pid());
  double client_cpu0 = SelfCpuSeconds();
  Clock::time_point start = Clock::now();
  go.Open();
  for (auto& t : threads) t.join();
  BarrierRun run;
  run.server_cpu_ms = (CpuSeconds(target.pid()) - server_cpu0) * 1000;
  run.client_cpu_ms = (SelfCpuSeconds() - client_cpu0) * 1000;
  if (failed.load() > 0) {
    return absl::InternalError(absl::StrCat(failed.load(), " of ", n, " clients failed"));
  }
  Clock::time_point last = *std::max_element(released.begin(), released.end());
  run.total_ms = std::chrono::duration<double, std::milli>(last - start).count();
  run.arrive_ms = std::chrono::duration<double, std::milli>(last_arrival - start).count();
  return run;
}

// Runs the barrier `repeats` times on every target, the targets taking turns.
std::vector<BarrierResult> MeasureBarrier(const std::vector<const Target*>& targets, int64_t n,
                                          int64_t repeats) {
  std::vector<ErrorSink> errors(targets.size());
  std::vector<std::vector<BarrierRun>> runs(targets.size());
  for (int64_t rep = 0; rep < repeats; ++rep) {
    for (size_t t = 0; t < targets.size(); ++t) {
      auto s = RunBarrierOnce(*targets[t], n, absl::StrCat(n, "/", rep), &errors[t]);
      if (!s.ok()) {
        if (errors[t].count() == 0) errors[t].Record(s.status());
        continue;
      }
      runs[t].push_back(*s);
    }
  }
  std::vector<BarrierResult> results(targets.size());
  for (size_t t = 0; t < targets.size(); ++t) {
    BarrierResult& r = results[t];
    r.ran = true;
    std::sort(runs[t].begin(), runs[t].end(),
              [](const BarrierRun& a, const BarrierRun& b) { return a.total_ms < b.total_ms; });
    r.repeats = static_cast<int64_t>(runs[t].size());
    if (!runs[t].empty()) {
      const BarrierRun& median = runs[t][runs[t].size() / 2];
      r.median_ms = median.total_ms;
      r.arrive_ms = median.arrive_ms;
      r.server_cpu_ms = median.server_cpu_ms;
      r.client_cpu_ms = median.client_cpu_ms;
      r.min_ms = runs[t].front().total_ms;
      r.max_ms = runs[t].back().total_ms;
    }
    r.errors = errors[t].count();
    r.first_error = errors[t].first();
  }
  return results;
}

// ---------------------------------------------------------------------------
// Workload: N simultaneous connections, one ADD on each.

ConnectionsResult MeasureConnections(const Target& target, int64_t n) {
  ConnectionsResult r;
  r.ran = true;
  r.requested = n;
  ErrorSink errors;
  r.rss_before = RssBytes(target.pid());
  std::vector<std::unique_ptr<TcpStore>> stores(n);
  constexpr int kOpeners = 16;
  Clock::time_point start = Clock::now();
  {
    std::vector<std::thread> openers;
    for (int t = 0; t < kOpeners; ++t) {
      openers.emplace_back([&, t] {
        for (int64_t i = t; i < n; i += kOpeners) {
          auto conn = target.Connect(absl::Seconds(60), absl::Seconds(20));
          if (!conn.ok()) {
            errors.Record(conn.status());
            continue;
          }
          stores[i] = std::move(*conn);
        }
      });
    }
    for (auto& t : openers) t.join();
  }
  r.open_seconds = SecondsSince(start);
  r.connect_errors = errors.count();
  ErrorSink add_errors;
  start = Clock::now();
  const std::string key = absl::StrCat("conns/", n);
  for (auto& s : stores) {
    if (s == nullptr) continue;
    ++r.opened;
    auto v = s->Add(key, 1);
    if (!v.ok()) {
      add_errors.Record(v.status());
      continue;
    }
    r.final_count = std::max(r.final_count, *v);
  }
  r.add_seconds = SecondsSince(start);
  r.add_errors = add_errors.count();
  r.rss_held = RssBytes(target.pid());
  r.first_error = errors.first();
  if (r.first_error.empty()) r.first_error = add_errors.first();
  if (r.final_count != r.opened - r.add_errors && r.first_error.empty()) {
    r.first_error =
        absl::StrCat("counter ended at ", r.final_count, ", expected ", r.opened - r.add_errors);
    ++r.add_errors;
  }
  return r;
}

// ---------------------------------------------------------------------------
// Reporting.

// Ratio oriented so that > 1 means musterd is better; nullopt when undefined.
std::optional<double> Better(double musterd, double torch, bool higher_is_better) {
  double num = higher_is_better ? musterd : torch;
  double den = higher_is_better ? torch : musterd;
  if (!(den > 0) || !(num > 0)) return std::nullopt;
  return num / den;
}

std::string RatioText(std::optional<double> r) {
  return r ? absl::StrFormat("%.2fx", *r) : std::string("-");
}

void JsonRatio(JsonWriter& w, const std::string& key, std::optional<double> r) {
  if (r) w.Key(key).Double(*r);
}

void PrintLine(const std::string& line) {
  std::fputs(line.c_str(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

std::string Today() {
  std::time_t now = std::time(nullptr);
  char buf[64];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S %Z", std::localtime(&now));
  return buf;
}

std::string LoadAverage() {
  std::string s = ReadFile("/proc/loadavg");
  std::vector<std::string> parts = absl::StrSplit(s, ' ');
  if (parts.size() < 3) return "?";
  return absl::StrCat(parts[0], " ", parts[1], " ", parts[2]);
}

std::string Kernel() {
  utsname u{};
  if (::uname(&u) != 0) return "?";
  return absl::StrCat(u.sysname, " ", u.release, " ", u.machine);
}

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2);
    }
  }
  return "?";
}

std::string Shorten(const std::string& s, size_t n = 160) {
  std::string one = absl::StrReplaceAll(s, {{"\n", " "}});
  return one.size() <= n ? one : one.substr(0, n) + "...";
}

class Report {
 public:
  explicit Report(bool json, bool torch) : json_(json), torch_(torch) {}

  void Meta(const StoreBenchOptions& o, const std::string& musterd) {
    if (json_) {
      JsonWriter w;
      w.BeginObject()
          .Key("type")
          .String("meta")
          .Key("command")
          .String(o.command_line)
          .Key("date")
          .String(Today())
          .Key("nproc")
          .Int(std::thread::hardware_concurrency())
          .Key("cpu")
          .String(CpuModel())
          .Key("kernel")
          .String(Kernel())
          .Key("loadavg_start")
          .String(LoadAverage())
          .Key("musterd")
          .String(musterd)
          .Key("torch")
          .Bool(torch_)
          .EndObject();
      PrintLine(w.str());
      return;
    }
    PrintLine(absl::StrCat("muster-bench store: ", o.command_line));
    PrintLine(absl::StrCat("date ", Today(), "; ", std::thread::hardware_concurrency(), " cpus (",
                           CpuModel(), "); ", Kernel(), "; load ", LoadAverage()));
    PrintLine(absl::StrCat("musterd: ", musterd, " (native protocol); ",
                           torch_ ? "torch: PyTorch 1.13 TCPStore master (kTorch113 protocol)"
                                  : "torch: not run (--no-torch)"));
    PrintLine("ratio: oriented so that > 1 means musterd is better");
  }

  void LatencyHeader(int64_t iterations, int64_t warmup, const std::string& placement) {
    if (json_) {
      JsonWriter w;
      w.BeginObject()
          .Key("type")
          .String("latency_setup")
          .Key("iterations")
          .Int(iterations)
          .Key("warmup")
          .Int(warmup)
          .Key("placement")
          .String(placement)
          .EndObject();
      PrintLine(w.str());
      return;
    }
    PrintLine("");
    PrintLine(absl::StrFormat(
        "latency, one client (us; %d timed calls after %d warm-up; set has no reply; srv cpu = "
        "server CPU us per call)",
        iterations, warmup));
    PrintLine(absl::StrCat("placement: ", placement, "; the two systems take turns in 10 chunks"));
    PrintLine(absl::StrFormat("%-12s %11s %8s %7s | %11s %8s %7s | %9s %9s %s", "op", "musterd p50",
                              "p99", "srv cpu", "torch p50", "p99", "srv cpu", "ratio p50",
                              "ratio p99", "errors m/t"));
  }

  void Latency(const std::string& op, const LatencyResult& m, const LatencyResult& t) {
    auto r50 = t.ran ? Better(m.p50_us, t.p50_us, false) : std::nullopt;
    auto r99 = t.ran ? Better(m.p99_us, t.p99_us, false) : std::nullopt;
    if (json_) {
      JsonWriter w;
      w.BeginObject().Key("type").String("latency").Key("op").String(op);
      Side(w, "musterd", m);
      if (t.ran) Side(w, "torch", t);
      JsonRatio(w, "ratio_p50", r50);
      JsonRatio(w, "ratio_p99", r99);
      w.EndObject();
      PrintLine(w.str());
      return;
    }
    PrintLine(
        absl::StrFormat("%-12s %11.1f %8.1f %7.1f | %11s %8s %7s | %9s %9s %d/%s", op, m.p50_us,
                        m.p99_us, m.server_cpu_us, t.ran ? absl::StrFormat("%.1f", t.p50_us) : "-",
                        t.ran ? absl::StrFormat("%.1f", t.p99_us) : "-",
                        t.ran ? absl::StrFormat("%.1f", t.server_cpu_us) : "-", RatioText(r50),
                        RatioText(r99), m.errors, t.ran ? absl::StrCat(t.errors) : "-"));
    Errors(m, t);
  }

  void ThroughputHeader(double duration, int64_t value_bytes) {
    if (json_) return;
    PrintLine("");
    PrintLine(absl::StrFormat(
        "throughput, set+get (ops/s, each set and each get counts; %d-byte values; %.1f s per "
        "row; one thread + connection per client; cpu%% = server / benchmark process)",
        value_bytes, duration));
    PrintLine(absl::StrFormat("%-8s %14s %11s | %14s %11s | %7s %s", "clients", "musterd ops/s",
                              "cpu%", "torch ops/s", "cpu%", "ratio", "errors m/t"));
  }

  void Throughput(int64_t clients, const ThroughputResult& m, const ThroughputResult& t) {
    auto ratio = t.ran ? Better(m.ops_per_second, t.ops_per_second, true) : std::nullopt;
    if (json_) {
      JsonWriter w;
      w.BeginObject().Key("type").String("throughput").Key("clients").Int(clients);
      Side(w, "musterd", m);
      if (t.ran) Side(w, "torch", t);
      JsonRatio(w, "ratio", ratio);
      w.EndObject();
      PrintLine(w.str());
      return;
    }
    auto cpu = [](const ThroughputResult& x) {
      return absl::StrFormat("%.0f/%.0f", x.server_cpu_percent, x.client_cpu_percent);
    };
    PrintLine(absl::StrFormat("%-8d %14.0f %11s | %14s %11s | %7s %d/%s", clients, m.ops_per_second,
                              cpu(m), t.ran ? absl::StrFormat("%.0f", t.ops_per_second) : "-",
                              t.ran ? cpu(t) : "-", RatioText(ratio), m.errors,
                              t.ran ? absl::StrCat(t.errors) : "-"));
    Errors(m, t);
  }

  void BarrierHeader(int64_t repeats) {
    if (json_) return;
    PrintLine("");
    PrintLine(absl::StrFormat(
        "barrier: N clients Add(counter), last one sets 'release', the rest Get it (ms from start "
        "until all released: median of %d [min..max]; then, of the median run, ms until the last "
        "Add was answered, and CPU ms of the server / of the benchmark's client threads)",
        repeats));
    PrintLine(absl::StrFormat("%-6s %38s | %38s | %7s %s", "N",
                              "musterd ms [min..max] arrive cpu s/c",
                              "torch ms [min..max] arrive cpu s/c", "ratio", "errors m/t"));
  }

  void Barrier(int64_t n, const BarrierResult& m, const BarrierResult& t) {
    auto ratio = t.ran ? Better(m.median_ms, t.median_ms, false) : std::nullopt;
    if (m.repeats == 0 || (t.ran && t.repeats == 0)) ratio = std::nullopt;
    if (json_) {
      JsonWriter w;
      w.BeginObject().Key("type").String("barrier").Key("n").Int(n);
      Side(w, "musterd", m);
      if (t.ran) Side(w, "torch", t);
      JsonRatio(w, "ratio", ratio);
      w.EndObject();
      PrintLine(w.str());
      return;
    }
    auto cell = [](const BarrierResult& x) {
      if (x.repeats == 0) return std::string("failed");
      return absl::StrFormat("%.1f [%.1f..%.1f] %.1f %.0f/%.0f", x.median_ms, x.min_ms, x.max_ms,
                             x.arrive_ms, x.server_cpu_ms, x.client_cpu_ms);
    };
    PrintLine(absl::StrFormat("%-6d %38s | %38s | %7s %d/%s", n, cell(m), t.ran ? cell(t) : "-",
                              RatioText(ratio), m.errors, t.ran ? absl::StrCat(t.errors) : "-"));
    Errors(m, t);
  }

  void Connections(const ConnectionsResult& m, const ConnectionsResult& t) {
    auto ratio = t.ran
                     ? Better(m.open_seconds + m.add_seconds, t.open_seconds + t.add_seconds, false)
                     : std::nullopt;
    if (json_) {
      JsonWriter w;
      w.BeginObject().Key("type").String("connections").Key("n").Int(m.requested);
      Side(w, "musterd", m);
      if (t.ran) Side(w, "torch", t);
      JsonRatio(w, "ratio_time", ratio);
      w.EndObject();
      PrintLine(w.str());
      return;
    }
    PrintLine("");
    PrintLine(absl::StrFormat(
        "connections: %d simultaneous clients (opened by 16 threads), one Add on each, held "
        "(ratio = torch/musterd time to open + add)",
        m.requested));
    PrintLine(absl::StrFormat("%-8s %7s %7s %9s %8s %8s %11s %12s", "system", "opened", "errors",
                              "open s", "add s", "counter", "server RSS", "RSS/conn"));
    auto row = [](const char* name, const ConnectionsResult& x) {
      double per = x.opened > 0 ? static_cast<double>(x.rss_held - x.rss_before) /
                                      static_cast<double>(x.opened) / 1024
                                : 0;
      PrintLine(absl::StrFormat("%-8s %7d %7d %9.3f %8.3f %8d %8.1f MB %9.1f KB", name, x.opened,
                                x.errors(), x.open_seconds, x.add_seconds, x.final_count,
                                static_cast<double>(x.rss_held) / (1 << 20), per));
    };
    row("musterd", m);
    if (t.ran) row("torch", t);
    PrintLine(absl::StrCat("ratio   ", RatioText(ratio)));
    if (!m.first_error.empty())
      PrintLine(absl::StrCat("  musterd error: ", Shorten(m.first_error)));
    if (t.ran && !t.first_error.empty()) {
      PrintLine(absl::StrCat("  torch error: ", Shorten(t.first_error)));
    }
  }

  struct Target {
    std::string name;
    std::string goal;
    bool measured = false;
    bool met = false;
    std::string figure;
  };
  void Targets(const std::vector<Target>& targets) {
    if (!json_) {
      PrintLine("");
      PrintLine("targets");
    }
    for (const Target& t : targets) {
      if (json_) {
        JsonWriter w;
        w.BeginObject()
            .Key("type")
            .String("target")
            .Key("name")
            .String(t.name)
            .Key("goal")
            .String(t.goal)
            .Key("measured")
            .Bool(t.measured);
        if (t.measured) w.Key("met").Bool(t.met);
        w.Key("figure").String(t.figure).EndObject();
        PrintLine(w.str());
      } else {
        std::string figure =
            t.measured ? t.figure : "not measured (needs the torch run and that size)";
        PrintLine(absl::StrFormat("%-8s %-52s %s", t.measured ? (t.met ? "MET" : "MISSED") : "n/a",
                                  t.goal, figure));
      }
    }
  }

  void Done(double seconds, int exit_code) {
    if (json_) {
      JsonWriter w;
      w.BeginObject()
          .Key("type")
          .String("done")
          .Key("seconds")
          .Double(seconds)
          .Key("loadavg_end")
          .String(LoadAverage())
          .Key("ok")
          .Bool(exit_code == 0)
          .EndObject();
      PrintLine(w.str());
      return;
    }
    PrintLine("");
    PrintLine(absl::StrFormat("done in %.1f s; load %s; %s", seconds, LoadAverage(),
                              exit_code == 0 ? "ok" : "FAILED (musterd errors, see above)"));
  }

 private:
  template <typename R>
  void Errors(const R& m, const R& t) {
    if (!m.first_error.empty())
      PrintLine(absl::StrCat("  musterd error: ", Shorten(m.first_error)));
    if (t.ran && !t.first_error.empty()) {
      PrintLine(absl::StrCat("  torch error: ", Shorten(t.first_error)));
    }
  }

  static void Side(JsonWriter& w, const std::string& name, const LatencyResult& r) {
    w.Key(name)
        .BeginObject()
        .Key("p50_us")
        .Double(r.p50_us)
        .Key("p99_us")
        .Double(r.p99_us)
        .Key("mean_us")
        .Double(r.mean_us)
        .Key("server_cpu_us_per_call")
        .Double(r.server_cpu_us)
        .Key("samples")
        .Int(r.samples)
        .Key("errors")
        .Int(r.errors);
    if (!r.first_error.empty()) w.Key("error").String(r.first_error);
    w.EndObject();
  }
  static void Side(JsonWriter& w, const std::string& name, const ThroughputResult& r) {
    w.Key(name)
        .BeginObject()
        .Key("ops_per_second")
        .Double(r.ops_per_second)
        .Key("ops")
        .Int(r.ops)
        .Key("seconds")
        .Double(r.seconds)
        .Key("server_cpu_percent")
        .Double(r.server_cpu_percent)
        .Key("client_cpu_percent")
        .Double(r.client_cpu_percent)
        .Key("errors")
        .Int(r.errors);
    if (!r.first_error.empty()) w.Key("error").String(r.first_error);
    w.EndObject();
  }
  static void Side(JsonWriter& w, const std::string& name, const BarrierResult& r) {
    w.Key(name)
        .BeginObject()
        .Key("median_ms")
        .Double(r.median_ms)
        .Key("min_ms")
        .Double(r.min_ms)
        .Key("max_ms")
        .Double(r.max_ms)
        .Key("arrive_ms")
        .Double(r.arrive_ms)
        .Key("server_cpu_ms")
        .Double(r.server_cpu_ms)
        .Key("client_cpu_ms")
        .Double(r.client_cpu_ms)
        .Key("repeats")
        .Int(r.repeats)
        .Key("errors")
        .Int(r.errors);
    if (!r.first_error.empty()) w.Key("error").String(r.first_error);
    w.EndObject();
  }
  static void Side(JsonWriter& w, const std::string& name, const ConnectionsResult& r) {
    w.Key(name)
        .BeginObject()
        .Key("opened")
        .Int(r.opened)
        .Key("connect_errors")
        .Int(r.connect_errors)
        .Key("add_errors")
        .Int(r.add_errors)
        .Key("counter")
        .Int(r.final_count)
        .Key("open_seconds")
        .Double(r.open_seconds)
        .Key("add_seconds")
        .Double(r.add_seconds)
        .Key("server_rss_before_bytes")
        .Int(r.rss_before)
        .Key("server_rss_held_bytes")
        .Int(r.rss_held);
    if (!r.first_error.empty()) w.Key("error").String(r.first_error);
    w.EndObject();
  }

  bool json_;
  bool torch_;
};

// Interrupted (Ctrl-C, SIGTERM): kill the servers and remove the scratch
// directory, using only async-signal-safe calls.
volatile pid_t g_children[2] = {0, 0};
char g_dir[128] = {0};

void OnStopSignal(int sig) {
  for (volatile pid_t& pid : g_children) {
    if (pid > 0) ::kill(pid, SIGKILL);
  }
  if (g_dir[0] != 0) {
    for (const char* name :
         {"/ready.json", "/s.sock", "/s.sock.lock", "/musterd.log", "/torch.log"}) {
      char path[sizeof(g_dir) + 16];
      size_t n = 0;
      for (const char* p = g_dir; *p != 0 && n + 1 < sizeof(path); ++p) path[n++] = *p;
      for (const char* p = name; *p != 0 && n + 1 < sizeof(path); ++p) path[n++] = *p;
      path[n] = 0;
      ::unlink(path);
    }
    ::rmdir(g_dir);
  }
  ::_exit(128 + sig);
}

void RaiseFileLimit() {
  rlimit limit;
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &limit);
  }
}

bool IsExecutable(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

}  // namespace

const std::vector<std::string>& AllLatencyOps() {
  static const auto* ops = new std::vector<std::string>{
      "set", "get", "add", "compare_set", "check", "wait", "delete_key", "num_keys"};
  return *ops;
}

std::string FindMusterd(const std::string& flag, const char* argv0) {
  if (!flag.empty()) return flag;
  std::vector<std::string> candidates;
  for (const char* env : {"RUNFILES_DIR", "TEST_SRCDIR"}) {
    if (const char* dir = std::getenv(env))
      candidates.push_back(absl::StrCat(dir, "/muster/daemon/musterd"));
  }
  if (argv0 != nullptr)
    candidates.push_back(absl::StrCat(argv0, ".runfiles/muster/daemon/musterd"));
  std::error_code ec;
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    // bazel-bin/tools/muster-bench -> bazel-bin/daemon/musterd
    candidates.push_back((self.parent_path().parent_path() / "daemon" / "musterd").string());
    candidates.push_back((self.parent_path() / "musterd").string());
  }
  for (const std::string& c : candidates) {
    if (IsExecutable(c)) return c;
  }
  return "";
}

int RunStoreBenchWithTorchClients(const std::string& musterd, const std::string& python,
                                  const std::string& clients, double duration_seconds,
                                  int64_t value_bytes, bool json, const char* argv0) {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("MUSTER_BENCH_STORE_TORCH")) candidates.push_back(env);
  for (const char* env : {"RUNFILES_DIR", "TEST_SRCDIR"}) {
    if (const char* dir = std::getenv(env)) {
      candidates.push_back(absl::StrCat(dir, "/muster/tools/bench_store_torch.py"));
    }
  }
  if (argv0 != nullptr) {
    candidates.push_back(absl::StrCat(argv0, ".runfiles/muster/tools/bench_store_torch.py"));
  }
  std::string script;
  for (const std::string& c : candidates) {
    if (::access(c.c_str(), R_OK) == 0) {
      script = c;
      break;
    }
  }
  if (script.empty() || musterd.empty()) {
    std::fprintf(stderr, "muster-bench: cannot find %s (set %s)\n",
                 script.empty() ? "tools/bench_store_torch.py" : "musterd",
                 script.empty() ? "$MUSTER_BENCH_STORE_TORCH" : "--musterd");
    return 127;
  }
  std::vector<std::string> args = {"/usr/bin/python3", script,
                                   "--musterd",        musterd,
                                   "--python",         python,
                                   "--clients",        clients,
                                   "--duration",       absl::StrCat(duration_seconds),
                                   "--value-bytes",    absl::StrCat(value_bytes)};
  if (json) args.push_back("--json");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  ::execv(argv[0], argv.data());
  std::fprintf(stderr, "muster-bench: cannot run %s: %s\n", argv[0], std::strerror(errno));
  return 127;
}

// Latency calls are run in this many chunks, musterd and torch alternating.
constexpr int64_t kLatencyRounds = 10;

int RunStoreBench(const StoreBenchOptions& o) {
  Clock::time_point begin = Clock::now();
  RaiseFileLimit();
  ::signal(SIGPIPE, SIG_IGN);
  if (o.musterd_path.empty() || !IsExecutable(o.musterd_path)) {
    std::fprintf(stderr,
                 "muster-bench: musterd not found%s; build it (bazel build //daemon:musterd) or "
                 "pass --musterd PATH\n",
                 o.musterd_path.empty() ? "" : absl::StrCat(" at ", o.musterd_path).c_str());
    return 1;
  }
  char tmpl[] = "/tmp/muster-bench-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) {
    std::fprintf(stderr, "muster-bench: mkdtemp: %s\n", strerror(errno));
    return 1;
  }
  const std::string dir = tmpl;
  std::snprintf(g_dir, sizeof(g_dir), "%s", tmpl);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::signal(sig, OnStopSignal);
  struct DirCleanup {
    std::string dir;
    ~DirCleanup() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } cleanup{dir};

  Progress(absl::StrCat("starting musterd (", o.musterd_path, ")"));
  auto musterd = StartMusterd(o.musterd_path, dir, o.server_start_timeout_seconds);
  if (!musterd.ok()) {
    std::fprintf(stderr, "muster-bench: %s\n", std::string(musterd.status().message()).c_str());
    return 1;
  }
  g_children[0] = (*musterd)->pid();
  std::unique_ptr<Target> torch;
  if (o.torch) {
    Progress(absl::StrCat("starting a PyTorch 1.13 TCPStore master (", o.python_path, ")"));
    auto t = StartTorch(o.python_path, dir, o.server_start_timeout_seconds);
    if (!t.ok()) {
      std::fprintf(stderr, "muster-bench: %s\n(use --no-torch to benchmark musterd alone)\n",
                   std::string(t.status().message()).c_str());
      return 1;
    }
    torch = std::move(*t);
    g_children[1] = torch->pid();
  }
  std::vector<const Target*> targets = {musterd->get()};
  if (torch) targets.push_back(torch.get());

  Report report(o.json, torch != nullptr);
  report.Meta(o, o.musterd_path);
  bool musterd_failed = false;
  const std::string value(static_cast<size_t>(std::max<int64_t>(o.value_bytes, 0)), 'v');

  std::map<std::string, LatencyResult> latency[2];
  std::map<int64_t, ThroughputResult> throughput[2];
  std::map<int64_t, BarrierResult> barrier[2];
  ConnectionsResult connections[2];

  if (!o.ops.empty()) {
    // Pin for the latency workload only; undone before the next workload
    // (threads created later inherit the main thread's affinity).
    cpu_set_t all;
    CPU_ZERO(&all);
    ::sched_getaffinity(0, sizeof(all), &all);
    std::vector<int> cpus;
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &all)) cpus.push_back(c);
    }
    std::string placement = "none (scheduler's choice)";
    bool pinned = false;
    if (o.latency_pin != "none" && !cpus.empty()) {
      int client_cpu = cpus[0];
      int server_cpu = o.latency_pin == "split" && cpus.size() >= 2 ? cpus[1] : cpus[0];
      for (const Target* t : targets) PinProcess(t->pid(), OneCpu(server_cpu));
      cpu_set_t mine = OneCpu(client_cpu);
      ::sched_setaffinity(0, sizeof(mine), &mine);
      pinned = true;
      placement =
          absl::StrCat("client thread on CPU ", client_cpu, ", server threads on CPU ", server_cpu);
    }
    report.LatencyHeader(o.latency_iterations, o.warmup_iterations, placement);
    for (const std::string& op : o.ops) {
      LatencyResult res[2];
      Progress(absl::StrCat("latency ", op, " on ",
                            targets.size() == 2 ? "musterd and torch" : "musterd", " (",
                            o.warmup_iterations + o.latency_iterations, " calls each)"));
      std::vector<LatencyResult> got = MeasureLatency(targets, op, o.warmup_iterations,
                                                      o.latency_iterations, kLatencyRounds, value);
      for (size_t i = 0; i < got.size(); ++i) {
        res[i] = got[i];
        latency[i][op] = res[i];
      }
      if (res[0].errors > 0) musterd_failed = true;
      report.Latency(op, res[0], res[1]);
    }
    if (pinned) {
      for (const Target* t : targets) PinProcess(t->pid(), all);
      ::sched_setaffinity(0, sizeof(all), &all);
    }
  }
  if (!o.clients.empty()) {
    report.ThroughputHeader(o.duration_seconds, o.value_bytes);
    for (int64_t c : o.clients) {
      ThroughputResult res[2];
      for (size_t i = 0; i < targets.size(); ++i) {
        Progress(absl::StrFormat("throughput with %d clients on %s (%.1f s)", c, targets[i]->name,
                                 o.duration_seconds));
        res[i] = MeasureThroughput(*targets[i], c, o.duration_seconds, value);
        throughput[i][c] = res[i];
      }
      if (res[0].errors > 0) musterd_failed = true;
      report.Throughput(c, res[0], res[1]);
    }
  }
  if (!o.barrier.empty()) {
    report.BarrierHeader(o.barrier_repeats);
    for (int64_t n : o.barrier) {
      BarrierResult res[2];
      Progress(absl::StrFormat("barrier of %d clients on %s (%d runs each)", n,
                               targets.size() == 2 ? "musterd and torch" : "musterd",
                               o.barrier_repeats));
      std::vector<BarrierResult> got = MeasureBarrier(targets, n, o.barrier_repeats);
      for (size_t i = 0; i < got.size(); ++i) {
        res[i] = got[i];
        barrier[i][n] = res[i];
      }
      if (res[0].errors > 0 || res[0].repeats == 0) musterd_failed = true;
      report.Barrier(n, res[0], res[1]);
    }
  }
  if (o.connections > 0) {
    for (size_t i = 0; i < targets.size(); ++i) {
      Progress(
          absl::StrFormat("%d simultaneous connections to %s", o.connections, targets[i]->name));
      connections[i] = MeasureConnections(*targets[i], o.connections);
    }
    if (connections[0].errors() > 0) musterd_failed = true;
    report.Connections(connections[0], connections[1]);
  }

  // The targets.
  std::vector<Report::Target> goals;
  {
    Report::Target g;
    g.name = "throughput_64";
    g.goal = "throughput at 64 clients >= 2x torch";
    if (torch && throughput[0].count(64) && throughput[1].count(64)) {
      auto r = Better(throughput[0][64].ops_per_second, throughput[1][64].ops_per_second, true);
      g.measured = r.has_value();
      g.met = r && *r >= 2;
      g.figure = absl::StrFormat("%.0f vs %.0f ops/s = %s", throughput[0][64].ops_per_second,
                                 throughput[1][64].ops_per_second, RatioText(r));
    }
    goals.push_back(g);
  }
  {
    Report::Target g;
    g.name = "get_p50";
    g.goal = "get p50 <= 0.5x torch's";
    if (torch && latency[0].count("get") && latency[1].count("get")) {
      double m = latency[0]["get"].p50_us, t = latency[1]["get"].p50_us;
      g.measured = m > 0 && t > 0;
      g.met = g.measured && m <= 0.5 * t;
      g.figure = absl::StrFormat("%.1f vs %.1f us = %.2fx of torch's", m, t, t > 0 ? m / t : 0);
    }
    goals.push_back(g);
  }
  {
    Report::Target g;
    g.name = "barrier_1024";
    g.goal = "1024-client barrier >= 2x faster than torch";
    if (torch && barrier[0].count(1024) && barrier[1].count(1024)) {
      auto r = Better(barrier[0][1024].median_ms, barrier[1][1024].median_ms, false);
      if (barrier[0][1024].repeats == 0 || barrier[1][1024].repeats == 0) r = std::nullopt;
      g.measured = r.has_value();
      g.met = r && *r >= 2;
      g.figure = absl::StrFormat("%.1f vs %.1f ms = %s", barrier[0][1024].median_ms,
                                 barrier[1][1024].median_ms, RatioText(r));
    }
    goals.push_back(g);
  }
  {
    Report::Target g;
    g.name = "connections_4096";
    g.goal = "4096 connections held with no errors (musterd)";
    if (connections[0].ran && connections[0].requested >= 4096) {
      g.measured = true;
      g.met = connections[0].errors() == 0 && connections[0].opened >= 4096;
      g.figure =
          absl::StrFormat("%d opened, %d errors", connections[0].opened, connections[0].errors());
      if (connections[1].ran) {
        absl::StrAppend(&g.figure, absl::StrFormat(" (torch: %d opened, %d errors)",
                                                   connections[1].opened, connections[1].errors()));
      }
    }
    goals.push_back(g);
  }
  report.Targets(goals);

  Progress("stopping the servers");
  if (torch) torch->child->Stop(SIGTERM, 5);
  if (!(*musterd)->child->Stop(SIGTERM, 15)) {
    Progress("musterd did not stop within 15 s of SIGTERM (killed)");
    musterd_failed = true;
  } else if ((*musterd)->child->Describe() != "exited with status 0") {
    Progress(absl::StrCat("musterd ", (*musterd)->child->Describe(), " after SIGTERM"));
    musterd_failed = true;
  }
  int exit_code = musterd_failed ? 1 : 0;
  if (musterd_failed) {
    std::string log = Tail(ReadFile((*musterd)->child->stderr_path()), 3000);
    if (!log.empty()) Progress(absl::StrCat("musterd's log (tail):\n", log));
  }
  report.Done(SecondsSince(begin), exit_code);
  return exit_code;
}

}  // namespace muster::bench
