#include "common/process.h"

#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include "absl/time/clock.h"

namespace muster {
namespace {

TEST_CASE("ProcessGone: running, zombie, reaped, no pid") {
  CHECK_FALSE(ProcessGone(::getpid()));
  CHECK_FALSE(ProcessGone(0));  // not a process's id
  CHECK_FALSE(ProcessGone(-1));
  pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::pause();
    ::_exit(0);
  }
  CHECK_FALSE(ProcessGone(child));  // running (paused)
  ::kill(child, SIGKILL);
  // Killed, not reaped yet: a zombie, gone.
  bool gone = false;
  for (int i = 0; i < 500 && !(gone = ProcessGone(child)); ++i)
    absl::SleepFor(absl::Milliseconds(2));
  CHECK(gone);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(ProcessGone(child));  // reaped: no such process
}

}  // namespace
}  // namespace muster
