// muster-run: launch a job's ranks on this node, like torchrun. See --help.
#include <cstdio>

#include "common/flags.h"
#include "tools/launcher.h"

int main(int argc, char** argv) {
  muster::LaunchOptions o;
  int64_t nproc = 1, nnodes = 1, node_rank = 0, master_port = 0, max_restarts = 0;
  double grace = 5;
  muster::FlagSet flags(
      "muster-run",
      "muster-run: start a job's ranks on this node (like torchrun).\n"
      "Usage: muster-run --nproc-per-node N [--nnodes M --node-rank R --master-addr A\n"
      "                  --master-port P] [--job-id ID] [--max-restarts K] -- CMD ARGS...\n"
      "\n"
      "Uses the musterd serving this node, or starts an embedded one for the job's\n"
      "lifetime. Each rank gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,\n"
      "GROUP_RANK, MASTER_ADDR, MASTER_PORT, MUSTER_SOCKET, MUSTER_JOB_ID,\n"
      "MUSTER_GENERATION, and TORCHELASTIC_USE_AGENT_STORE=True with\n"
      "TORCHELASTIC_RESTART_COUNT so that unmodified PyTorch scripts rendezvous through\n"
      "musterd's store. Output lines are prefixed with [rank R]. SIGINT/SIGTERM are\n"
      "forwarded. When a rank fails the others are stopped and, up to --max-restarts\n"
      "times, all are restarted with a new generation; otherwise muster-run exits 1\n"
      "naming the failed rank, its exit status or signal, and its last output.\n"
      "With --restart-policy rank only the failed rank is restarted (the others keep\n"
      "running and call muster's Reconfigure; the new process gets the same RANK and\n"
      "MUSTER_RESTART_COUNT, the number of processes that held the rank before).");
  flags.AddInt("nproc-per-node", &nproc, "Ranks to start on this node.");
  flags.AddInt("nnodes", &nnodes, "Nodes in the job (run muster-run on each).");
  flags.AddInt("node-rank", &node_rank, "This node's index, 0..nnodes-1; node 0 serves the store.");
  flags.AddString("master-addr", &o.master_addr,
                  "Address of node 0 (the job's store). Default for one node: 127.0.0.1.");
  flags.AddInt("master-port", &master_port,
               "Store port on node 0. Default for one node: the daemon's store port.");
  flags.AddString("job-id", &o.job_id,
                  "Job name (default: run-<pid> on one node, run-<master-port> on several).");
  flags.AddInt("max-restarts", &max_restarts,
               "How many times to restart all ranks after a failure.");
  std::string policy = "job";
  flags.AddString("restart-policy", &policy,
                  "job: restart every rank after a failure (a new generation; the default).\n"
                  "rank: restart only the failed rank, in the running job (elastic jobs).");
  flags.AddString("socket", &o.socket,
                  "Use the musterd at this socket (default: $MUSTER_SOCKET or musterd's default\n"
                  "if one answers there, else start an embedded musterd).");
  flags.AddString("musterd", &o.musterd_path,
                  "musterd binary for the embedded daemon (default: next to muster-run, or PATH).");
  flags.AddString("token-file", &o.token_file,
                  "Store token: an embedded daemon requires it; ranks get MUSTER_STORE_TOKEN.");
  flags.AddDouble("stop-grace-seconds", &grace,
                  "After SIGTERM to the ranks, how long before SIGKILL.");
  double exit_barrier = 300;
  flags.AddDouble("exit-barrier-seconds", &exit_barrier,
                  "Several nodes: how long node 0, whose musterd serves the job's store, waits\n"
                  "for the other nodes to finish with it before stopping it.");
  std::vector<std::string> command = flags.ParseOrExit(argc, argv);
  o.nproc_per_node = static_cast<int>(nproc);
  o.nnodes = static_cast<int>(nnodes);
  o.node_rank = static_cast<int>(node_rank);
  o.master_port = static_cast<int>(master_port);
  o.max_restarts = static_cast<int>(max_restarts);
  if (policy == "rank") {
    o.restart_policy = muster::RestartPolicy::kRank;
  } else if (policy != "job") {
    std::fprintf(stderr, "muster-run: --restart-policy must be 'job' or 'rank', not '%s'\n",
                 policy.c_str());
    return 2;
  }
  o.stop_grace = absl::Seconds(grace);
  if (exit_barrier < 0) {
    std::fprintf(stderr, "muster-run: --exit-barrier-seconds must be >= 0, not %g\n", exit_barrier);
    return 2;
  }
  o.exit_barrier = absl::Seconds(exit_barrier);
  o.command = std::move(command);
  return muster::RunLaunch(std::move(o));
}
