// CheckSocketOwner: who may have put a socket where a client looks for
// musterd (run as root, which owns what the test creates; other owners
// come from chown).
#include "common/paths.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>

#include "absl/strings/match.h"

namespace muster {
namespace {

constexpr uid_t kStranger = 12345;

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/muster-paths-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

void Listen(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  ::close(fd);
}

TEST_CASE("a socket directory only the caller or root could write is accepted") {
  TempDir t;
  const std::string dir = t.path + "/muster";
  REQUIRE(::mkdir(dir.c_str(), 0755) == 0);
  CHECK(CheckSocketOwner(dir + "/musterd.sock").ok());
  Listen(dir + "/musterd.sock");
  CHECK(CheckSocketOwner(dir + "/musterd.sock").ok());
  // No directory yet: nobody serves there, the daemon may create it.
  CHECK(CheckSocketOwner(t.path + "/absent/musterd.sock").ok());
}

TEST_CASE("another user's socket directory, or one others may write, is refused") {
  if (::geteuid() != 0) {
    WARN("SKIPPED: needs root to give a directory to another user");
    return;
  }
  TempDir t;
  const std::string theirs = t.path + "/theirs";
  REQUIRE(::mkdir(theirs.c_str(), 0700) == 0);
  REQUIRE(::chown(theirs.c_str(), kStranger, kStranger) == 0);
  absl::Status s = CheckSocketOwner(theirs + "/musterd.sock");
  CHECK(s.code() == absl::StatusCode::kPermissionDenied);
  CHECK(absl::StrContains(s.message(), "belongs to uid 12345"));

  const std::string open = t.path + "/open";
  REQUIRE(::mkdir(open.c_str(), 0700) == 0);
  REQUIRE(::chmod(open.c_str(), 0777) == 0);
  s = CheckSocketOwner(open + "/musterd.sock");
  CHECK(s.code() == absl::StatusCode::kPermissionDenied);
  CHECK(absl::StrContains(s.message(), "mode 0777) may be written by other users"));

  // Sticky and shared (like /tmp): the socket itself must be ours or root's.
  REQUIRE(::chmod(open.c_str(), 01777) == 0);
  CHECK(CheckSocketOwner(open + "/musterd.sock").ok());
  Listen(open + "/musterd.sock");
  CHECK(CheckSocketOwner(open + "/musterd.sock").ok());
  REQUIRE(::lchown((open + "/musterd.sock").c_str(), kStranger, kStranger) == 0);
  s = CheckSocketOwner(open + "/musterd.sock");
  CHECK(s.code() == absl::StatusCode::kPermissionDenied);
  CHECK(absl::StrContains(s.message(), "it belongs to uid 12345"));

  // A symlink to a directory is not the directory.
  const std::string real = t.path + "/real";
  REQUIRE(::mkdir(real.c_str(), 0700) == 0);
  REQUIRE(::symlink(real.c_str(), (t.path + "/link").c_str()) == 0);
  s = CheckSocketOwner(t.path + "/link/musterd.sock");
  CHECK(s.code() == absl::StatusCode::kPermissionDenied);
  CHECK(absl::StrContains(s.message(), "is not a directory"));

  // Only the default path is checked: a path the user named is trusted.
  CHECK(CheckDefaultSocketOwner(theirs + "/musterd.sock").ok());
}

}  // namespace
}  // namespace muster
