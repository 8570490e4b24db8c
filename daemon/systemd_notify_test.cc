#include "daemon/systemd_notify.h"

#include <stdlib.h>

#include <catch2/catch.hpp>

namespace muster {
namespace {

TEST_CASE("NotifySystemd is a no-op without NOTIFY_SOCKET and rejects unusable values") {
  ::unsetenv("NOTIFY_SOCKET");
  CHECK(NotifySystemd("READY=1").ok());
  ::setenv("NOTIFY_SOCKET", "relative/path", 1);
  CHECK(NotifySystemd("READY=1").code() == absl::StatusCode::kInvalidArgument);
  ::setenv("NOTIFY_SOCKET", "/nonexistent/notify.sock", 1);
  CHECK_FALSE(NotifySystemd("READY=1").ok());
  ::unsetenv("NOTIFY_SOCKET");
}

}  // namespace
}  // namespace muster
