"""Chapter 2: the classic deadlock. Both ranks send first; nobody receives.

    python -m tutorials.demos.ch02_deadlock

Each rank waits at most 3 seconds for its send instead of forever.
"""
import datetime

import torch
import torch.distributed as dist

from tutorials.demos.common import run

WORLD_SIZE = 2


def both_send_first(rank, world_size):
    peer = 1 - rank
    mine = torch.full((1000,), float(rank))
    # dist.send(mine, peer) is isend + wait; the matching dist.recv would come next.
    work = dist.isend(mine, dst=peer)
    try:
        work.wait(timeout=datetime.timedelta(seconds=3))
        outcome = "send completed"
    except RuntimeError:
        outcome = f"send still waiting after 3 s: rank {peer} is sending too, not receiving"
    return outcome


def main():
    outcomes = run(both_send_first, WORLD_SIZE)
    print("both ranks call send before recv:")
    for rank, outcome in enumerate(outcomes):
        print(f"  rank {rank}: {outcome}")


if __name__ == "__main__":
    main()
