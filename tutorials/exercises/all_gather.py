"""Exercise: all_gather as a ring.

Build ``all_gather(tensor_list, tensor)``: afterwards ``tensor_list[i]`` holds
rank i's ``tensor`` on every rank, as ``dist.all_gather(tensor_list, tensor)``
does (``tensor_list`` has N tensors shaped like ``tensor``, to be overwritten).

Read: chapter 3 (tutorials/03_collectives.md) for what all_gather does, chapter 4
(tutorials/04_ring_allreduce.md): it is the second half of the ring all-reduce.

Hint: copy your own tensor into ``tensor_list[rank]``. Then N-1 steps on the
ring: at step s, send ``tensor_list[(rank - s) % N]`` to the right and receive
``tensor_list[(rank - s - 1) % N]`` from the left, posting the send and the
receive together (``dist.isend`` + ``dist.irecv``, or ``dist.batch_isend_irecv``).

Traffic to reach: (N-1) x S bytes sent per rank in N-1 messages, S the size of ``tensor``.

Grade it:  python -m tutorials.exercises.grade all_gather
"""
import torch
import torch.distributed as dist


def all_gather(tensor_list, tensor, group=None):
    """Fill ``tensor_list[i]`` with rank i's ``tensor``, passing pieces around the ring."""
    raise NotImplementedError("write the ring all_gather here")
