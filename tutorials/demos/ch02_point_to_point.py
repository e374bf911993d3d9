"""Chapter 2: point-to-point messages between two ranks.

    python -m tutorials.demos.ch02_point_to_point
"""
import torch
import torch.distributed as dist

from tutorials.demos.common import print_ranks, run

WORLD_SIZE = 2


def demo(rank, world_size):
    peer = 1 - rank

    # 1. Blocking: send returns once the data is on its way, recv once it has arrived.
    t = torch.tensor([1.0, 2.0, 3.0]) if rank == 0 else torch.zeros(3)
    if rank == 0:
        dist.send(t, dst=1)
    else:
        dist.recv(t, src=0)
    if rank == 0:
        print("1. blocking send/recv, rank 0 -> rank 1")
    print_ranks(t.tolist())

    # 2. Non-blocking: isend/irecv return a request at once; the transfer runs
    # in the background until wait(). Until then the buffer belongs to the
    # library: reading buf may show old, new or half-written data, and writing
    # to a buffer being sent may change what arrives. Neither is an error you
    # will see; both are undefined behaviour.
    buf = torch.arange(4.0) * 10 if rank == 0 else torch.zeros(4)
    req = dist.isend(buf, dst=1) if rank == 0 else dist.irecv(buf, src=0)
    overlapped = torch.ones(1000).sum().item()  # work that does not touch buf
    req.wait()
    if rank == 0:
        print("2. isend/irecv, compute while the message moves, read only after wait()")
    print_ranks(f"{buf.tolist()}, computed {overlapped:g} meanwhile")

    # 3. Both ranks send AND receive. dist.send on both sides first would
    # deadlock: each waits for a receive the other never gets to post (see
    # ch02_deadlock). Post the send and its matching receive together, then wait.
    mine = torch.full((3,), float(rank))
    theirs = torch.empty(3)
    requests = [dist.isend(mine, dst=peer), dist.irecv(theirs, src=peer)]
    for r in requests:
        r.wait()
    if rank == 0:
        print("3. exchange: isend + irecv posted together, then wait for both")
    print_ranks(f"sent {mine.tolist()}, received {theirs.tolist()}")


if __name__ == "__main__":
    run(demo, WORLD_SIZE)
