"""Exercise: broadcast as a binomial tree.

Build ``broadcast(tensor, src)``: afterwards every rank's ``tensor`` holds rank
``src``'s values (in place), as ``dist.broadcast(tensor, src)`` does. ``src``
is not always 0.

Read: chapter 3 (tutorials/03_collectives.md) for what broadcast does,
chapter 5 (tutorials/05_algorithms.md) for the tree.

Hint: number the ranks relative to the root, ``v = (rank - src) % N``, so the
root is 0. In round k = 0, 1, 2, ... every rank v < 2**k that already has the
data sends it to v + 2**k (if that is < N); the rank v with 2**k <= v < 2**(k+1)
receives it from v - 2**k in that round. Turn v back into a real rank with
``(v + src) % N``. Each rank receives once and then sends in the later rounds.

Traffic to reach: every rank but src receives exactly one message of S bytes;
no rank sends more than ceil(log2 N) messages (sending N-1 messages from the
root, one per rank, is the linear broadcast: the root's link does all the work).

Grade it:  python -m tutorials.exercises.grade broadcast
"""
import torch
import torch.distributed as dist


def broadcast(tensor, src, group=None):
    """Copy rank ``src``'s ``tensor`` into every rank's ``tensor`` along a binomial tree."""
    raise NotImplementedError("write the binomial-tree broadcast here")
