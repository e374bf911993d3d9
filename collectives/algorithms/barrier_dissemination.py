"""barrier, dissemination.

Semantics: no rank leaves the barrier before every rank of the group has entered it.

Communication steps: ceil(log2 N)
Messages each rank sends: ceil(log2 N), each 1 byte

Steps:
  1. For k = 0, 1, ..., ceil(log2 N) - 1: send a token to rank (r + 2^k) mod N
     and wait for the token from rank (r - 2^k) mod N.
  After step k a rank has heard, directly or through others, from the 2^(k+1)
  ranks before it; after the last step it has heard from all N.

Worked example, N=4:

  step | messages
  -----+-----------------------------------------
    0  | 0->1, 1->2, 2->3, 3->0
    1  | 0->2, 1->3, 2->0, 3->1
  rank 0 has heard from 3 (step 0), 2 (step 1, which had heard from 1): all.

Reference: Hensgen, Finkel and Manber, "Two algorithms for barrier
synchronization", IJPP 1988.

Extra memory: 2 bytes (the token and the inbox), whatever S is.
"""
import torch

from ._cost import NOTHING, Cost
from ._util import ceil_log2


def cost(n, s=0, item=1):
    """A barrier moves 1-byte tokens whatever ``s`` is."""
    if n == 1:
        return NOTHING
    k = ceil_log2(n)
    # every rank sends one token at each of the ceil(log2 N) steps: N ceil(log2 N) in all
    return Cost(steps=k, messages=k, total_messages=n * k,
                sent_bytes=k, recv_bytes=k, critical_bytes=k, extra_memory=2)


def barrier(comm):
    n, r = comm.size, comm.rank
    # explicit device: a caller's torch.set_default_device must not move gloo's token to a GPU
    device = "cuda" if comm.nccl else "cpu"
    token = torch.ones(1, dtype=torch.uint8, device=device)
    inbox = torch.empty(1, dtype=torch.uint8, device=device)
    distance, step = 1, 0
    while distance < n:
        comm.sendrecv(token, (r + distance) % n, inbox, (r - distance) % n, step)
        distance, step = distance << 1, step + 1
