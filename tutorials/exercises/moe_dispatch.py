"""Exercise: dispatch tokens to their experts, one expert per rank (expert parallelism).

Build ``moe_dispatch(tokens, expert_of)``: ``tokens`` (T x H, T differs between ranks and may
be 0) are this rank's tokens and ``expert_of`` (T integers in 0..N-1) says which expert,
that is which rank, each must go to. Return ``(received, counts)``: ``received`` holds every
token of every rank whose expert is this rank, those from rank 0 first, then rank 1, ...,
and those from one rank in the order that rank had them; ``counts[j]`` is how many came
from rank j (a list or a tensor of N ints). The router decides, so the pieces are uneven:
some are empty, one expert may get everything.

Read: chapter 19, tutorials/19_expert_parallelism.md.

Hint: two rounds of the pairwise exchange of the all_to_all exercise (at step s, send to
rank + s and receive from rank - s, with ``dist.batch_isend_irecv``):
1. the counts: ``send = torch.bincount(expert_of, minlength=N)``; exchange
   ``send[j:j + 1]`` for a one-element tensor from each rank, so that every rank
   knows how many rows to receive from each;
2. the tokens: ``tokens[expert_of.argsort(stable=True)].split(send.tolist())`` gives the
   piece for each rank in order; receive into buffers of the sizes found in 1.
The piece for this rank itself needs no message: keep it.

Traffic to reach: per rank, N-1 messages of 8 bytes (the counts) and each of its tokens
sent once, to its expert's rank only (no padding to a fixed capacity): at most 2(N-1) messages.

Steps, each graded on its own: ``--step 1``, the counts per expert, exchanged
(moe_dispatch_counts.py); ``--step 2``, the tokens in uneven pieces, the counts given
(moe_dispatch_tokens.py); ``--step 3``, this exercise.

Grade it:  python -m tutorials.exercises.grade moe_dispatch
"""
import torch  # noqa: F401  (imports your solution will need)
import torch.distributed as dist  # noqa: F401


def moe_dispatch(tokens, expert_of, group=None):
    """(the tokens routed to this rank's expert, from rank 0 first; how many came from each rank)."""
    raise NotImplementedError("write the dispatch here")
