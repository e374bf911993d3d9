"""Chapter 8: the built-in tools that name a hang's culprit.

    python -m tutorials.demos.ch08_debug

1. ``TORCH_DISTRIBUTED_DEBUG=DETAIL``: torch's collectives first compare a
   fingerprint of the call across ranks, so two ranks calling all_reduce with
   different shapes raise instead of hanging (or returning garbage).
2. ``dist.monitored_barrier``: a barrier that, on timeout, names the ranks
   that never arrived (gloo only).
"""
import datetime
import os
import re

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tutorials.demos.common import run

WORLD_SIZE = 2


def mismatched_shapes(rank, world_size):
    """Rank 0 all_reduces 4 elements, rank 1 only 3, with torch's own all_reduce."""
    try:
        dist.all_reduce(torch.ones(4 if rank == 0 else 3))
        return "no error"
    except RuntimeError as error:
        return str(error)


def one_rank_missing(rank, world_size, rank0_done):
    """Rank 1 never reaches the barrier; rank 0's monitored_barrier says so after 2 s."""
    if rank == 1:
        rank0_done.wait(timeout=60)          # alive but elsewhere, like a rank stuck in a loop
        return "skipped the barrier"
    try:
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=2), wait_all_ranks=True)
        return "passed"
    except RuntimeError as error:
        return str(error)
    finally:
        rank0_done.set()


def main():
    # The variable must be set before torch.distributed starts in the processes.
    os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    error = run(mismatched_shapes, WORLD_SIZE)[0]
    del os.environ["TORCH_DISTRIBUTED_DEBUG"]
    print("1. TORCH_DISTRIBUTED_DEBUG=DETAIL, rank 0 all_reduces 4 elements, rank 1 only 3:")
    print(f"   {error.split('.')[0]}.")
    for rank, call in re.findall(r"(Rank \d) is running collective: CollectiveFingerPrint\((.*?), TensorDtypes",
                                 error):
        print(f"   {rank}: {call}")
    rank0_done = mp.get_context("spawn").Event()
    print("2. monitored_barrier(timeout=2 s, wait_all_ranks=True) on rank 0, rank 1 elsewhere:")
    print(f"   {run(one_rank_missing, WORLD_SIZE, rank0_done)[0]}")


if __name__ == "__main__":
    main()
