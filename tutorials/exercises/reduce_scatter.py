"""Exercise: reduce_scatter as a ring.

Build ``reduce_scatter(output, input_list)``: every rank passes N tensors
``input_list``; afterwards rank r's ``output`` holds the element-wise sum over
all ranks of their ``input_list[r]``, as ``dist.reduce_scatter(output, input_list)``
does.

Read: chapter 4, tutorials/04_ring_allreduce.md: it is the first half of the ring all-reduce.

Hint: keep a running partial sum per piece (clone ``input_list``: the caller's
list should not change). N-1 steps on the ring: at step s, send your partial sum of piece
(r - s - 1) mod N to the right, receive the left neighbour's partial sum of piece
(r - s - 2) mod N and add it into yours. After N-1 steps, piece r is complete on
rank r: copy it into ``output``. Post each send together with its receive.

Traffic to reach: (N-1) x S bytes sent per rank in N-1 messages, S the size of ``output``.

Grade it:  python -m tutorials.exercises.grade reduce_scatter
"""
import torch
import torch.distributed as dist


def reduce_scatter(output, input_list, group=None):
    """Sum piece r of every rank's ``input_list`` into rank r's ``output``, around the ring."""
    raise NotImplementedError("write the ring reduce_scatter here")
