"""all_reduce, Swing (latency-optimal variant).

Semantics: every rank ends with ``op`` over all ranks' tensors. (Unlike
recursive doubling, ranks combine the partial results in different orders from
N = 8 on, so with floating-point SUM the ranks may differ in the last bits;
integers, MIN and MAX are exact.)

Communication steps: log2(N) for a power of two; log2(P) + 2 otherwise
  (P = largest power of two <= N)
Messages each rank sends: log2(N), each S bytes
Bytes each rank sends: log2(N) * S  (recursive doubling's figures: Swing changes
  who talks to whom, not how much, so that on a torus every step's peer is as
  close as possible: |rho(k)| = (2^(k+1) +- 1)/3 hops, about
  two thirds of recursive doubling's 2^k)

Steps:
  1. Fold (only if N is not a power of two): each of the first N-P even ranks
     sends its tensor to its odd neighbour, which combines it (see ``_util``).
  2. For k = 0, 1, ..., log2(P)-1: with rho(k) = sum_{i<=k} (-2)^i
     = 1, -1, 3, -5, 11, ..., virtual rank v exchanges the whole tensor with
     ``v + rho(k)`` if v is even, ``v - rho(k)`` if odd (mod P), and combines.
     The peers' reached sets never overlap (the paper proves it; the tests
     check it for P <= 128), so after
     log2(P) steps every rank has combined every tensor exactly once.
  3. Unfold: each odd rank sends the result back to its even neighbour.

Worked example, N=4, SUM, rank r starts with x_r:

  step | rho | pairs     | after the step
  -----+-----+-----------+---------------------------------------------
    0  |  1  | 0-1, 2-3  | r0, r1: x0+x1      r2, r3: x2+x3
    1  | -1  | 1-2, 3-0  | all: (x0+x1) + (x2+x3)

Non-powers of two: the paper handles them without a fold; this module uses the
standard fold instead, which costs two extra steps of S bytes on 2(N-P) ranks.

Extra memory: S (the partner's whole tensor, as in recursive doubling).

Reference: De Sensi, Bonato, Saam and Hoefler, "Swing: Short-cutting Rings for
Higher Bandwidth Allreduce", NSDI 2024 (arXiv 2401.09356).
"""
from ._cost import NOTHING, Tally
from ._util import fold, fold_in, fold_out, real_rank, tally_fold_in, tally_fold_out, virtual_rank

# On a flat switch Swing's figures are recursive doubling's; what it gains is on a torus,
# which the cost model does not see: chosen only where a measured table names it.
AUTO = "measured"


def rho(k):
    """Swing's signed distance at step k: 1, -1, 3, -5, 11, ... = sum of (-2)^i, i <= k."""
    return (1 - (-2) ** (k + 1)) // 3


def peer(v, k, p):
    """The virtual rank that virtual rank ``v`` of ``p`` talks to at step ``k``."""
    return (v + rho(k)) % p if v % 2 == 0 else (v - rho(k)) % p


def cost(n, s, item=1):
    if n == 1:
        return NOTHING
    p, extra = fold(n)
    t = Tally(n)
    step = 0
    if extra:
        tally_fold_in(t, extra, step, s)
        for i in range(extra):
            t.reduce(2 * i + 1, s)
        step += 1
    for k in range(p.bit_length() - 1):
        for v in range(p):
            t.message(step, real_rank(v, extra), real_rank(peer(v, k, p), extra), s)
            t.reduce(real_rank(v, extra), s)
        step += 1
    if extra:
        tally_fold_out(t, extra, step, s)
    for r in range(n):
        t.allocate(r, s)
    return t.cost()


def all_reduce(comm, tensor, op):
    n, r = comm.size, comm.rank
    p, extra = fold(n)
    inbox = tensor.new_empty(tensor.shape)
    v = virtual_rank(r, extra)
    step = 0
    if extra:
        if fold_in(comm, extra, step, tensor, inbox):
            op.combine(tensor, inbox)
        step += 1
    if v is not None:
        for k in range(p.bit_length() - 1):
            partner = real_rank(peer(v, k, p), extra)
            comm.sendrecv(tensor, partner, inbox, partner, step)
            op.combine(tensor, inbox)
            step += 1
    else:
        step += p.bit_length() - 1
    if extra:
        fold_out(comm, extra, step, tensor, tensor)
