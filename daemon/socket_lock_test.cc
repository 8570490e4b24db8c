#include "daemon/socket_lock.h"

#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>

namespace muster {
namespace {

TEST_CASE("SocketLock admits one holder, names it, and frees the path when dropped") {
  char dir[] = "/tmp/muster-lock-XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  std::string socket = std::string(dir) + "/sub/dir/musterd.sock";  // parents created
  auto first = SocketLock::Acquire(socket);
  REQUIRE(first.ok());
  auto second = SocketLock::Acquire(socket);
  REQUIRE_FALSE(second.ok());
  CHECK(second.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(second.status().message()).find("pid " + std::to_string(::getpid())) !=
        std::string::npos);
  (*first)->RemoveFiles();
  first->reset();
  auto third = SocketLock::Acquire(socket);
  CHECK(third.ok());
}

TEST_CASE("SocketLock rejects relative and over-long paths") {
  CHECK(SocketLock::Acquire("relative.sock").status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(SocketLock::Acquire("/tmp/" + std::string(200, 'x')).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace muster
