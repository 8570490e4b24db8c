// Launcher: the engine of muster-run. It makes sure a musterd serves the
// node (an embedded one for the job's lifetime if none is running), starts
// the node's ranks with the environment c10d and muster expect, prefixes
// their output with the rank, forwards SIGINT/SIGTERM, and on a rank failure
// stops the others and either restarts all of them with a new generation
// (up to max_restarts) or exits non-zero with a summary naming the failed
// rank, its exit status or signal, and its last output lines. With several
// nodes, a failure on one node stops (and restarts) the ranks of every node,
// coordinated through the job's store. With RestartPolicy::kRank, only the
// failed rank is started again (same RANK, same generation: it takes over
// its rank in the running job, whose other ranks call Reconfigure), up to
// max_restarts times in all on this node; on a node that does not serve the
// job's store, an embedded musterd that died is started again and the
// node's ranks are recorded as failed in the job's store and restarted.
//
// Not thread-safe: Run() is called once, from main().
#ifndef MUSTER_TOOLS_LAUNCHER_H_
#define MUSTER_TOOLS_LAUNCHER_H_

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace muster {

enum class RestartPolicy {
  kJob,   // stop every rank and start them all again (a new generation)
  kRank,  // start only the failed rank again (elastic jobs)
};

struct LaunchOptions {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  // The job's store. Single node: default 127.0.0.1 and the daemon's store
  // port. Several nodes: required; node 0's daemon serves it.
  std::string master_addr;
  int master_port = 0;
  std::string job_id;  // default: run-<pid> (one node), run-<master port> (several)
  int max_restarts = 0;
  RestartPolicy restart_policy = RestartPolicy::kJob;
  // An existing musterd; empty: $MUSTER_SOCKET or the default socket if a
  // healthy musterd answers there, else an embedded one.
  std::string socket;
  std::string musterd_path;  // embedded daemon binary; empty: next to muster-run
  std::string token_file;    // passed to an embedded daemon; token given to ranks
  absl::Duration stop_grace = absl::Seconds(5);
  // Several nodes: node 0 (whose daemon serves the job's store) waits this
  // long for the other nodes' launchers to finish with the store before it
  // stops it (the exit barrier).
  absl::Duration exit_barrier = absl::Seconds(300);
  int tail_lines = 10;
  std::vector<std::string> command;

  // torchrun's meanings (muster-run's torchrun-compatible flags).
  std::string role = "default";  // ROLE_NAME
  // How nodes find each other. kStatic: --node-rank given, node 0 serves
  // the store. kStore (torchrun's c10d, or "muster"): nodes join through
  // the store at master_addr:master_port in arrival order; the node whose
  // address that is serves it (an embedded musterd).
  enum class Rendezvous { kStatic, kStore };
  Rendezvous rendezvous = Rendezvous::kStatic;
  bool serves_store = true;  // kStore: resolved from master_addr; kStatic: node_rank == 0
  int min_nodes = 1;         // kStore: the rendezvous closes with min..nnodes nodes
  absl::Duration join_timeout = absl::Seconds(600);
  absl::Duration last_call = absl::Seconds(30);  // after min_nodes, more may come this long
  // --log-dir: <log_dir>/<run id>_<random>/attempt_<n>/<local rank>/ holds
  // stdout.log / stderr.log (what redirects or tee name) and error.json
  // (TORCHELASTIC_ERROR_FILE). Empty: error files go to a temporary
  // directory, nothing else is written.
  std::string log_dir;
  // Per local rank, which streams go to files: bit 1 stdout, bit 2 stderr.
  // `redirect`: file only; `tee`: file and console. Key -1: every rank.
  std::map<int, int> redirect, tee;
  std::set<int> console_ranks;  // --local-ranks-filter (global ranks); empty: all
  absl::Duration monitor_interval = absl::Milliseconds(100);
  std::vector<int> forward_signals;  // default: SIGTERM, SIGINT, SIGHUP, SIGQUIT
  std::string signals_text = "SIGTERM,SIGINT,SIGHUP,SIGQUIT";
  bool virtual_local_rank = false;  // LOCAL_RANK=0, CUDA_VISIBLE_DEVICES=<local rank>
  // Pin local rank i to the i-th CPU muster-run may use (wrapping), like
  // mpirun's --bind-to core; false: the ranks float.
  bool bind_cores = false;
};

// Runs the job; returns muster-run's exit status (0 when every rank exited
// 0; 1 on a failure; 128+signal when interrupted; 2 for bad options).
int RunLaunch(LaunchOptions options);

}  // namespace muster

#endif  // MUSTER_TOOLS_LAUNCHER_H_
