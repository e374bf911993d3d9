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

from ._cost import NOTHING, Tally
from ._util import (first_real_rank, fold, fold_in, fold_out, real_rank, split_bounds,
                    tally_fold_in, tally_fold_out, virtual_rank)


def halving_plan(vrank, p):
    """Each step of the halving: (the partner's virtual rank, blocks kept, blocks given)."""
    plan, lo, mask = [], 0, p // 2
    while mask:
        mid = lo + mask
        keep, give = ((lo, mid), (mid, mid + mask)) if vrank < mid else ((mid, mid + mask), (lo, mid))
        plan.append((vrank ^ mask, keep, give))
        lo, mask = keep[0], mask // 2
    return plan


def messages_per_step(bounds, mask, item, limit):
    """How many messages a step exchanging ``mask`` blocks is cut into, so that none
    exceeds ``limit`` bytes (one if ``limit`` is None). The same on every rank: it
    is taken from the largest run of ``mask`` blocks, the first (blocks shrink)."""
    if not limit:
        return 1
    return max(1, -(-(bounds[mask] - bounds[0]) * item // limit))


def cut(lo, hi, k):
    """Elements [lo, hi) as ``k`` messages, split as ``tensor_split`` splits."""
    b = split_bounds(hi - lo, k)
    return [(lo + b[i], lo + b[i + 1]) for i in range(k)]


def schedule(bounds, vrank, p, item, limit):
    """Per message of the halving: (partner's virtual rank, elements kept, elements given)."""
    out = []
    for partner, keep, give in halving_plan(vrank, p):
        k = messages_per_step(bounds, keep[1] - keep[0], item, limit)
        for kept, given in zip(cut(bounds[keep[0]], bounds[keep[1]], k),
                               cut(bounds[give[0]], bounds[give[1]], k)):
            out.append((partner, kept, given))
    return out


def halving_steps(bounds, p, item, limit=None):
    """How many step numbers :func:`recursive_halving` uses (one per message)."""
    return sum(messages_per_step(bounds, p >> k, item, limit) for k in range(1, p.bit_length()))


def largest_kept(bounds, vrank, p, item, limit=None):
    """Elements of the largest message virtual rank ``vrank`` receives in the halving: of a
    step's range cut into k messages (:func:`cut`), the first is the largest, ceil(L / k)."""
    best = 0
    for _, keep, _ in halving_plan(vrank, p):
        k = messages_per_step(bounds, keep[1] - keep[0], item, limit)
        best = max(best, -(-(bounds[keep[1]] - bounds[keep[0]]) // k))
    return best


def recursive_halving(comm, buf, bounds, vrank, p, extra, op, step0, limit=None, inbox=None):
    """Reduce-scatter over P virtual ranks; block v is ``buf[bounds[v]:bounds[v+1]]``.

    Each step exchanges half of the current range with the partner. With a
    ``limit`` (bytes), that half travels in messages of at most ``limit``, each
    with its own step number, each received into the same ``inbox`` and folded
    in before the next: the inbox needs room for one message only. Without
    one, the whole half is one message.
    """
    item = buf.element_size()
    if inbox is None:
        inbox = buf.new_empty(largest_kept(bounds, vrank, p, item, limit))
    for step, (partner, (a, b), (c, d)) in enumerate(schedule(bounds, vrank, p, item, limit), step0):
        got = inbox[:b - a]
        comm.sendrecv(buf[c:d], real_rank(partner, extra), got, real_rank(partner, extra), step)
        op.combine(buf[a:b], got)


def tally_recursive_halving(tally, bounds, p, extra, step0, item, limit=None):
    """Count :func:`recursive_halving` (``bounds`` in elements; allocations not included).

    A step's half of L elements goes as k messages (:func:`cut`, as ``tensor_split``): L mod k
    of L // k + 1 elements, then L // k; so a rank's step is counted at once, and message j of
    the step is largest on the rank whose (L // k, L mod k) is largest. O(P log P + messages
    per rank), not O(P x messages per rank): Rabenseifner's 1 GiB on 4,096 ranks lists about a
    thousand per rank."""
    plans = [halving_plan(v, p) for v in range(p)]
    step = step0
    for level in range(len(plans[0])):
        keep = plans[0][level][1]
        k = messages_per_step(bounds, keep[1] - keep[0], item, limit)
        most = (0, 0)                 # the largest (L // k, L mod k) of the step's halves
        for v, plan in enumerate(plans):
            partner, (a, b), (c, d) = plan[level]
            q, r = divmod(bounds[d] - bounds[c], k)
            tally.stream(real_rank(v, extra), real_rank(partner, extra), (bounds[d] - bounds[c]) * item, k if q else r)
            tally.reduce(real_rank(v, extra), (bounds[b] - bounds[a]) * item)
            most = max(most, (q, r))
        for j in range(k):
            nbytes = (most[0] + (j < most[1])) * item
            if nbytes:
                tally.largest[step + j] = max(tally.largest.get(step + j, 0), nbytes)
        step += k


def cost(n, s, item=1):
    """S = the whole input (N chunks of S/N)."""
    if n == 1:
        return NOTHING
    p, extra = fold(n)
    c = s // item // n          # elements of one chunk
    t = Tally(n)
    step = 0
    if extra:
        tally_fold_in(t, extra, step, s, reduced=True)
        step += 1
    bounds = [first_real_rank(u, extra) * c for u in range(p)] + [n * c]
    tally_recursive_halving(t, bounds, p, extra, step, item)
    step += halving_steps(bounds, p, item)
    if extra:
        tally_fold_out(t, extra, step, c * item)
    for r in range(n):
        v = virtual_rank(r, extra)
        if r < 2 * extra and r % 2:
            t.allocate(r, 2 * s)          # the input and its partner's
        else:
            t.allocate(r, s + (largest_kept(bounds, v, p, item) * item if v is not None else 0))
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
        # only the odd rank of a folded pair receives; its inbox serves the halving too
        inbox = torch.empty_like(work) if r < 2 * extra and r % 2 else None
        if fold_in(comm, extra, step, work, inbox):
            op.combine(work, inbox)
        step += 1
    if v is not None:
        bounds = [first_real_rank(u, extra) * c for u in range(p)] + [n * c]
        recursive_halving(comm, work, bounds, v, p, extra, op, step, inbox=inbox)
    step += p.bit_length() - 1   # one message per step: no limit
    mine = work[r * c:(r + 1) * c]
    if extra:
        fold_out(comm, extra, step, work[(r - 1) * c:r * c], mine)
    output.copy_(mine)
