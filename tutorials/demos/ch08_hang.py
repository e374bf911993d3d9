"""Chapter 8: a rank that skips a collective, and the timeout that names it.

    python -m tutorials.demos.ch08_hang

Rank 1 skips the all_reduce (as if its data loader had one batch fewer) and
goes on with other work; rank 0 waits for it. With torch.distributed's own
collectives that wait lasts the process group's timeout (30 minutes by default
for gloo) and ends in an error about a socket. Here ``COLLECTIVES_TIMEOUT=3``
makes rank 0 give up after 3 seconds with an error that says where it was.
"""
import time

import torch

import collectives
from tutorials.demos.common import run

WORLD_SIZE = 2


def skip_a_collective(rank, world_size):
    if rank == 1:
        time.sleep(6)          # "other work"; long enough for rank 0's timeout to expire
        return "skipped the all_reduce"
    try:
        collectives.all_reduce(torch.ones(4), algorithm="ring")
        return "all_reduce returned"
    except collectives.CollectiveTimeout as error:
        return f"CollectiveTimeout: {error}"


def main():
    outcomes = run(skip_a_collective, WORLD_SIZE, env={"COLLECTIVES_TIMEOUT": "3"})
    for rank, outcome in enumerate(outcomes):
        print(f"rank {rank}: {outcome}")


if __name__ == "__main__":
    main()
