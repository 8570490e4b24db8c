// muster-run's command line: torchrun's flags in both spellings, the program
// forms, and the flags muster cannot honour refused by name.
#include "tools/run_command_line.h"

#include <signal.h>

#include <catch2/catch.hpp>
#include <cstdlib>

namespace muster {
namespace {

RunCommandLine Parsed(const std::vector<std::string>& args) {
  absl::StatusOr<RunCommandLine> line = ParseRunCommandLine(args);
  INFO(line.status().ToString());
  REQUIRE(line.ok());
  return *std::move(line);
}

std::string Refusal(const std::vector<std::string>& args) {
  absl::StatusOr<RunCommandLine> line = ParseRunCommandLine(args);
  REQUIRE_FALSE(line.ok());
  return std::string(line.status().message());
}

TEST_CASE("a script runs with python -u; its own flags stay its own; both spellings work") {
  ::setenv("MUSTER_PYTHON", "/opt/py/bin/python", 1);
  RunCommandLine line = Parsed({"--nproc_per_node=2", "--nnodes", "1", "--max-restarts", "3",
                                "train.py", "--nproc-per-node", "7", "--lr", "0.1"});
  CHECK(line.options.nproc_per_node == 2);
  CHECK(line.options.max_restarts == 3);
  CHECK(line.options.command == std::vector<std::string>{"/opt/py/bin/python", "-u", "train.py",
                                                         "--nproc-per-node", "7", "--lr", "0.1"});
  CHECK(Parsed({"-m", "pkg.train", "x"}).options.command ==
        std::vector<std::string>{"/opt/py/bin/python", "-u", "-m", "pkg.train", "x"});
  CHECK(Parsed({"--no_python", "./prog", "x"}).options.command ==
        std::vector<std::string>{"./prog", "x"});
  CHECK(Parsed({"--nproc-per-node", "2", "--", "./prog", "-m"}).options.command ==
        std::vector<std::string>{"./prog", "-m"});
  std::vector<std::string> run_path = Parsed({"--run-path", "t.py"}).options.command;
  REQUIRE(run_path.size() == 5);
  CHECK(run_path[2] == "-c");
  CHECK(run_path[4] == "t.py");
  ::unsetenv("MUSTER_PYTHON");
}

TEST_CASE("--version before the program is muster-run's, after it the program's") {
  CHECK(Parsed({"--version"}).version);
  CHECK(Parsed({"--nproc-per-node", "2", "--version"}).version);
  RunCommandLine line = Parsed({"--no-python", "./prog", "--version"});
  CHECK_FALSE(line.version);
  CHECK(line.options.command == std::vector<std::string>{"./prog", "--version"});
}

TEST_CASE("torchrun's PET_ environment variables stand in for flags not given") {
  ::setenv("PET_NPROC_PER_NODE", "3", 1);
  ::setenv("PET_MAX_RESTARTS", "2", 1);
  RunCommandLine line = Parsed({"--max-restarts", "1", "--no-python", "prog"});
  ::unsetenv("PET_NPROC_PER_NODE");
  ::unsetenv("PET_MAX_RESTARTS");
  CHECK(line.options.nproc_per_node == 3);
  CHECK(line.options.max_restarts == 1);  // the command line wins
}

TEST_CASE("rendezvous: static with a node rank, c10d with a range and an endpoint") {
  RunCommandLine s = Parsed({"--nnodes", "2", "--node_rank", "1", "--master_addr", "10.0.0.1",
                             "--master_port", "29500", "--no-python", "p"});
  CHECK(s.options.rendezvous == LaunchOptions::Rendezvous::kStatic);
  CHECK(s.options.nnodes == 2);
  CHECK(s.options.node_rank == 1);
  CHECK_FALSE(s.options.serves_store);
  CHECK(s.options.master_addr == "10.0.0.1");
  CHECK(s.options.master_port == 29500);

  RunCommandLine c = Parsed({"--nnodes", "2:4", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                             "127.0.0.1:29777", "--rdzv-id", "job7", "--rdzv-conf",
                             "join_timeout=60,last_call_timeout=5", "--no-python", "p"});
  CHECK(c.options.rendezvous == LaunchOptions::Rendezvous::kStore);
  CHECK(c.options.min_nodes == 2);
  CHECK(c.options.nnodes == 4);
  CHECK(c.options.serves_store);  // 127.0.0.1 is this machine
  CHECK(c.options.master_port == 29777);
  CHECK(c.options.job_id == "job7");
  CHECK(c.options.join_timeout == absl::Seconds(60));
  CHECK(c.options.last_call == absl::Seconds(5));
  CHECK(Parsed({"--rdzv-backend", "muster", "--rdzv-endpoint", "192.0.2.7", "--no-python", "p"})
            .options.master_port == 29400);
  CHECK_FALSE(
      Parsed({"--rdzv-backend", "muster", "--rdzv-endpoint", "192.0.2.7", "--no-python", "p"})
          .options.serves_store);

  RunCommandLine alone = Parsed({"--standalone", "--nproc-per-node", "2", "--no-python", "p"});
  CHECK(alone.options.rendezvous == LaunchOptions::Rendezvous::kStatic);
  CHECK(alone.options.job_id.size() == 16);  // a random id
  CHECK_FALSE(alone.notice.empty() == (std::getenv("OMP_NUM_THREADS") == nullptr));
}

TEST_CASE("numbers out of range are refused by name, not narrowed") {
  CHECK(Refusal({"--max-restarts", "4294967296", "p.py"}) ==
        "--max-restarts 4294967296: want 0 to 1000000");
  CHECK(Refusal({"--max-restarts", "-1", "p.py"}) == "--max-restarts -1: want 0 to 1000000");
  CHECK(Refusal({"--nnodes", "2", "--node-rank", "4294967296", "p.py"}) ==
        "--node-rank 4294967296: want 0 to 1 (--nnodes 2)");
  CHECK(Refusal({"--nnodes", "2", "--node-rank", "2", "p.py"}) ==
        "--node-rank 2: want 0 to 1 (--nnodes 2)");
  CHECK(Refusal({"--nnodes", "4294967297", "p.py"}) == "--nnodes 4294967297: at most 100000 nodes");
  CHECK(Refusal({"--nproc-per-node", "4294967297", "p.py"}) ==
        "--nproc-per-node 4294967297: at most 4096");
  for (const char* interval : {"inf", "nan", "1e-5", "3e6", "0"}) {
    INFO(interval);
    CHECK(Refusal({"--monitor-interval", interval, "p.py"}) ==
          "--monitor-interval: want 0.001 to 3600 seconds");
  }
  CHECK(Refusal({"--stop-grace-seconds", "nan", "p.py"}) ==
        "--stop-grace-seconds: want a number >= 0");
  CHECK(Refusal({"--exit-barrier-seconds", "inf", "p.py"}) ==
        "--exit-barrier-seconds: want a number >= 0");
  CHECK(Refusal({"--rdzv-backend", "c10d", "--rdzv-endpoint", "[::1]x80", "p.py"}) ==
        "--rdzv-endpoint [::1]x80: want [ADDRESS]:PORT");
  CHECK(Refusal({"--rdzv-backend", "c10d", "--rdzv-endpoint", "h:", "p.py"}) ==
        "--rdzv-endpoint h:: bad port");
  CHECK(Refusal({"--rdzv-backend", "c10d", "--rdzv-endpoint", ":29400", "p.py"}) ==
        "--rdzv-endpoint :29400: no host");
  CHECK(Parsed({"--rdzv-backend", "c10d", "--rdzv-endpoint", "[::1]:29401", "--no-python", "p"})
            .options.master_port == 29401);
  CHECK(Parsed({"--rdzv-backend", "c10d", "--rdzv-endpoint", "[::1]", "--no-python", "p"})
            .options.master_port == 29400);
}

TEST_CASE("output flags: redirects, tee, local ranks filter, log dir, signals") {
  RunCommandLine line =
      Parsed({"--log-dir", "/tmp/l", "-r", "0:1,1:2", "-t", "3", "--local_ranks_filter", "0,2",
              "--signals-to-handle", "SIGTERM,SIGUSR1", "--role", "trainer", "--no-python", "p"});
  CHECK(line.options.log_dir == "/tmp/l");
  CHECK(line.options.redirect == std::map<int, int>{{0, 1}, {1, 2}});
  CHECK(line.options.tee == std::map<int, int>{{-1, 3}});
  CHECK(line.options.console_ranks == std::set<int>{0, 2});
  CHECK(line.options.forward_signals == std::vector<int>{SIGTERM, SIGUSR1});
  CHECK(line.options.role == "trainer");
}

TEST_CASE("what muster cannot honour is refused by name") {
  CHECK(Refusal({"--local-addr", "10.0.0.2", "p.py"}) ==
        "--local-addr is not supported by muster-run (see the README's torchrun table)");
  CHECK(Refusal({"--logs_specs", "x", "p.py"}) ==
        "--logs-specs is not supported by muster-run (see the README's torchrun table)");
  CHECK(Refusal({"--numa-binding", "node", "p.py"}) ==
        "--numa-binding is not supported by muster-run (see the README's torchrun table)");
  CHECK(Refusal({"--duplicate-stdout-filters", "0", "p.py"}) ==
        "--duplicate-stdout-filters is not supported by muster-run (see the README's torchrun "
        "table)");
  CHECK(Refusal({"--duplicate-stderr-filters", "0", "p.py"}) ==
        "--duplicate-stderr-filters is not supported by muster-run (see the README's torchrun "
        "table)");
  CHECK(Refusal({"--event-log-handler", "console", "p.py"}) ==
        "--event-log-handler console is not supported by muster-run (only 'null')");
  CHECK(Refusal({"--rdzv-backend", "etcd", "--rdzv-endpoint", "h:1", "p.py"}) ==
        "--rdzv-backend etcd is not supported by muster-run (static, c10d or muster)");
  CHECK(Refusal({"--nnodes", "1:2", "p.py"}) ==
        "--nnodes 1:2: a range needs --rdzv-backend c10d (static has a fixed size)");
  CHECK(Refusal({"--rdzv-backend", "c10d", "p.py"}) ==
        "--rdzv-backend c10d needs --rdzv-endpoint HOST:PORT");
  CHECK(Refusal({"--rdzv-conf", "bogus=1", "p.py"}).find("--rdzv-conf bogus=1") == 0);
  CHECK(Refusal({"--no-python", "-m", "p"}) ==
        "--no-python and -m/--module cannot be used together");
  CHECK(Refusal({"--nproc-per-node", "xpu", "p.py"}) ==
        "--nproc-per-node xpu: want a number >= 1, auto, gpu or cpu");
  CHECK(Refusal({"--signals-to-handle", "SIGBUS", "p.py"}).find("unknown signal 'SIGBUS'") !=
        std::string::npos);
  CHECK(Refusal({"--bogus", "p.py"}) == "unknown flag --bogus (see muster-run --help)");
  CHECK(Refusal({"--nproc-per-node", "2"}).find("no training script") == 0);
}

}  // namespace
}  // namespace muster
