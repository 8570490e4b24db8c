// muster-run: launch a job's ranks on this node, like torchrun (its flags
// work too). See --help.
#include <csignal>
#include <cstdio>

#include "common/version.h"
#include "tools/launcher.h"
#include "tools/run_command_line.h"

int main(int argc, char** argv) {
  // Output to a closed pipe (muster-run ... | head) must not kill muster-run
  // before it stopped the ranks and its musterd.
  std::signal(SIGPIPE, SIG_IGN);
  std::vector<std::string> args(argv + 1, argv + argc);
  absl::StatusOr<muster::RunCommandLine> line = muster::ParseRunCommandLine(args);
  if (!line.ok()) {
    std::fprintf(stderr, "muster-run: %s\n", std::string(line.status().message()).c_str());
    return 2;
  }
  if (line->help) {
    std::fputs(line->usage.c_str(), stdout);
    return 0;
  }
  if (line->version) {
    std::printf("muster-run %s\n", muster::kVersion);
    return 0;
  }
  if (!line->notice.empty()) std::fprintf(stderr, "muster-run: %s\n", line->notice.c_str());
  return muster::RunLaunch(std::move(line->options));
}
