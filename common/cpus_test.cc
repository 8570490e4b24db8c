#include "common/cpus.h"

#include <sched.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <string>

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

TEST_CASE("ReadCpuLimit: the affinity mask sets it") {
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

  // Narrowed to one CPU (as taskset or a one-CPU cpuset would), it says 1.
  cpu_set_t one;
  CPU_ZERO(&one);
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) {
      CPU_SET(cpu, &one);
      break;
    }
  }
  REQUIRE(::sched_setaffinity(0, sizeof(one), &one) == 0);
  CpuLimit narrowed = ReadCpuLimit();
  REQUIRE(::sched_setaffinity(0, sizeof(set), &set) == 0);
  CHECK(narrowed.affinity == 1);
  CHECK(narrowed.usable == 1);
  CHECK(narrowed.describe.rfind("1 CPU (", 0) == 0);
}

}  // namespace
}  // namespace muster
