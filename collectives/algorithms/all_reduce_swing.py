"""all_reduce, Swing (bandwidth-optimal variant): reduce-scatter then all-gather over Swing's peers.

Semantics: every rank ends with ``op`` over all ranks' tensors, bitwise equal on
every rank: each block is reduced by one rank, in one order, and then copied.
(The paper's latency variant, whole-tensor exchanges like recursive doubling,
combines partial sums in a different order on each rank from N = 8 on, so float
SUM differs in the last bits between ranks: not built here for that reason.)

Communication steps: 2 log2(N) for a power of two; 2 log2(P) + 2 otherwise
  (P = largest power of two <= N)
Messages each rank sends: 2 log2(N)
Bytes each rank sends: 2(N-1)/N * S for a power of two (the ring's and
  Rabenseifner's figures); the fold adds S on the 2(N-P) folded ranks. Swing
  changes who talks to whom, not how much: at step k the peer is at signed
  distance rho(k) = 1, -1, 3, -5, 11, ... (|rho(k)| = (2^(k+1) +- 1)/3, about
  two thirds of recursive halving's 2^k), so on a torus the big early messages
  cross fewer links.

Steps:
  1. Fold (only if N is not a power of two): each of the first N-P even ranks
     sends its tensor to its odd neighbour, which combines it (see ``_util``).
  2. Reduce-scatter, k = 0 .. log2(P)-1: virtual rank v's peer is ``v + rho(k)``
     if v is even, ``v - rho(k)`` if odd (mod P). Let R(v, k) be the ranks v
     reaches in steps k .. log2(P)-1 (R(v, log2 P) = {v}). v sends the blocks of
     R(peer, k+1), receives and combines the blocks of R(v, k+1). After the last
     step v holds block "v" finished. The sets R(., k) form a tree (each is the
     disjoint union of two sets of the next level; the tests check P <= 256), so
     the blocks are numbered in that tree's order (``slots``): every R(v, k) is a
     contiguous run of the tensor and every message one slice.
  3. All-gather: the same steps in reverse, k = log2(P)-1 .. 0: v sends its
     finished blocks R(v, k+1) and receives the peer's R(peer, k+1).
  4. Unfold: each odd folded rank sends the result back to its even neighbour.

Worked example, N=4, SUM, x_r = [A_r, B_r, C_r, D_r]. rho = 1, -1; the block
order (``slots(4)``) is ranks 0, 3, 1, 2: rank 0 finishes A, 3 B, 1 C, 2 D.

  step | pairs     | rank 0        | rank 1        | rank 2        | rank 3
  -----+-----------+---------------+---------------+---------------+--------------
    0  | 0-1, 2-3  | sends C,D     | sends A,B     | sends A,B     | sends C,D
    1  | 1-2, 3-0  | sends B       | sends D       | sends C       | sends A
       |           | owns sum(A)   | owns sum(C)   | owns sum(D)   | owns sum(B)
    2  | 1-2, 3-0  | sends A       | sends C       | sends D       | sends B
    3  | 0-1, 2-3  | sends A,B     | sends C,D     | sends C,D     | sends A,B
  result on every rank: [sum(A), sum(B), sum(C), sum(D)]

Non-powers of two: the paper handles them without
a fold; this module uses the standard fold, which costs two extra steps of S bytes
on 2(N-P) ranks.

Extra memory: about S/2 (the largest run received, at the first step); S on the
odd rank of a folded pair (its partner's whole tensor). Unlike Rabenseifner here,
large halves are not cut into smaller messages.

Reference: De Sensi, Bonato, Saam and Hoefler, "Swing: Short-cutting Rings for
Higher Bandwidth Allreduce", NSDI 2024 (arXiv 2401.09356), section 3 (the
bandwidth-optimal algorithm: reduce-scatter then all-gather over the same peers).
"""
from functools import lru_cache

from ._cost import NOTHING, Tally
from ._util import fold, fold_in, fold_out, real_rank, split_bounds, tally_fold_in, tally_fold_out, virtual_rank

# On a flat switch Swing's figures are Rabenseifner's; what it gains is on a torus,
# which the cost model does not see: chosen only where a measured table names it.
AUTO = "measured"


def rho(k):
    """Swing's signed distance at step k: 1, -1, 3, -5, 11, ... = sum of (-2)^i, i <= k."""
    return (1 - (-2) ** (k + 1)) // 3


def peer(v, k, p):
    """The virtual rank that virtual rank ``v`` of ``p`` talks to at step ``k``."""
    return (v + rho(k)) % p if v % 2 == 0 else (v - rho(k)) % p


def reached(v, k, p):
    """R(v, k): the virtual ranks ``v`` reaches in steps k .. log2(p)-1, v included."""
    if 1 << k >= p:
        return frozenset([v])
    return reached(v, k + 1, p) | reached(peer(v, k, p), k + 1, p)


@lru_cache(maxsize=None)
def slots(p):
    """The block order: slots(p)[i] is the virtual rank that owns block i. Each
    R(v, k) is a contiguous run of it (depth-first order of the tree of sets)."""
    def order(v, k):
        if 1 << k >= p:
            return [v]
        a, b = order(v, k + 1), order(peer(v, k, p), k + 1)
        return a + b if min(a) < min(b) else b + a
    return tuple(order(0, 0))


@lru_cache(maxsize=64)
def _runs(p):
    """_runs(p)[k][v] = R(v, k) as blocks [lo, hi) in slot order, for k = 0 .. log2(p).
    Built level by level: R(v, k) is the union of R(v, k+1) and R(peer, k+1), two runs
    that meet, so its ends are theirs. O(P log P) in all, where asking ``reached`` for
    every v and k is O(P^2 log P) (cost() at N = 4096 took 164 s that way)."""
    levels = p.bit_length() - 1
    pos = {u: i for i, u in enumerate(slots(p))}
    runs = [None] * (levels + 1)
    runs[levels] = [(pos[v], pos[v] + 1) for v in range(p)]
    for k in reversed(range(levels)):
        up = runs[k + 1]
        runs[k] = [(min(up[v][0], up[q][0]), max(up[v][1], up[q][1]))
                   for v, q in ((v, peer(v, k, p)) for v in range(p))]
    return runs


def run(v, k, p):
    """R(v, k) as blocks [lo, hi) in slot order."""
    return _runs(p)[k][v]


def plan(v, p):
    """Per reduce-scatter step: (peer, blocks kept [lo, hi), blocks given [lo, hi))."""
    return [(peer(v, k, p), run(v, k + 1, p), run(peer(v, k, p), k + 1, p))
            for k in range(p.bit_length() - 1)]


def largest_received(bounds, v, p):
    """Elements of the largest run ``v`` receives (the first step's: runs shrink)."""
    return max((bounds[b] - bounds[a] for _, (a, b), _ in plan(v, p)), default=0)


def cost(n, s, item=1):
    if n == 1:
        return NOTHING
    p, extra = fold(n)
    bounds = split_bounds(s // item, p)
    t = Tally(n)
    steps = p.bit_length() - 1
    step = 0
    if extra:
        tally_fold_in(t, extra, step, s, reduced=True)
        step += 1
    for v in range(p):
        r = real_rank(v, extra)
        for k, (q, (a, b), (c, d)) in enumerate(plan(v, p)):
            t.message(step + k, r, real_rank(q, extra), (bounds[d] - bounds[c]) * item)
            t.reduce(r, (bounds[b] - bounds[a]) * item)
            # the all-gather: step k's exchange in reverse, v's finished run goes out
            t.message(step + 2 * steps - 1 - k, r, real_rank(q, extra), (bounds[b] - bounds[a]) * item)
    step += 2 * steps
    if extra:
        tally_fold_out(t, extra, step, s)
    for r in range(n):
        v = virtual_rank(r, extra)
        t.allocate(r, s if r < 2 * extra and r % 2 else item * largest_received(bounds, v, p) if v is not None else 0)
    return t.cost()


def all_reduce(comm, tensor, op):
    n, r = comm.size, comm.rank
    p, extra = fold(n)
    v = virtual_rank(r, extra)
    flat = tensor.view(-1)
    bounds = split_bounds(flat.numel(), p)
    steps = p.bit_length() - 1
    folded_receiver = r < 2 * extra and r % 2
    size = flat.numel() if folded_receiver else largest_received(bounds, v, p) if v is not None else 0
    inbox = flat.new_empty(size)
    step = 0
    if extra:
        if fold_in(comm, extra, step, flat, inbox):
            op.combine(flat, inbox)
        step += 1
    if v is not None:
        todo = plan(v, p)
        for k, (q, (a, b), (c, d)) in enumerate(todo):
            got = inbox[:bounds[b] - bounds[a]]
            partner = real_rank(q, extra)
            comm.sendrecv(flat[bounds[c]:bounds[d]], partner, got, partner, step + k)
            op.combine(flat[bounds[a]:bounds[b]], got)
        for k in reversed(range(steps)):
            q, (a, b), (c, d) = todo[k]
            partner = real_rank(q, extra)
            # the peer's finished run lands straight in place: no copy
            comm.sendrecv(flat[bounds[a]:bounds[b]], partner, flat[bounds[c]:bounds[d]], partner,
                          step + 2 * steps - 1 - k)
    step += 2 * steps
    if extra:
        fold_out(comm, extra, step, flat, flat)
