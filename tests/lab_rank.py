"""One rank of the lab tests' torchrun world: an all_reduce through our collectives, its place written down.

Run by ``tests/test_lab.py`` under torchrun agents in lab hosts; writes
``OUT/rank<R>.json`` with what the rank saw, so the test can check each rank ran
inside its host, was told its layout, and got the closed-form sum.
"""
import json
import os
import sys

import torch
import torch.distributed as dist

import collectives
from collectives import settings


def main(out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://")
    rank, n = dist.get_rank(), dist.get_world_size()
    x = torch.full((1000,), float(rank + 1))
    collectives.all_reduce(x, algorithm="ring")
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "world": n, "sum": x[0].item(), "want": n * (n + 1) / 2,
                   "local_rank": int(os.environ["LOCAL_RANK"]),
                   "local_world": int(os.environ["LOCAL_WORLD_SIZE"]),
                   "layout": settings.lab_layout(), "rate": settings.lab_rate(),
                   "netns": os.readlink("/proc/self/ns/net"),
                   "master": os.environ["MASTER_ADDR"]}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
