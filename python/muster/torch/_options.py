"""How a process joins muster's job when torch creates its first "muster" backend.

Pure Python (no torch, no extension) so that the rules can be tested alone.

Three launchers:

* muster-run sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (musterd's store),
  MUSTER_SOCKET and MUSTER_JOB_ID: muster reads them itself.
* torchrun sets TORCHELASTIC_RUN_ID, and MASTER_ADDR:MASTER_PORT is torchrun's
  own TCPStore, not a musterd's: the job id is TORCHELASTIC_RUN_ID and the store
  is MUSTER_STORE_ADDR (default 127.0.0.1) : MUSTER_STORE_PORT (default: the
  store port of the local musterd, asked over MUSTER_SOCKET). On several nodes
  MUSTER_STORE_ADDR must name node 0's musterd (every node's musterd would
  otherwise be its own store).
* Anything else (plain env://): MASTER_ADDR:MASTER_PORT must be a musterd's
  store, unless MUSTER_STORE_ADDR / MUSTER_STORE_PORT say where it is.
"""

# muster's own transports for the world group: shared memory within a node,
# Gloo across nodes for CPU tensors, NCCL (in musterd) for CUDA tensors.
WORLD_BACKEND = "cpu:gloo,cuda:nccl"


def world_init_options(rank, world_size, world_group_name, timeout_s, env, daemon_store_port):
    """The options of muster_world_init, as a dict the extension reads.

    Args:
      rank, world_size: this process's global rank and the world size.
      world_group_name: torch's name of the default group.
      timeout_s: the default timeout of muster's groups, in seconds.
      env: the environment (a mapping).
      daemon_store_port: callable(socket: str) -> int, asks the musterd at
        `socket` ("" for the default) for its store port.

    Raises:
      RuntimeError: multi-node torchrun without MUSTER_STORE_ADDR.
    """
    options = {
        "rank": int(rank),
        "world_size": int(world_size),
        "world_group_name": str(world_group_name),
        "timeout_s": float(timeout_s),
        "backend": WORLD_BACKEND,
    }
    if env.get("MUSTER_JOB_ID"):
        return options  # muster-run: everything else comes from the environment
    addr = env.get("MUSTER_STORE_ADDR") or None
    port = env.get("MUSTER_STORE_PORT") or None
    if env.get("TORCHELASTIC_RUN_ID"):
        options["job_id"] = env["TORCHELASTIC_RUN_ID"]
        if addr is None:
            world = env.get("WORLD_SIZE")
            local = env.get("LOCAL_WORLD_SIZE")
            if world and local and int(world) != int(local):
                raise RuntimeError(
                    "muster: this torchrun job spans several nodes (WORLD_SIZE=%s, "
                    "LOCAL_WORLD_SIZE=%s): set MUSTER_STORE_ADDR (and MUSTER_STORE_PORT if it "
                    "differs from the local musterd's) to node 0's musterd store; torchrun's "
                    "MASTER_ADDR:MASTER_PORT is its own TCPStore, not a musterd's"
                    % (world, local))
            addr = "127.0.0.1"
    elif addr is None and port is None:
        return options  # plain env://: MASTER_ADDR:MASTER_PORT is a musterd's store
    options["master_addr"] = addr or "127.0.0.1"
    if port is None:
        port = daemon_store_port(env.get("MUSTER_SOCKET", ""))
    options["master_port"] = int(port)
    return options
