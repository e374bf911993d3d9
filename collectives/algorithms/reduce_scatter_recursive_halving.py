"""reduce_scatter, recursive halving.

Semantics: rank r ends with ``output = op(input_list[r] of every rank)``.

Communication steps: log2(N) for a power of two; log2(P) + 2 otherwise
Messages each rank sends: log2(N)
Bytes each rank sends: (N-1)/N * S for a power of two (S/2 + S/4 + ... + S/N);
  with the fold the N-P folded ranks also send S once

Steps (N a power of two; otherwise fold first, see ``_util``):
  1. Copy the input chunks into one working buffer. Each virtual rank owns a
     block of it: its own chunk, or the two chunks of a folded pair.
  2. For mask = N/2, N/4, ..., 1: the current range of blocks is split in
     half; send the half that the partner ``v XOR mask`` keeps, receive the
     partner's copy of the half you keep, combine. The range halves each step.
  3. Afterwards the block of rank v holds the result; unfold: odd ranks send
     their even neighbour its chunk.

Worked example, N=4, SUM, rank r holds chunks [a_r, b_r, c_r, d_r]:

  step | partner | rank 0 keeps   | rank 1 keeps   | rank 2 keeps | rank 3 keeps
  -----+---------+----------------+----------------+--------------+-------------
    0  |  r^2    | a,b (+ from 2) | a,b (+ from 3) | c,d (+ 0)    | c,d (+ 1)
    1  |  r^1    | a (+ from 1)   | b (+ from 0)   | c (+ 3)      | d (+ 2)
  result: rank 0 has a0+a1+a2+a3, rank 1 b..., rank 2 c..., rank 3 d...

Extra memory: S for the concatenated input (``input_list`` stays unchanged,
as torch's does), plus the largest half received in one step (about S/2),
or S on the odd rank of a folded pair, which receives its partner's whole input.

Reference: Thakur, Rabenseifner and Gropp, IJHPCA 2005, section 4.
"""
import torch

from ._cost import NOTHING, Tally, pieces
from ._util import (first_real_rank, fold, fold_in, fold_out, real_rank, tally_fold_in,
                    tally_fold_out, virtual_rank)


def halving_plan(vrank, p):
    """Each step of the halving: (the partner's virtual rank, blocks kept, blocks given)."""
    plan, lo, mask = [], 0, p // 2
    while mask:
        mid = lo + mask
        keep, give = ((lo, mid), (mid, mid + mask)) if vrank < mid else ((mid, mid + mask), (lo, mid))
        plan.append((vrank ^ mask, keep, give))
        lo, mask = keep[0], mask // 2
    return plan


def cut(blocks, group):
    """The blocks [a, b) as messages of at most ``group`` blocks each."""
    a, b = blocks
    return [(x, min(x + group, b)) for x in range(a, b, group)]


def largest_kept(bounds, vrank, p, group):
    """Elements of the largest message virtual rank ``vrank`` receives in the halving."""
    return max((bounds[b] - bounds[a] for _, keep, _ in halving_plan(vrank, p)
                for a, b in cut(keep, group)), default=0)


def recursive_halving(comm, buf, bounds, vrank, p, extra, op, step0, group=None, inbox=None):
    """Reduce-scatter over P virtual ranks; block v is ``buf[bounds[v]:bounds[v+1]]``.

    Each step's half travels in messages of ``group`` blocks (by default the
    whole half in one), each with its own step number, and each is received
    into the same ``inbox`` and folded in before the next one: the inbox needs
    room for one message only. Returns the step after the last one used.
    """
    group = group or p
    if inbox is None:
        inbox = buf.new_empty(largest_kept(bounds, vrank, p, group))
    step = step0
    for partner, keep, give in halving_plan(vrank, p):
        partner = real_rank(partner, extra)
        for (a, b), (c, d) in zip(cut(keep, group), cut(give, group)):
            kept = buf[bounds[a]:bounds[b]]
            got = inbox[:kept.numel()]
            comm.sendrecv(buf[bounds[c]:bounds[d]], partner, got, partner, step)
            op.combine(kept, got)
            step += 1
    return step


def halving_steps(p, group=None):
    """How many step numbers :func:`recursive_halving` uses."""
    group = group or p
    return sum(-(-(p >> k) // group) for k in range(1, p.bit_length()))


def tally_recursive_halving(tally, bounds, p, extra, step0, group=None):
    """Count :func:`recursive_halving` with ``bounds`` in bytes (allocations not included)."""
    group = group or p
    for v in range(p):
        step = step0
        for partner, keep, give in halving_plan(v, p):
            for (a, b), (c, d) in zip(cut(keep, group), cut(give, group)):
                tally.message(step, real_rank(v, extra), real_rank(partner, extra), bounds[d] - bounds[c])
                tally.reduce(real_rank(v, extra), bounds[b] - bounds[a])
                step += 1


def cost(n, s, item=1):
    """S = the whole input (N chunks of S/N)."""
    if n == 1:
        return NOTHING
    p, extra = fold(n)
    c = pieces(s, n, item)[0]
    t = Tally(n)
    step = 0
    if extra:
        tally_fold_in(t, extra, step, s)
        for i in range(extra):
            t.reduce(2 * i + 1, s)
        step += 1
    bounds = [first_real_rank(u, extra) * c for u in range(p)] + [n * c]
    tally_recursive_halving(t, bounds, p, extra, step)
    step += halving_steps(p)
    if extra:
        tally_fold_out(t, extra, step, c)
    for r in range(n):
        v = virtual_rank(r, extra)
        folded_receiver = r < 2 * extra and r % 2
        t.allocate(r, s + (s if folded_receiver else largest_kept(bounds, v, p, p) if v is not None else 0))
    return t.cost()


def reduce_scatter(comm, output, input_list, op):
    n, r = comm.size, comm.rank
    p, extra = fold(n)
    c = output.numel()
    work = torch.cat(input_list)
    v = virtual_rank(r, extra)
    step = 0
    inbox = None
    if extra:
        inbox = torch.empty_like(work) if r < 2 * extra and r % 2 else None
        if fold_in(comm, extra, step, work, inbox):
            op.combine(work, inbox)
        step += 1
    if v is not None:
        bounds = [first_real_rank(u, extra) * c for u in range(p)] + [n * c]
        recursive_halving(comm, work, bounds, v, p, extra, op, step, inbox=inbox)
    step += halving_steps(p)
    mine = work[r * c:(r + 1) * c]
    if extra:
        fold_out(comm, extra, step, work[(r - 1) * c:r * c], mine)
    output.copy_(mine)
