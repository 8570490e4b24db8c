// muster-bench-etcd: the etcd store backend side by side with the other
// stores, in one run, with the same workloads and the same C++ clients:
//
//   musterd/etcd    musterd --store-backend etcd (native TcpStore clients)
//   musterd/memory  musterd's in-memory store (native TcpStore clients)
//   etcd direct     every client its own EtcdStore with its own connection to
//                   etcd (no musterd, so no node-level aggregation)
//   torch           a PyTorch 1.13 TCPStore master (TcpStore, torch protocol)
//
// It starts a 3-member etcd cluster (tools/etcd_cluster.sh), both musterds
// and the torch master itself and stops them at the end. Workloads: Set and
// Get latency from one client (p50/p99), and a barrier of N clients (each
// Adds a counter; the last one sets "release", the others Get it), the
// median of --repeats runs, wall time from the start signal until every
// client is through. Ratios: etcd-backed musterd vs in-memory musterd and vs
// clients talking to etcd directly.
//
// Not thread-safe: main() runs it once.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/barrier.h"
#include "absl/time/clock.h"
#include "common/flags.h"
#include "daemon/store/etcd/etcd_store.h"
#include "muster/tcp_store.h"

namespace muster {
namespace {

std::string RunfilesPath(const char* argv0, const std::string& rel) {
  std::string self(argv0);
  for (const std::string& base : {self + ".runfiles/muster/", std::string("")}) {
    std::string p = base + rel;
    if (::access(p.c_str(), R_OK) == 0) return p;
  }
  // bazel-bin/tools/muster-bench-etcd -> bazel-bin/<rel>
  size_t slash = self.rfind("/tools/");
  if (slash != std::string::npos) return self.substr(0, slash + 1) + rel;
  return rel;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// What std::exit must still stop: the children and the etcd cluster.
std::vector<pid_t> g_children;
std::string g_stop_cluster;

void StopEverything() {
  for (pid_t pid : g_children) {
    ::kill(pid, SIGTERM);
    ::waitpid(pid, nullptr, 0);
  }
  g_children.clear();
  if (!g_stop_cluster.empty()) (void)std::system(g_stop_cluster.c_str());
  g_stop_cluster.clear();
}

// A child process (setsid, output to a log), stopped at exit
// (StopEverything).
struct Child {
  pid_t pid = -1;
};

std::unique_ptr<Child> Spawn(const std::vector<std::string>& argv, const std::string& log) {
  auto c = std::make_unique<Child>();
  c->pid = ::fork();
  if (c->pid == 0) {
    ::setsid();
    std::FILE* f = std::fopen(log.c_str(), "w");
    if (f != nullptr) {
      ::dup2(::fileno(f), 1);
      ::dup2(::fileno(f), 2);
    }
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  g_children.push_back(c->pid);
  return c;
}

// The store port from a musterd ready file.
int WaitReady(const std::string& ready) {
  for (int i = 0; i < 600; ++i) {
    std::string json = ReadAll(ready);
    size_t at = json.find("\"store_port\":");
    if (at != std::string::npos) return std::atoi(json.c_str() + at + 13);
    absl::SleepFor(absl::Milliseconds(100));
  }
  return -1;
}

using Factory = std::function<std::unique_ptr<Store>()>;

struct Target {
  std::string name;
  Factory open;
};

struct Latency {
  double p50_us = 0, p99_us = 0;
};

Latency Measure(int iterations, const std::function<void(int)>& op) {
  for (int i = 0; i < std::min(iterations / 10, 50); ++i) op(i);
  std::vector<double> us;
  for (int i = 0; i < iterations; ++i) {
    absl::Time t0 = absl::Now();
    op(i);
    us.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
  }
  std::sort(us.begin(), us.end());
  return {us[us.size() / 2], us[std::min(us.size() - 1, us.size() * 99 / 100)]};
}

void Check(const absl::Status& s, const std::string& what) {
  if (!s.ok()) {
    std::fprintf(stderr, "muster-bench-etcd: %s: %s\n", what.c_str(), s.ToString().c_str());
    std::exit(1);
  }
}

// When the clients of one barrier got through its phases, ms from the start.
struct Phases {
  std::vector<double> add_done, get_done;
  double set_done = 0;
};
bool g_phases = false;

double Pct(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))];
}

// The etcd members' own count of the gRPC calls they served (their
// /metrics), summed over members: unary calls by method, and Watch streams
// started. Read before and after a barrier: its etcd round trips.
std::vector<std::string> g_etcd_endpoints;
std::map<std::string, double> EtcdCalls() {
  std::map<std::string, double> calls;
  for (const std::string& ep : g_etcd_endpoints) {
    std::FILE* p = ::popen(absl::StrCat("curl -s -m 2 ", ep, "/metrics").c_str(), "r");
    if (p == nullptr) continue;
    char line[2048];
    while (std::fgets(line, sizeof(line), p) != nullptr) {
      absl::string_view l(line);
      bool handled = absl::StartsWith(l, "grpc_server_handled_total{");
      bool started = absl::StartsWith(l, "grpc_server_started_total{");
      if (!handled && !started) continue;
      size_t m = l.find("grpc_method=\"");
      if (m == absl::string_view::npos) continue;
      m += 13;
      std::string method(l.substr(m, l.find('"', m) - m));
      if (started != (method == "Watch")) continue;  // streams: started; unary: handled
      double v = 0;
      if (absl::SimpleAtod(absl::StripAsciiWhitespace(l.substr(l.rfind(' ') + 1)), &v)) {
        calls[method] += v;
      }
    }
    ::pclose(p);
  }
  return calls;
}

// One barrier of n clients (connected before the clock starts): ms.
double Barrier(const Target& t, int n, const std::string& tag) {
  std::map<std::string, double> calls_before;
  if (g_phases) calls_before = EtcdCalls();
  Phases phases;
  phases.add_done.assign(n, 0);
  phases.get_done.assign(n, 0);
  absl::Time t0;
  std::vector<std::unique_ptr<Store>> clients;
  for (int i = 0; i < n; ++i) clients.push_back(t.open());
  std::string counter = absl::StrCat("barrier/", tag, "/count");
  std::string release = absl::StrCat("barrier/", tag, "/release");
  absl::Barrier* start = new absl::Barrier(n + 1);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      Store& s = *clients[i];
      if (start->Block()) delete start;
      auto note = [&](const absl::Status& st) {
        if (st.ok()) return;
        if (failures++ == 0)
          std::fprintf(stderr, "%s: %s\n", t.name.c_str(), st.ToString().c_str());
      };
      auto v = s.Add(counter, 1);
      phases.add_done[i] = absl::ToDoubleMilliseconds(absl::Now() - t0);
      note(v.status());
      if (!v.ok()) return;
      if (*v == n) {
        note(s.Set(release, "1"));
        phases.set_done = absl::ToDoubleMilliseconds(absl::Now() - t0);
      } else {
        note(s.Get(release, absl::Seconds(120)).status());
        phases.get_done[i] = absl::ToDoubleMilliseconds(absl::Now() - t0);
      }
    });
  }
  absl::SleepFor(absl::Milliseconds(200));
  t0 = absl::Now();
  if (start->Block()) delete start;
  for (auto& th : threads) th.join();
  double ms = absl::ToDoubleMilliseconds(absl::Now() - t0);
  if (g_phases) {
    std::vector<double> gets;
    for (double g : phases.get_done) {
      if (g > 0) gets.push_back(g);
    }
    std::printf(
        "  %s phases (ms from start): adds done p10 %.1f p50 %.1f max %.1f; release set %.1f; "
        "gets done p10 %.1f p50 %.1f max %.1f; total %.1f\n",
        t.name.c_str(), Pct(phases.add_done, 0.1), Pct(phases.add_done, 0.5),
        Pct(phases.add_done, 1), phases.set_done, Pct(gets, 0.1), Pct(gets, 0.5), Pct(gets, 1), ms);
    std::map<std::string, double> calls = EtcdCalls();
    std::string text;
    for (const auto& [method, count] : calls) {
      double d = count - calls_before[method];
      if (d > 0) absl::StrAppend(&text, " ", method, " ", static_cast<int64_t>(d));
    }
    if (!text.empty()) std::printf("    etcd calls served during it:%s\n", text.c_str());
  }
  if (failures > 0) {
    std::fprintf(stderr, "muster-bench-etcd: %s barrier: %d clients failed\n", t.name.c_str(),
                 failures.load());
    std::exit(1);
  }
  return ms;
}

int Main(int argc, char** argv) {
  int64_t iterations = 500, barrier_n = 256, repeats = 3;
  std::string musterd, python = "/usr/bin/python3";
  FlagSet flags("muster-bench-etcd",
                "set/get latency and an N-client barrier through musterd over etcd,\n"
                "in-memory musterd, clients talking to etcd directly and a PyTorch 1.13 TCPStore.");
  flags.AddInt("iterations", &iterations, "Timed Set and Get calls per target.");
  flags.AddInt("barrier", &barrier_n, "Clients in the barrier.");
  flags.AddInt("repeats", &repeats, "Barrier runs per target (the median is reported).");
  flags.AddString("musterd", &musterd, "musterd binary (default: next to this one).");
  flags.AddString("python", &python, "Python with torch 1.13 for the TCPStore master.");
  flags.AddBool("phases", &g_phases,
                "Print when each barrier's clients were through Add, the release Set and Get.");
  std::string only;
  flags.AddString("only", &only,
                  "Comma-separated targets to run (musterd/etcd,musterd/memory,etcd direct,torch): "
                  "default all; the ratios need the first two.");
  flags.ParseOrExit(argc, argv);
  if (musterd.empty()) musterd = RunfilesPath(argv[0], "daemon/musterd");
  std::string cluster_sh = RunfilesPath(argv[0], "tools/etcd_cluster.sh");
  ::signal(SIGPIPE, SIG_IGN);

  char tmpl[] = "/tmp/muster-bench-etcd-XXXXXX";
  std::string dir = ::mkdtemp(tmpl);
  std::fprintf(stderr, "starting a 3-member etcd cluster in %s\n", dir.c_str());
  std::string etcd_dir = dir + "/etcd";
  if (std::system((cluster_sh + " start " + etcd_dir + " >/dev/null").c_str()) != 0) {
    std::fprintf(stderr, "muster-bench-etcd: etcd did not start (is etcd-server installed?)\n");
    return 1;
  }
  g_stop_cluster = cluster_sh + " stop " + etcd_dir;
  std::atexit(StopEverything);
  std::string endpoints = ReadAll(etcd_dir + "/endpoints");
  while (!endpoints.empty() && endpoints.back() == '\n') endpoints.pop_back();

  auto memd = Spawn({musterd, "--socket", dir + "/mem.sock", "--grpc-port", "0", "--store-port",
                     "0", "--listen", "127.0.0.1", "--ready-file", dir + "/mem.json"},
                    dir + "/mem.log");
  auto etcdd =
      Spawn({musterd, "--socket", dir + "/etcd.sock", "--grpc-port", "0", "--store-port", "0",
             "--listen", "127.0.0.1", "--ready-file", dir + "/etcd.json", "--store-backend", "etcd",
             "--etcd-endpoints", endpoints, "--etcd-prefix", "/bench/musterd/"},
            dir + "/etcdd.log");
  int mem_port = WaitReady(dir + "/mem.json");
  int etcd_port = WaitReady(dir + "/etcd.json");
  if (mem_port <= 0 || etcd_port <= 0) {
    std::fprintf(stderr, "muster-bench-etcd: musterd did not start (logs in %s)\n", dir.c_str());
    return 1;
  }
  // The torch master prints its port.
  std::string torch_port_file = dir + "/torch.port";
  auto torch = Spawn({python, "-c",
                      "import sys, time, datetime, torch.distributed as d\n"
                      "s = d.TCPStore('127.0.0.1', 0, 1, True, "
                      "timeout=datetime.timedelta(seconds=300), wait_for_workers=False)\n"
                      "open(sys.argv[1], 'w').write(str(s.port))\n"
                      "time.sleep(100000)\n",
                      torch_port_file},
                     dir + "/torch.log");
  int torch_port = -1;
  for (int i = 0; i < 600 && torch_port <= 0; ++i) {
    torch_port = std::atoi(ReadAll(torch_port_file).c_str());
    if (torch_port <= 0) absl::SleepFor(absl::Milliseconds(100));
  }

  auto tcp = [](int port, TcpStoreOptions::Protocol p) -> Factory {
    return [port, p]() -> std::unique_ptr<Store> {
      TcpStoreOptions o;
      o.port = port;
      o.protocol = p;
      auto s = TcpStore::Connect(o);
      Check(s.status(), "connect");
      return std::move(*s);
    };
  };
  std::vector<std::string> eps = absl::StrSplit(endpoints, ',');
  g_etcd_endpoints = eps;
  std::vector<Target> targets = {
      {"musterd/etcd", tcp(etcd_port, TcpStoreOptions::Protocol::kNative)},
      {"musterd/memory", tcp(mem_port, TcpStoreOptions::Protocol::kNative)},
      {"etcd direct",
       [eps]() -> std::unique_ptr<Store> {
         EtcdStoreOptions o;
         o.endpoints = eps;
         o.prefix = "/bench/direct/";
         o.private_connection = true;
         auto s = EtcdStore::Create(o);
         Check(s.status(), "etcd");
         return std::move(*s);
       }},
  };
  if (torch_port > 0) {
    targets.push_back({"torch TCPStore", tcp(torch_port, TcpStoreOptions::Protocol::kTorch113)});
  } else {
    std::fprintf(stderr, "no torch TCPStore master (see %s/torch.log): skipped\n", dir.c_str());
  }

  std::printf("muster-bench-etcd: %s\n", absl::StrJoin(argv, argv + argc, " ").c_str());
  std::printf("etcd 3.4 3-member cluster on 127.0.0.1 (%s); 64-byte values; %lld timed calls\n",
              endpoints.c_str(), static_cast<long long>(iterations));
  std::printf("%-16s %12s %12s %12s %12s %16s\n", "store", "set+get p50", "set+get p99",
              "get p50 us", "get p99 us", absl::StrCat("barrier ", barrier_n, " ms").c_str());
  std::vector<double> barrier_ms;
  std::string value(64, 'v');
  std::vector<std::string> wanted = absl::StrSplit(only, ',', absl::SkipEmpty());
  for (const Target& t : targets) {
    if (!wanted.empty() && std::none_of(wanted.begin(), wanted.end(), [&](const std::string& w) {
          return absl::StartsWith(t.name, w);
        })) {
      barrier_ms.push_back(0);
      continue;
    }
    std::fprintf(stderr, "%s: latency\n", t.name.c_str());
    auto s = t.open();
    // SET has no reply in these protocols: a Set is timed with the Get that
    // reads it back (the write acknowledged), a Get alone separately.
    Latency set = Measure(static_cast<int>(iterations), [&](int i) {
      std::string k = absl::StrCat("lat/", i % 64);
      Check(s->Set(k, value), t.name + " set");
      Check(s->Get(k).status(), t.name + " get after set");
    });
    Latency get = Measure(static_cast<int>(iterations), [&](int i) {
      Check(s->Get(absl::StrCat("lat/", i % 64)).status(), t.name + " get");
    });
    std::vector<double> runs;
    for (int r = 0; r < repeats; ++r) {
      std::fprintf(stderr, "%s: barrier %d/%lld\n", t.name.c_str(), r + 1,
                   static_cast<long long>(repeats));
      runs.push_back(Barrier(t, static_cast<int>(barrier_n), absl::StrCat(::getpid(), "/", r)));
    }
    std::sort(runs.begin(), runs.end());
    barrier_ms.push_back(runs[runs.size() / 2]);
    std::printf("%-16s %12.0f %12.0f %12.0f %12.0f %16.1f\n", t.name.c_str(), set.p50_us,
                set.p99_us, get.p50_us, get.p99_us, barrier_ms.back());
    std::fflush(stdout);
  }
  // A target left out by --only has 0.
  std::printf("barrier: musterd/etcd = %.2fx musterd/memory", barrier_ms[0] / barrier_ms[1]);
  if (barrier_ms[2] > 0)
    std::printf("; etcd direct = %.2fx musterd/etcd", barrier_ms[2] / barrier_ms[0]);
  if (barrier_ms.size() > 3 && barrier_ms[3] > 0)
    std::printf("; torch = %.2fx musterd/etcd", barrier_ms[3] / barrier_ms[0]);
  std::printf("\n");
  return 0;
}

}  // namespace
}  // namespace muster

int main(int argc, char** argv) { return muster::Main(argc, argv); }
