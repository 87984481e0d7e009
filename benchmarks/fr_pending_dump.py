"""A real NCCL flight recorder dump holding a collective that never completed, for tests/flight_recorder/ (issue 44).

  torchrun --standalone --nproc-per-node 1 benchmarks/fr_pending_dump.py OUTFILE

One rank, NCCL: three all-reduces that complete, then a kernel that spins on the compute stream for 20 s (as a GPU
that stopped computing) and an all-reduce of 1024 floats enqueued behind it; 2 s later the process dumps its flight
recorder (torch's `_dump_nccl_trace()`, as dlaunch/train/flight_recorder.py does) to OUTFILE and prints what the
trainer's reader makes of it. Needs a GPU.
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")

import torch
import torch.distributed as dist

from dlaunch.train import flight_recorder as fr


def main() -> int:
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
    x = torch.ones(1024, device="cuda")
    for _ in range(3):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    torch.cuda._sleep(int(20 * 2.0e9))
    dist.all_reduce(x)
    time.sleep(2.0)
    content = fr.dump(sys.argv[1], "nccl")
    print(json.dumps([(e["collective_seq_id"], e["profiling_name"], e["state"]) for e in content["entries"]]))
    kept = fr.summary(content, 0)
    print(json.dumps(kept))
    print(json.dumps(fr.first_unfinished({0: kept}, [0])))
    os._exit(0)  # not waiting for the spinning kernel


if __name__ == "__main__":
    sys.exit(main())
