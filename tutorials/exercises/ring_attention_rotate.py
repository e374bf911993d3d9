"""Exercise, step 1 of 3 of ring_attention: move the key/value blocks one place around the ring.

Build ``ring_attention_rotate(k, v)``: this rank holds one block of keys ``k`` (S/N x d) and
its values ``v`` (S/N x d_v; d_v may differ from d). Send both to rank r + 1 and receive rank
r - 1's into new tensors; return the received ``(k, v)``, leaving the tensors you were handed
as they were (you send from them). No attention yet: the grader calls your function N times
in a row, each time on what the last call returned, and after rotation s rank r must hold
rank r - s's block (mod N): after N - 1 rotations every rank has seen every block, after N
each block is home again. Step 2 folds one block into the attention; step 3, ring_attention
itself, does both, N - 1 rotations in all.

Read: chapter 20, tutorials/20_context_parallelism.md, "The forward pass".

Hint: post the four messages together in one ``dist.batch_isend_irecv``, then wait on every
request. A blocking ``dist.send`` first waits for a receive its neighbour never reaches (it is
sending too). Receive into ``torch.empty_like(k)`` and ``torch.empty_like(v)`` (v is a block of
its own shape); the ops are ``dist.P2POp(dist.isend, k, right)``, the same for v, and
``dist.P2POp(dist.irecv, k_next, left)``, the same for v, with right = (r + 1) % N and left =
(r - 1) % N. With N = 1 rank the neighbour is yourself: return copies, no message.

Traffic to reach: per rotation, this rank's block once, to rank r + 1: 2 messages (k and v),
(S/N x d + S/N x d_v) x 8 bytes in float64.

Grade it:  python -m tutorials.exercises.grade ring_attention --step 1
"""
import torch  # noqa: F401  (imports your solution will need)
import torch.distributed as dist  # noqa: F401


def ring_attention_rotate(k, v, group=None):
    """(k, v) received from rank r - 1, this rank's (k, v) sent to rank r + 1, posted together."""
    raise NotImplementedError("write one rotation of the (k, v) blocks here")
