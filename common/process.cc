#include "common/process.h"

#include <signal.h>
#include <sys/types.h>

#include <cerrno>
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"

namespace muster {

bool ProcessGone(int64_t pid) {
  if (pid <= 0) return false;
  if (::kill(static_cast<pid_t>(pid), 0) != 0) return errno == ESRCH;
  std::string stat;
  if (std::FILE* f = std::fopen(absl::StrCat("/proc/", pid, "/stat").c_str(), "r")) {
    char buf[512];
    size_t n = std::fread(buf, 1, sizeof(buf), f);
    std::fclose(f);
    stat.assign(buf, n);
  }
  // "pid (comm) S ...": the state follows the last ')'.
  size_t paren = stat.rfind(')');
  if (paren == std::string::npos || paren + 2 >= stat.size()) return false;
  return stat[paren + 2] == 'Z' || stat[paren + 2] == 'X';
}

}  // namespace muster
