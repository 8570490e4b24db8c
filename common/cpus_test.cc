#include "common/cpus.h"

#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <fstream>
#include <string>
#include <vector>

namespace muster {
namespace {

// A scratch directory standing in for /sys/fs/cgroup.
struct FakeCgroupRoot {
  std::string dir;
  FakeCgroupRoot() {
    char tmpl[] = "/tmp/muster-cgroup-XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    dir = tmpl;
  }
  ~FakeCgroupRoot() { std::system(("rm -rf " + dir).c_str()); }
  void Write(const std::string& relative, const std::string& text) {
    std::string path = dir + relative;
    std::system(("mkdir -p " + path.substr(0, path.rfind('/'))).c_str());
    std::ofstream(path) << text;
  }
};

TEST_CASE("CgroupCpuQuota: cgroup v2 cpu.max, the tightest level") {
  FakeCgroupRoot root;
  const std::string self = "0::/job/rank\n";
  CHECK(CgroupCpuQuota(self, root.dir) == 0);  // no files: no quota
  root.Write("/job/rank/cpu.max", "max 100000\n");
  CHECK(CgroupCpuQuota(self, root.dir) == 0);  // "max": none
  root.Write("/job/cpu.max", "150000 100000\n");
  CHECK(CgroupCpuQuota(self, root.dir) == Approx(1.5));  // the parent's
  root.Write("/job/rank/cpu.max", "50000 100000\n");
  CHECK(CgroupCpuQuota(self, root.dir) == Approx(0.5));  // the tighter, the leaf's
  root.Write("/job/rank/cpu.max", "garbage\n");
  CHECK(CgroupCpuQuota(self, root.dir) == Approx(1.5));  // unreadable level skipped
}

TEST_CASE("CgroupCpuQuota: cgroup v1 cfs quota, either mount name") {
  FakeCgroupRoot root;
  const std::string self =
      "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n";
  CHECK(CgroupCpuQuota(self, root.dir) == 0);
  // A container without a cgroup namespace sees its own cgroup at the
  // mount's root: /docker/abc does not exist under it.
  root.Write("/cpu,cpuacct/cpu.cfs_quota_us", "200000\n");
  root.Write("/cpu,cpuacct/cpu.cfs_period_us", "100000\n");
  CHECK(CgroupCpuQuota(self, root.dir) == Approx(2.0));
  root.Write("/cpu/docker/abc/cpu.cfs_quota_us", "-1\n");  // none at the leaf
  root.Write("/cpu/docker/abc/cpu.cfs_period_us", "100000\n");
  CHECK(CgroupCpuQuota(self, root.dir) == Approx(2.0));
  root.Write("/cpu/docker/cpu.cfs_quota_us", "25000\n");
  root.Write("/cpu/docker/cpu.cfs_period_us", "100000\n");
  CHECK(CgroupCpuQuota(self, root.dir) == Approx(0.25));
  // A line without the cpu controller is not read.
  CHECK(CgroupCpuQuota("12:memory:/docker/abc\n", root.dir) == 0);
  CHECK(CgroupCpuQuota("not a cgroup line\n", root.dir) == 0);
}

TEST_CASE("ReadCpuLimit and AllowedCpus: the affinity mask sets them") {
  CpuLimit limit = ReadCpuLimit();
  cpu_set_t set;
  CPU_ZERO(&set);
  REQUIRE(::sched_getaffinity(0, sizeof(set), &set) == 0);
  const unsigned affinity = static_cast<unsigned>(CPU_COUNT(&set));
  CHECK(limit.affinity == affinity);
  CHECK(limit.usable >= 1);
  CHECK(limit.usable <= affinity);
  CHECK(limit.usable == affinity);  // a quota is not counted
  CHECK(limit.describe.find("affinity " + std::to_string(affinity)) != std::string::npos);

  // Narrowed to one CPU (as taskset or a one-CPU cpuset would), it says 1
  // and AllowedCpus lists that CPU alone.
  const std::vector<int> allowed = AllowedCpus();
  REQUIRE(allowed.size() == affinity);
  for (int cpu : allowed) CHECK(CPU_ISSET(cpu, &set));
  CHECK(std::is_sorted(allowed.begin(), allowed.end()));
  const int last = allowed.back();
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(last, &one);
  REQUIRE(::sched_setaffinity(0, sizeof(one), &one) == 0);
  CpuLimit narrowed = ReadCpuLimit();
  const std::vector<int> narrowed_cpus = AllowedCpus();
  REQUIRE(::sched_setaffinity(0, sizeof(set), &set) == 0);
  CHECK(narrowed.affinity == 1);
  CHECK(narrowed.usable == 1);
  CHECK(narrowed.describe.rfind("1 CPU (", 0) == 0);
  CHECK(narrowed_cpus == std::vector<int>{last});
}

TEST_CASE("CpusOfProcesses: the union of the masks; unreadable pids skipped") {
  const std::vector<int> cpus = AllowedCpus();
  REQUIRE(!cpus.empty());
  CHECK(CpusOfProcesses({::getpid()}) == cpus.size());
  CHECK(CpusOfProcesses({}) == 0);
  CHECK(CpusOfProcesses({0, -1}) == 0);  // not processes
  // Children pinned to one CPU each (as muster-run --bind cores pins ranks).
  const size_t n = std::min<size_t>(cpus.size(), 2);
  std::vector<pid_t> children;
  for (size_t i = 0; i < n; ++i) {
    int ready[2];
    REQUIRE(::pipe(ready) == 0);
    pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(cpus[i], &one);
      ::sched_setaffinity(0, sizeof(one), &one);
      char byte = 1;
      (void)!::write(ready[1], &byte, 1);
      ::pause();
      ::_exit(0);
    }
    char byte = 0;
    REQUIRE(::read(ready[0], &byte, 1) == 1);
    ::close(ready[0]);
    ::close(ready[1]);
    children.push_back(child);
  }
  CHECK(CpusOfProcesses({children[0]}) == 1);
  CHECK(CpusOfProcesses({children.begin(), children.end()}) == n);
  CHECK(CpusOfProcesses({children[0], children[0]}) == 1);
  for (pid_t child : children) {
    ::kill(child, SIGKILL);
    ::waitpid(child, nullptr, 0);
  }
  // Gone: skipped.
  CHECK(CpusOfProcesses({children[0]}) == 0);
  CHECK(CpusOfProcesses({children[0], ::getpid()}) == cpus.size());
}

}  // namespace
}  // namespace muster
