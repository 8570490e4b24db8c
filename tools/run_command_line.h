// ParseRunCommandLine: muster-run's command line, torchrun's flags with
// their meanings (either spelling, --nproc-per-node or --nproc_per_node;
// PET_* environment variables for flags not given) plus muster's own, turned
// into LaunchOptions. The first word that is not a flag is the training
// script, run with the Python that has torch (-m: a module; --no-python: a
// program; --run-path: runpy.run_path); after "--" comes a program and its
// arguments (muster-run's original form). A torchrun flag muster cannot
// honour is an error naming it.
//
// Stateless; thread-compatible (reads the environment).
#ifndef MUSTER_TOOLS_RUN_COMMAND_LINE_H_
#define MUSTER_TOOLS_RUN_COMMAND_LINE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/launcher.h"

namespace muster {

struct RunCommandLine {
  LaunchOptions options;
  bool help = false;     // --help: print `usage`, run nothing
  bool version = false;  // --version: print "muster-run <version>", run nothing
  std::string usage;     // the --help text
  std::string notice;    // what muster-run should print before starting (may be empty)
};

// `args`: argv[1..]. InvalidArgument names a bad or unsupported flag.
absl::StatusOr<RunCommandLine> ParseRunCommandLine(const std::vector<std::string>& args);

// The interpreter muster-run runs scripts with: $MUSTER_PYTHON if set, else
// the first of python3 on PATH and /usr/bin/python3 that can import torch,
// else python3.
std::string PythonWithTorch();

}  // namespace muster

#endif  // MUSTER_TOOLS_RUN_COMMAND_LINE_H_
