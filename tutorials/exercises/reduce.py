"""Exercise: reduce as a binomial tree.

Build ``reduce(tensor, dst)``: afterwards rank ``dst``'s ``tensor`` holds the
element-wise sum over all ranks (in place), as ``dist.reduce(tensor, dst)``
does. Other ranks' tensors may hold anything afterwards. ``dst`` is not always 0.

Read: chapter 5, tutorials/05_algorithms.md (the tree is the broadcast run backwards).

Hint: number the ranks relative to the root, ``v = (rank - dst) % N``. In round
k = 0, 1, 2, ... (mask = 2**k) a rank v whose lowest set bit is mask sends its
partial sum to v - mask and is done; a rank v with ``v % (2 * mask) == 0``
receives from v + mask (if that is < N) and adds it in. Real rank:
``(v + dst) % N``. Receive into a separate buffer, then add.

Traffic to reach: every rank but dst sends exactly one message of S bytes; no
rank receives more than ceil(log2 N) messages (dst receiving N-1 messages is the
linear reduce: dst's link does all the work).

Grade it:  python -m tutorials.exercises.grade reduce
"""
import torch
import torch.distributed as dist


def reduce(tensor, dst, group=None):
    """Sum every rank's ``tensor`` into rank ``dst``'s, along a binomial tree."""
    raise NotImplementedError("write the binomial-tree reduce here")
