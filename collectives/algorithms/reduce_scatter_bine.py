"""reduce_scatter, Bine (SC'25): recursive halving over negabinary peers, near hops first.

Semantics: rank r ends with ``output = op(input_list[r] of every rank)``.

Communication steps: log2(N) for a power of two; log2(P) + 2 otherwise
  (P = largest power of two <= N)
Messages each rank sends: log2(N) (the fold adds one on the folded ranks)
Bytes each rank sends: (N-1)/N * S for a power of two (S/2 + S/4 + ... + S/N,
  recursive halving's figures); with the fold the N-P folded ranks also send S once

What changes from ``reduce_scatter_recursive_halving`` is who talks to whom: at step
k a rank's peer is at signed distance rho(k) = 1, -1, 3, -5, 11, ... (+rho(k) from an
even virtual rank, -rho(k) from an odd one), k = 0 first, so the first step, which
carries half of the input, goes to a neighbour, and only the small late messages make
the long hops. This is the reduce-scatter half of Bine's bandwidth-optimal
all-reduce, whose peers are Swing's (``all_reduce_swing``'s first half, on its own).

Steps (virtual ranks v after the fold; L = log2 P; R(v, k) the virtual ranks v
reaches in steps k .. L-1, as in ``all_reduce_swing``):
  1. Copy the input chunks into one working buffer in Swing's block order
     (``all_reduce_swing.slots``, the layout of ``all_gather_bine``), where every
     R(v, k) is one contiguous run. Each virtual rank owns a block of it: its own
     chunk, or the two chunks of a folded pair.
  2. Fold (only if N is not a power of two): each of the first N-P even ranks sends
     its whole buffer to its odd neighbour, which combines it into its own.
  3. For k = 0 .. L-1: send the run R(peer(v, k), k+1) to peer(v, k), receive the
     peer's partial sums of the run R(v, k+1), combine them into your own. After the
     last step v's own block holds the result.
  4. Unfold: the odd rank of each folded pair sends its neighbour that one's chunk.

Worked example, N=4, SUM, rank r holds chunks [a_r, b_r, c_r, d_r] (block order:
ranks 0, 3, 1, 2, so the buffer is [a, d, b, c]):

  step | pairs (distance)     | rank 0 keeps  | rank 1 keeps | rank 2 keeps | rank 3 keeps
  -----+----------------------+---------------+--------------+--------------+-------------
    0  | 0-1, 2-3  (rho(0)=1)  | a,d (+ 1)     | b,c (+ 0)    | b,c (+ 3)    | a,d (+ 2)
    1  | 3-0, 1-2  (rho(1)=-1) | a (+ 3)       | b (+ 2)      | c (+ 1)      | d (+ 0)
  result: rank 0 has a0+a1+a2+a3, rank 1 b..., rank 2 c..., rank 3 d...
  Recursive halving's first, largest step pairs 0-2 and 1-3: two ranks apart.

Non-powers of two: the paper handles them without a fold; this module uses the
standard fold (as ``all_reduce_swing`` does), two extra steps.

Extra memory: S for the input in block order (``input_list`` stays unchanged, as
torch's does), plus the largest run received in one step (about S/2), or S on the
odd rank of a folded pair, which receives its partner's whole input.

Reference: De Sensi et al., "Bine Trees: Enhancing Collective Operations by
Optimizing Communication Locality", SC'25 (arXiv 2508.17311); the peers and block
order of De Sensi, Bonato, Saam and Hoefler, "Swing", NSDI 2024 (arXiv 2401.09356).
"""
import torch

from ._cost import NOTHING, Tally
from ._util import fold, fold_in, fold_out, real_rank, tally_fold_in, tally_fold_out, virtual_rank
from .all_gather_bine import layout, pairs

AUTO = "measured"   # recursive halving's figures on a flat switch: its gain is locality


def largest_kept(n, v):
    """Pieces of the largest run virtual rank ``v`` receives (the first step's: runs shrink)."""
    return max((b - a for _, (a, b), _ in pairs(n)[v]), default=0)


def cost(n, s, item=1):
    """S = the whole input (N chunks of S/N)."""
    if n == 1:
        return NOTHING
    p, extra = fold(n)
    c = s // item // n * item   # bytes of one chunk
    t = Tally(n)
    step0 = 1 if extra else 0
    if extra:
        tally_fold_in(t, extra, 0, s, reduced=True)
    for v, todo in enumerate(pairs(n)):
        r = real_rank(v, extra)
        for k, (q, (a, b), (e, f)) in enumerate(todo):
            t.message(step0 + k, r, real_rank(q, extra), (f - e) * c)
            t.reduce(r, (b - a) * c)
    if extra:
        tally_fold_out(t, extra, step0 + p.bit_length() - 1, c)
    for r in range(n):
        v = virtual_rank(r, extra)
        if r < 2 * extra and r % 2:
            t.allocate(r, 2 * s)          # the input and its partner's
        else:
            t.allocate(r, s + (largest_kept(n, v) * c if v is not None else 0))
    return t.cost()


def reduce_scatter(comm, output, input_list, op):
    n, r = comm.size, comm.rank
    p, extra = fold(n)
    _, piece = layout(n)
    c = output.numel()
    at = sorted(range(n), key=piece.__getitem__)     # the rank whose chunk is at each position
    work = torch.cat([input_list[i] for i in at])
    v = virtual_rank(r, extra)
    step0 = 1 if extra else 0
    inbox = None
    if extra:
        # only the odd rank of a folded pair receives; its inbox serves the halving too
        inbox = torch.empty_like(work) if r < 2 * extra and r % 2 else None
        if fold_in(comm, extra, 0, work, inbox):
            op.combine(work, inbox)
    if v is not None:
        if inbox is None:
            inbox = work.new_empty(largest_kept(n, v) * c)
        for k, (q, (a, b), (e, f)) in enumerate(pairs(n)[v]):
            got = inbox[:(b - a) * c]
            partner = real_rank(q, extra)
            comm.sendrecv(work[e * c:f * c], partner, got, partner, step0 + k)
            op.combine(work[a * c:b * c], got)
    mine = work[piece[r] * c:(piece[r] + 1) * c]
    if extra:
        fold_out(comm, extra, step0 + p.bit_length() - 1, work[piece[r - 1] * c:(piece[r - 1] + 1) * c]
                 if r % 2 else mine, mine)
    output.copy_(mine)
