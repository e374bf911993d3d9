"""Exercise, step 2 of 3 of moe_dispatch: send the tokens to their experts, in uneven pieces.

Build ``moe_dispatch_tokens(tokens, expert_of, send, recv)``: ``tokens`` (T x H) are this
rank's tokens, ``expert_of`` (T integers in 0..N-1) the expert, that is the rank, of each;
``send`` and ``recv`` are step 1's counts (given: ``send[j]`` rows go to rank j, ``recv[j]``
rows come from rank j). Return ``received``: every token of every rank whose expert is this
rank, those from rank 0 first, then rank 1, ..., those from one rank in the order that rank
had them. The router decides, so the pieces are uneven: some are empty, one expert may get
everything.

Read: chapter 19, tutorials/19_expert_parallelism.md.

Hint: sort the tokens by expert, keeping each expert's rows in their order
(``tokens[expert_of.argsort(stable=True)]``), and cut the sorted rows into the pieces for
each rank (``.split(send.tolist())``): piece j goes to rank j. Receive from each rank j into
a buffer of ``recv[j]`` rows (``tokens.new_empty((int(recv[j]), H))``), pairwise as in step
1, and concatenate the buffers in rank order. The piece for this rank needs no message: copy it.

Traffic to reach: each token sent once, to its expert's rank only (no padding to a fixed
capacity), in N-1 messages per rank.

Grade it:  python -m tutorials.exercises.grade moe_dispatch --step 2
"""
import torch  # noqa: F401  (imports your solution will need)
import torch.distributed as dist  # noqa: F401


def moe_dispatch_tokens(tokens, expert_of, send, recv, group=None):
    """The tokens routed to this rank's expert, rank 0's first, sent in pieces of the sizes counted."""
    raise NotImplementedError("write the dispatch of the tokens here")
