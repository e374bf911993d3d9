"""Exercise: ring attention, the sequence split over the ranks (context parallelism).

Build ``ring_attention(q, k, v)``: the sequence of S positions is cut into N chunks and rank r
holds chunk r of the queries, keys and values, each ``(S/N, d)``. Return this rank's output,
``(S/N, d)``: the attention of its queries to the keys and values of the *whole* sequence,
``softmax(q @ K.T / sqrt(d)) @ V`` (no mask), as one process holding all of K and V would
compute it. No rank may gather the whole of K or V at once: the chunks travel.

Read: chapter 20, tutorials/20_context_parallelism.md.

Hint: keep a running maximum ``m`` (one per query row), a running sum ``l`` and an
unnormalised output ``o`` (the online softmax). N times: attend to the (k, v) chunk you hold,
``s = q @ k.T / sqrt(d)``, ``m_new = max(m, s.amax(-1))``, ``p = exp(s - m_new)``; what was
summed under the old maximum must be rescaled by ``exp(m - m_new)`` before adding:
``l = l * fade + p.sum(-1)``, ``o = o * fade + p @ v``. Between visits pass the chunk on:
send it to rank + 1 and receive the next from rank - 1, both at once (``dist.batch_isend_irecv``,
as in the send_recv_ring exercise), N-1 moves in all. At the end, ``o / l``.

Traffic to reach: per rank, N-1 key chunks and N-1 value chunks, 2(N-1) x S/N x d x 8 bytes
(float64) in at most 2(N-1) messages: the queries never move.

Steps, each graded on its own: ``--step 1``, one turn of the keys and values around the
ring (ring_attention_rotate.py); ``--step 2``, one block folded into the online softmax's state
(ring_attention_merge.py); ``--step 3``, this exercise.

Grade it:  python -m tutorials.exercises.grade ring_attention
"""
import torch  # noqa: F401  (imports your solution will need)
import torch.distributed as dist  # noqa: F401


def ring_attention(q, k, v, group=None):
    """This rank's rows of softmax(Q K^T / sqrt(d)) V, with K and V passed around the ring."""
    raise NotImplementedError("write ring attention here")
