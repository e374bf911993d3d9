"""Exercise, step 2 of 3 of ring_attention: fold one block into the attention (the online softmax).

Build ``ring_attention_merge(o, m, l, s, v)``: one rank's running state for its query rows,
after some blocks of keys, is ``m`` (R: each row's largest score so far), ``l`` (R: the sum
of exp(score - m) over those scores) and ``o`` (R x d_v: the sum of exp(score - m) times each
score's value row, not yet divided by l), so that ``o / l`` is softmax attention over the
blocks seen. A new block arrives: ``s`` (R x K: its scores, q @ k.T / sqrt(d), already
computed) and ``v`` (K x d_v: its values). Return the new ``(o, m, l)``, so that ``o / l`` is
the attention over every block seen and this one. Leave ``s`` and ``v`` as they were. No
message: the grader calls it in this process on runs of 1 to 5 blocks, starting from o = 0,
m = -inf, l = 0 (a run of one block) or from the state after a first block it folded in itself
(your merge sees only that block's (o, m, l), as step 3 will), and compares ``o / l`` after
every merge with torch's ``softmax(S) @ V`` over the blocks so far (float64), then ``m`` and
``l`` with their definitions. One case has scores in the thousands: exp of a score past 709
overflows float64.

Read: chapter 20, tutorials/20_context_parallelism.md, "The forward pass" (the online softmax).

Hint: rescale what was summed under the old maximum. The new maximum is ``m_new =
torch.maximum(m, s.amax(-1))``; exponentiate relative to it, ``p = torch.exp(s -
m_new.unsqueeze(-1))`` (never exp(s): it overflows), and multiply the old sums by ``fade =
torch.exp(m - m_new)`` (at most 1; 0 for the first block, where m = -inf): ``l = l * fade +
p.sum(-1)``, ``o = o * fade.unsqueeze(-1) + p @ v``.

Traffic to reach: none (step 1 moved the blocks; step 3, ring_attention, merges each block as
it arrives).

Grade it:  python -m tutorials.exercises.grade ring_attention --step 2
"""
import torch  # noqa: F401  (imports your solution will need)


def ring_attention_merge(o, m, l, s, v):
    """(o, m, l) with one more block of scores s and values v folded in by the online softmax."""
    raise NotImplementedError("write the online-softmax merge of one block here")
