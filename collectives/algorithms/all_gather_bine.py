"""all_gather, Bine (SC'25): recursive doubling over negabinary peers, far hops first.

Semantics: ``tensor_list[i]`` on every rank ends as rank i's ``tensor``.

Communication steps: log2(N) for a power of two; log2(P) + 2 otherwise
  (P = largest power of two <= N)
Messages each rank sends: log2(N) (the fold adds one on the folded ranks)
Bytes each rank sends: (N-1) * S/N for a power of two (S/N + 2 S/N + 4 S/N + ...,
  recursive doubling's figures); with the fold, the odd ranks of folded pairs also
  send S back at the end

What changes from ``all_gather_recursive_doubling`` is who talks to whom: at step k
a rank's peer is at signed distance rho(k) = 1, -1, 3, -5, 11, ... (+rho(k) from an
even virtual rank, -rho(k) from an odd one; about two thirds of 2^k), walked from the
farthest k down to 1, so the last step, which carries half of the output, goes to a
neighbour, and the early, small messages make the long hops. This is the all-gather
half of Bine's bandwidth-optimal all-reduce, whose peers are Swing's
(``all_reduce_swing``'s second half, on its own).

Steps (virtual ranks v after the fold; L = log2 P; R(v, k) the virtual ranks v
reaches in steps k .. L-1, as in ``all_reduce_swing``):
  1. Fold (only if N is not a power of two): each of the first N-P even ranks sends
     its tensor to its odd neighbour, which stands for both (see ``_util``).
  2. Every rank keeps a working buffer of all N pieces in Swing's block order
     (``all_reduce_swing.slots``), where every R(v, k) is one contiguous run, and puts
     its own piece(s) in place.
  3. For k = L-1 down to 0: send the run R(v, k+1) (what v holds) to peer(v, k) and
     receive the peer's run R(peer, k+1) into its place: v then holds R(v, k).
  4. Unfold: the odd rank of each folded pair sends the whole buffer to its
     neighbour; every rank copies the pieces from block order into ``tensor_list``.

Worked example, N=4, rank r starts with x_r (block order: ranks 0, 3, 1, 2):

  step | pairs (distance)     | each rank then holds
  -----+----------------------+-------------------------------
    0  | 1-2, 3-0  (rho(1)=-1) | r0, r3: [x0, x3]  r1, r2: [x1, x2]
    1  | 0-1, 2-3  (rho(0)=1)  | all: [x0, x3, x1, x2]
  Recursive doubling pairs 0-2 and 1-3 for the last, larger step: two ranks apart.

Non-powers of two: the paper handles them without a fold; this module uses the
standard fold (as ``all_reduce_swing`` does), two extra steps.

Extra memory: S, the working buffer in block order (``tensor_list``'s separate
tensors are not one run).

Reference: De Sensi et al., "Bine Trees: Enhancing Collective Operations by
Optimizing Communication Locality", SC'25 (arXiv 2508.17311); the peers and block
order of De Sensi, Bonato, Saam and Hoefler, "Swing", NSDI 2024 (arXiv 2401.09356).
"""
from functools import lru_cache

from ._cost import NOTHING, Tally, pieces
from ._util import (first_real_rank, fold, fold_in, fold_out, real_rank, tally_fold_in,
                    tally_fold_out, virtual_rank)
from .all_reduce_swing import peer, run, slots

AUTO = "measured"   # recursive doubling's figures on a flat switch: its gain is locality


@lru_cache(maxsize=1024)
def layout(n):
    """(offset in pieces of each virtual rank's block in block order, of each real rank's piece)."""
    p, extra = fold(n)
    width = lambda u: (first_real_rank(u + 1, extra) if u + 1 < p else n) - first_real_rank(u, extra)  # noqa: E731
    block, at = {}, 0
    for u in slots(p):
        block[u] = at
        at += width(u)
    starts = [block[u] for u in range(p)]
    piece = [None] * n
    for u in range(p):
        for i in range(width(u)):
            piece[first_real_rank(u, extra) + i] = starts[u] + i
    order = [block[u] for u in slots(p)] + [n]
    return tuple(order), tuple(piece)


@lru_cache(maxsize=1024)
def pairs(n):
    """For each virtual rank v: per step k = 0 .. log2(P)-1 of the reduce-scatter order,
    (peer, v's run R(v, k+1), the peer's run R(peer, k+1)), runs as [lo, hi) in pieces of
    the block-order buffer. ``reduce_scatter_bine`` walks it forwards, this module backwards.
    (The runs are ``all_reduce_swing.run``'s, built level by level once per P, so ``cost``
    at N = 4096 is instant; here they are read in pieces of this buffer.)"""
    p, _ = fold(n)
    order, _ = layout(n)
    piece = lambda lo_hi: (order[lo_hi[0]], order[lo_hi[1]])  # noqa: E731
    return tuple(tuple((peer(v, k, p), piece(run(v, k + 1, p)), piece(run(peer(v, k, p), k + 1, p)))
                       for k in range(p.bit_length() - 1)) for v in range(p))


def exchanges(n):
    """[(step, virtual rank, peer, run it sends as [lo, hi) in pieces)]."""
    p, extra = fold(n)
    step0 = 1 if extra else 0
    return [(step0 + j, v, q, mine)
            for v, todo in enumerate(pairs(n))
            for j, (q, mine, _) in enumerate(reversed(todo))]


def cost(n, s, item=1):
    """S = the whole output (N pieces of S/N)."""
    if n == 1:
        return NOTHING
    p, extra = fold(n)
    c = pieces(s, n, item)[0]
    t = Tally(n)
    if extra:
        tally_fold_in(t, extra, 0, c)
    for step, v, q, (lo, hi) in exchanges(n):
        t.message(step, real_rank(v, extra), real_rank(q, extra), (hi - lo) * c)
    if extra:
        tally_fold_out(t, extra, (p.bit_length() - 1) + 1, n * c)
    for r in range(n):
        t.allocate(r, n * c)
    return t.cost()


def all_gather(comm, tensor_list, tensor):
    n, r = comm.size, comm.rank
    p, extra = fold(n)
    order, piece = layout(n)
    c = tensor.numel()
    work = tensor.new_empty(n * c)
    work[piece[r] * c:(piece[r] + 1) * c].copy_(tensor)
    v = virtual_rank(r, extra)
    if extra:
        fold_in(comm, extra, 0, tensor, work[piece[r - 1] * c:(piece[r - 1] + 1) * c])
    if v is not None:
        for j, (q, (a, b), (e, f)) in enumerate(reversed(pairs(n)[v])):
            partner = real_rank(q, extra)
            comm.sendrecv(work[a * c:b * c], partner, work[e * c:f * c], partner, (1 if extra else 0) + j)
    if extra:
        fold_out(comm, extra, (p.bit_length() - 1) + 1, work, work)
    for i, out in enumerate(tensor_list):
        out.copy_(work[piece[i] * c:(piece[i] + 1) * c])
