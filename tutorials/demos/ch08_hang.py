"""Chapter 8: a rank that skips a collective, and the timeout that names it.

    python -m tutorials.demos.ch08_hang

Rank 1 skips the all_reduce (as if its data loader had one batch fewer) and
goes on with other work; rank 0 waits for it. With torch.distributed's own
collectives that wait lasts the process group's timeout (30 minutes by default
for gloo) and ends in an error about a socket. Here ``COLLECTIVES_TIMEOUT=3``
makes rank 0 give up after 3 seconds with an error that says where it was.
"""
import torch
import torch.multiprocessing as mp

import collectives
from tutorials.demos.common import run

WORLD_SIZE = 2


def skip_a_collective(rank, world_size, rank0_done):
    if rank == 1:
        # "Other work". Here: stay alive until rank 0 gives up, so that rank 0
        # sees a timeout rather than a peer that exited.
        rank0_done.wait(timeout=60)
        return "skipped the all_reduce"
    try:
        collectives.all_reduce(torch.ones(4), algorithm="ring")
        return "all_reduce returned"
    except collectives.CollectiveTimeout as error:
        return f"CollectiveTimeout: {error}"
    finally:
        rank0_done.set()


def main():
    rank0_done = mp.get_context("spawn").Event()
    outcomes = run(skip_a_collective, WORLD_SIZE, rank0_done, env={"COLLECTIVES_TIMEOUT": "3"})
    for rank, outcome in enumerate(outcomes):
        print(f"rank {rank}: {outcome}")


if __name__ == "__main__":
    main()
