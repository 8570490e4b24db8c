"""A small training script for test_torchrun_compat.py: records the
environment its launcher gave it (as JSON under argv[1]), then does a gloo
all_reduce over torch's env:// rendezvous and prints RESULT. With argv[2] ==
"fail", rank 1 raises under torch's @record (which writes
TORCHELASTIC_ERROR_FILE)."""
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


@record
def main():
    out_dir = sys.argv[1]
    rank = int(os.environ["RANK"])
    with open(os.path.join(out_dir, f"env-{rank}.json"), "w") as f:
        json.dump(dict(os.environ), f, sort_keys=True)
    if len(sys.argv) > 2 and sys.argv[2] == "fail" and rank == 1:
        raise RuntimeError("boom from rank 1")
    dist.init_process_group("gloo")
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    print("RESULT " + json.dumps({"rank": rank, "sum": t.item()}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
