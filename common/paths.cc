#include "common/paths.h"

#include <unistd.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace muster {

std::string DefaultSocketPath() {
  if (::geteuid() == 0) return "/run/muster/musterd.sock";
  const char* runtime_dir = std::getenv("XDG_RUNTIME_DIR");
  if (runtime_dir != nullptr && runtime_dir[0] != '\0') {
    return absl::StrCat(runtime_dir, "/muster/musterd.sock");
  }
  return absl::StrCat("/tmp/muster-", ::geteuid(), "/musterd.sock");
}

std::string ClientSocketPath() {
  const char* env = std::getenv("MUSTER_SOCKET");
  if (env != nullptr && env[0] != '\0') return env;
  return DefaultSocketPath();
}

}  // namespace muster
