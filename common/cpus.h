// How many CPUs processes can run on at once. Containers and batch systems
// narrow this below the machine's count (std::thread::hardware_concurrency)
// with a cpuset, which shows in the affinity mask. musterd counts the CPUs
// of each group's local ranks (CpusOfProcesses: the union of their masks)
// and writes the count into the group's segment, so every rank of the group
// sizes its waits the same way; its own (ReadCpuLimit) is the fallback.
// A CPU quota (cgroup v2 cpu.max, v1 cpu.cfs_quota_us over
// cpu.cfs_period_us) is read and reported but not counted: under a quota
// ranks still run on separate CPUs at once, until the period's quota is
// spent, and measured faster waiting as ranks that each have a CPU
// (docs/benchmarks.md, "CPUs from the cpuset").
//
// Stateless functions; thread-safe.
#ifndef MUSTER_COMMON_CPUS_H_
#define MUSTER_COMMON_CPUS_H_

#include <cstdint>
#include <string>
#include <vector>

namespace muster {

struct CpuLimit {
  unsigned affinity = 0;  // CPUs in the affinity mask (0: unknown)
  double quota = 0;       // the cgroup CPU quota in CPUs (0: none); not counted
  // The affinity; hardware_concurrency() if unknown; at least 1.
  unsigned usable = 1;
  // E.g. "8 CPUs (affinity 8; a cgroup CPU quota of 1.5, not counted)".
  std::string describe;
};

// This process's limit, from sched_getaffinity and its cgroup.
CpuLimit ReadCpuLimit();

// The number of CPUs in the union of the affinity masks of `pids` (pids
// whose mask cannot be read, e.g. gone, are skipped); 0 if none was read.
unsigned CpusOfProcesses(const std::vector<int64_t>& pids);

// The CPUs the calling thread may run on (its affinity mask), in order;
// empty if the mask cannot be read.
std::vector<int> AllowedCpus();

// The tightest CPU quota on the cgroup path of `proc_self_cgroup` (the text
// of /proc/self/cgroup) under `cgroup_root` (normally /sys/fs/cgroup), in
// CPUs (quota / period; 0 if no level has one). Every level from the
// process's cgroup up to the mount's root that exists is read, so a
// container that sees its own cgroup at the mount's root (cgroup v1
// without a cgroup namespace) is covered. cgroup v2 (a "0::" line and
// cpu.max) and v1 (a line naming the cpu controller, mounted at
// ROOT/cpu or ROOT/cpu,cpuacct) are both read.
double CgroupCpuQuota(const std::string& proc_self_cgroup, const std::string& cgroup_root);

}  // namespace muster

#endif  // MUSTER_COMMON_CPUS_H_
