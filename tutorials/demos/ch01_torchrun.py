"""Chapter 1: a script started by a launcher instead of calling mp.spawn itself.

torchrun (current) puts everything in environment variables::

    torchrun --standalone --nproc-per-node 2 -m tutorials.demos.ch01_torchrun

torch.distributed.launch (legacy, deprecated) passes ``--local-rank`` as an argument::

    python -m torch.distributed.launch --standalone --nproc-per-node 2 -m tutorials.demos.ch01_torchrun
"""
import argparse
import os

import torch
import torch.distributed as dist


def main():
    parser = argparse.ArgumentParser()
    # Only the legacy launcher passes this (older versions spelled it --local_rank).
    parser.add_argument("--local-rank", "--local_rank", type=int, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.local_rank is not None:
        local_rank, source = args.local_rank, "the --local-rank argument (legacy launch)"
    else:
        local_rank, source = int(os.environ["LOCAL_RANK"]), "the LOCAL_RANK variable (torchrun)"

    # RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT are set by both launchers.
    dist.init_process_group("gloo", init_method="env://")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    seen = [None] * world_size
    dist.all_gather_object(seen, (rank, local_rank, int(os.environ["LOCAL_WORLD_SIZE"])))
    if rank == 0:
        print(f"local rank taken from {source}")
        for r, lr, nproc in seen:
            print(f"rank {r} of {world_size}: local_rank {lr}, nproc_per_node {nproc}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
