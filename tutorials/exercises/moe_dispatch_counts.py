"""Exercise, step 1 of 3 of moe_dispatch: count the tokens per expert and exchange the counts.

Build ``moe_dispatch_counts(expert_of)``: ``expert_of`` (T integers in 0..N-1, T differs
between ranks and may be 0) says which expert, that is which rank, each of this rank's tokens
goes to. Return ``(send, recv)``, two tensors of N ints: ``send[j]`` is how many of this rank's
tokens go to expert j, ``recv[j]`` how many of rank j's tokens come to this rank's expert. No
token moves yet: step 2 sends them, in pieces of exactly these sizes.

Read: chapter 19, tutorials/19_expert_parallelism.md.

Hint: count with ``send = torch.bincount(expert_of, minlength=N)`` (without minlength it stops at the
highest expert used). Rank j's ``send[r]`` is rank r's ``recv[j]``: exchange them pairwise, as
in the all_to_all exercise: at step s = 1 .. N-1 send ``send[r + s]`` (a one-element slice,
``send[to:to + 1]``) to rank r + s and receive ``recv[r - s]`` from rank r - s (mod N), posted
together (``dist.batch_isend_irecv``). ``recv[r] = send[r]``: this rank's own count needs no
message.

Traffic to reach: N-1 messages of 8 bytes per rank.

Grade it:  python -m tutorials.exercises.grade moe_dispatch --step 1
"""
import torch  # noqa: F401  (imports your solution will need)
import torch.distributed as dist  # noqa: F401


def moe_dispatch_counts(expert_of, group=None):
    """(send, recv): tokens this rank sends to each expert, tokens each rank sends to this rank's expert."""
    raise NotImplementedError("write the count and its exchange here")
