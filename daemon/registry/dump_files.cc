#include "daemon/registry/dump_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace muster {

absl::Status WriteDump(const std::string& dir, const std::string& path, const std::string& text,
                       int64_t owner_uid) {
  ::mkdir(dir.c_str(), 0711);
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return ErrnoToStatus(errno, "create " + tmp);
  if (owner_uid > 0 && ::geteuid() == 0) {
    (void)!::fchown(fd, static_cast<uid_t>(owner_uid), static_cast<gid_t>(-1));
  }
  absl::Status s;
  for (size_t done = 0; s.ok() && done < text.size();) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) s = ErrnoToStatus(errno, "write " + tmp);
    if (n > 0) done += static_cast<size_t>(n);
  }
  if (::close(fd) != 0 && s.ok()) s = ErrnoToStatus(errno, "close " + tmp);
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    s = ErrnoToStatus(errno, "rename " + tmp + " to " + path);
  }
  if (!s.ok()) ::unlink(tmp.c_str());
  return s;
}

int PruneDumps(const std::string& dir, uint64_t max_bytes) {
  struct Dump {
    int64_t mtime_ns;
    std::string name;
    uint64_t bytes;
  };
  std::vector<Dump> dumps;
  uint64_t total = 0;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return 0;
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (!absl::StartsWith(name, "trace-") || !absl::EndsWith(name, ".json")) continue;
    struct stat st;
    if (::lstat((dir + "/" + name).c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    dumps.push_back({static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec,
                     name, static_cast<uint64_t>(st.st_size)});
    total += static_cast<uint64_t>(st.st_size);
  }
  ::closedir(d);
  std::sort(dumps.begin(), dumps.end(), [](const Dump& a, const Dump& b) {
    return std::tie(a.mtime_ns, a.name) < std::tie(b.mtime_ns, b.name);
  });
  int removed = 0;
  for (const Dump& dump : dumps) {
    if (total <= max_bytes) break;
    if (::unlink((dir + "/" + dump.name).c_str()) == 0) ++removed;
    total -= dump.bytes;
  }
  if (removed > 0) {
    MLOG(INFO) << "removed the " << removed << " oldest flight-recorder dump(s) in " << dir
               << " (--dump-max-bytes=" << max_bytes << ")";
  }
  return removed;
}

}  // namespace muster
