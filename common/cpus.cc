#include "common/cpus.h"

#include <errno.h>
#include <sched.h>
#include <sys/types.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace muster {
namespace {

bool ReadFile(const std::string& path, std::string* text) {
  std::ifstream in(path);
  if (!in) return false;
  std::stringstream buffer;
  buffer << in.rdbuf();
  *text = buffer.str();
  return true;
}

// A CPU mask sized for this machine (CPU_ALLOC: more than CPU_SETSIZE
// CPUs is possible), freed with the object.
class CpuMask {
 public:
  CpuMask() {
    for (int cpus = 1024;; cpus *= 2) {
      set_ = CPU_ALLOC(cpus);
      bytes_ = CPU_ALLOC_SIZE(cpus);
      CPU_ZERO_S(bytes_, set_);
      if (::sched_getaffinity(0, bytes_, set_) == 0 || errno != EINVAL || cpus >= (1 << 20)) {
        break;
      }
      CPU_FREE(set_);
    }
    CPU_ZERO_S(bytes_, set_);
  }
  ~CpuMask() { CPU_FREE(set_); }
  CpuMask(const CpuMask&) = delete;
  CpuMask& operator=(const CpuMask&) = delete;
  // Reads `pid`'s mask (0: this thread's); false if it cannot be read.
  bool Read(pid_t pid) { return ::sched_getaffinity(pid, bytes_, set_) == 0; }
  bool Has(int cpu) const { return CPU_ISSET_S(cpu, bytes_, set_); }
  int Limit() const { return static_cast<int>(bytes_ * 8); }  // CPUs it can hold
  // Adds `other`'s CPUs to this mask.
  void Add(const CpuMask& other) { CPU_OR_S(bytes_, set_, set_, other.set_); }
  unsigned Count() const { return static_cast<unsigned>(CPU_COUNT_S(bytes_, set_)); }

 private:
  cpu_set_t* set_ = nullptr;
  size_t bytes_ = 0;
};

// `path` and each of its parents up to "/" ("/a/b" -> "/a/b", "/a", "").
std::vector<std::string> PathAndParents(std::string path) {
  // A cgroup outside this namespace's root shows as "/../..": not under
  // the mount, so only the mount's root is read.
  if (absl::StrContains(path + "/", "/../")) path.clear();
  while (!path.empty() && path.back() == '/') path.pop_back();
  std::vector<std::string> out;
  while (true) {
    out.push_back(path);
    size_t slash = path.rfind('/');
    if (slash == std::string::npos || path.empty()) break;
    path.resize(slash);
  }
  return out;
}

// Quota in CPUs from cgroup v2's cpu.max ("max 100000" or "150000 100000");
// 0 if none.
double ParseCpuMax(const std::string& text) {
  std::vector<std::string> fields =
      absl::StrSplit(absl::StripAsciiWhitespace(text), ' ', absl::SkipEmpty());
  double quota = 0, period = 0;
  if (fields.size() != 2 || !absl::SimpleAtod(fields[0], &quota) ||
      !absl::SimpleAtod(fields[1], &period) || quota <= 0 || period <= 0) {
    return 0;
  }
  return quota / period;
}

// Quota in CPUs from cgroup v1's cpu.cfs_quota_us and cpu.cfs_period_us in
// `dir` (-1 is none); 0 if none.
double ReadCfsQuota(const std::string& dir) {
  std::string quota_text, period_text;
  double quota = 0, period = 0;
  if (!ReadFile(dir + "/cpu.cfs_quota_us", &quota_text) ||
      !ReadFile(dir + "/cpu.cfs_period_us", &period_text) ||
      !absl::SimpleAtod(absl::StripAsciiWhitespace(quota_text), &quota) ||
      !absl::SimpleAtod(absl::StripAsciiWhitespace(period_text), &period) || quota <= 0 ||
      period <= 0) {
    return 0;
  }
  return quota / period;
}

// The smaller positive of two quotas (0: none).
double Tighter(double a, double b) {
  if (a <= 0) return b;
  if (b <= 0) return a;
  return std::min(a, b);
}

}  // namespace

double CgroupCpuQuota(const std::string& proc_self_cgroup, const std::string& cgroup_root) {
  double tightest = 0;
  for (absl::string_view line : absl::StrSplit(proc_self_cgroup, '\n', absl::SkipEmpty())) {
    // "ID:CONTROLLERS:PATH"; the path may itself hold ':'.
    std::vector<std::string> parts = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (parts.size() != 3) continue;
    const std::string& controllers = parts[1];
    const std::string& path = parts[2];
    if (parts[0] == "0" && controllers.empty()) {  // cgroup v2
      for (const std::string& level : PathAndParents(path)) {
        std::string text;
        if (ReadFile(cgroup_root + level + "/cpu.max", &text)) {
          tightest = Tighter(tightest, ParseCpuMax(text));
        }
      }
      continue;
    }
    std::vector<std::string> names = absl::StrSplit(controllers, ',');
    if (std::find(names.begin(), names.end(), "cpu") == names.end()) continue;
    for (const char* mount : {"/cpu", "/cpu,cpuacct", "/cpuacct,cpu"}) {
      for (const std::string& level : PathAndParents(path)) {
        tightest = Tighter(tightest, ReadCfsQuota(cgroup_root + mount + level));
      }
    }
  }
  return tightest;
}

CpuLimit ReadCpuLimit() {
  CpuLimit limit;
  CpuMask mask;
  if (mask.Read(0)) limit.affinity = mask.Count();
  std::string cgroup;
  if (ReadFile("/proc/self/cgroup", &cgroup)) {
    limit.quota = CgroupCpuQuota(cgroup, "/sys/fs/cgroup");
  }
  unsigned usable = limit.affinity;
  if (usable == 0) usable = std::thread::hardware_concurrency();
  limit.usable = std::max(1u, usable);
  limit.describe = absl::StrCat(
      limit.usable, limit.usable == 1 ? " CPU" : " CPUs", " (affinity ",
      limit.affinity == 0 ? "unknown" : absl::StrCat(limit.affinity),
      limit.quota > 0 ? absl::StrCat("; a cgroup CPU quota of ", limit.quota, ", not counted")
                      : "; no CPU quota",
      ")");
  return limit;
}

unsigned CpusOfProcesses(const std::vector<int64_t>& pids) {
  CpuMask all, one;
  bool any = false;
  for (int64_t pid : pids) {
    if (pid <= 0 || !one.Read(static_cast<pid_t>(pid))) continue;
    all.Add(one);
    any = true;
  }
  return any ? all.Count() : 0;
}

std::vector<int> AllowedCpus() {
  CpuMask mask;
  std::vector<int> cpus;
  if (!mask.Read(0)) return cpus;
  for (int cpu = 0; cpu < mask.Limit(); ++cpu) {
    if (mask.Has(cpu)) cpus.push_back(cpu);
  }
  return cpus;
}

}  // namespace muster
