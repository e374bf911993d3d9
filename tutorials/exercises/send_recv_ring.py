"""Exercise: pass a tensor to the right neighbour on a ring, without deadlock.

Build ``send_recv_ring(tensor)``: every rank r sends its ``tensor`` to rank
(r+1) mod N and receives rank (r-1) mod N's tensor into its own ``tensor`` (in
place). This one step is the heart of every ring algorithm.

Read: chapter 2, tutorials/02_point_to_point.md ("Deadlock: both ranks send first").

Hint: if every rank calls the blocking ``dist.send`` first, every rank waits for
a receiver and none receives. Either post the send and the receive together
(``dist.isend`` and ``dist.irecv``, then ``wait()`` both; or ``dist.batch_isend_irecv``),
or let even ranks send first and odd ranks receive first. Send a copy: the
tensor you receive into is the one you send from. With N = 1 rank, the right
neighbour is yourself: nothing to do.

Traffic to reach: one message of S bytes sent per rank.

Grade it:  python -m tutorials.exercises.grade send_recv_ring
"""
import torch
import torch.distributed as dist


def send_recv_ring(tensor, group=None):
    """Replace ``tensor`` with the left neighbour's, sending ours to the right neighbour."""
    raise NotImplementedError("write the ring step here")
