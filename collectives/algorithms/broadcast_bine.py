"""broadcast, Bine tree (binomial negabinary, SC'25): a binomial tree whose hops start short.

Semantics: every rank's ``tensor`` ends equal to the root's.

Communication steps: ceil(log2 N)
Messages: N-1 in all; the root sends ceil(log2 N), each S bytes (the binomial
  tree's figures)
Bytes each rank sends: at most ceil(log2 N) * S (the root); leaves send nothing

What changes is who talks to whom. Every holder sends to its Bine peer, at signed
distance rho(k) = 1, -1, 3, -5, 11, ... (+rho(k) from an even rank, -rho(k) from an
odd one; |rho(k)| = (2^(k+1) +- 1)/3, Swing's distances), where the binomial tree
(``broadcast_binomial_tree``) sends 2^(L-1), ..., 2, 1 hops away. A rank's label
in the negabinary system says when it is reached (the paper's "binomial
negabinary" trees). The subtrees are runs of ranks around their root, about two
thirds as wide as the binomial's, so on a network of groups (a Dragonfly's, a fat
tree's pods) fewer of the tree's edges leave a group: over every root of 128 ranks
in 4 groups of 32, 27% fewer edges cross groups than the binomial tree's
(``python -m benchmarks.paper_claims --claim bine``).

Like our binomial tree, this one sends far first (k = log2(P)-1 down to 0): the
many messages of the last steps go to near ranks. The schedule generator cited
below walks broadcast trees near first (k = 0 up); ``tree(..., far_first=False)``
builds that one, which ``benchmarks/paper_claims.py`` compares with a near-first
binomial tree.

Steps (P = largest power of two <= N; labels v = (rank - root) mod N, the root's 0):
  1. Labels 0 .. P-1 form the Bine tree on P: in step j = 0 .. log2(P)-1 every label
     holding the data sends it to its peer for k = log2(P)-1-j (v + rho(k) if v is
     even, v - rho(k) if odd, mod P).
  2. Labels P .. N-1 (only if N is not a power of two) receive in one more step from
     label v - P.
  (The paper's ranks compute their peers from their own parity, so an odd root
  first swaps with its neighbour; counting in labels relative to the root gives the
  same distances, and every root the same figures.)

Worked example, N=4, root 0 holds x (rho(1) = -1, then rho(0) = 1):

  step | messages
  -----+--------------------------------
    0  | 0 -> 3            (0 - 1 mod 4)
    1  | 0 -> 1, 3 -> 2    (0 + 1; 3 is odd: 3 - 1)
  With root 2 (labels shifted by 2): 2 -> 1, then 2 -> 3, 1 -> 0. The binomial
  tree's first hop is 2 ranks long (0 -> 2); here every hop is 1.

Extra memory: none.

Reference: De Sensi et al., "Bine Trees: Enhancing Collective Operations by
Optimizing Communication Locality", SC'25 (arXiv 2508.17311). The peer rule as in a
public Python schedule generator for Bine trees (``get_peer``, ``build_tree_bine_flat``),
read for this module; that generator walks broadcast trees near hops first, swaps an
odd root with its neighbour, and hangs the ranks a non-power of two leaves out on their
last-step peers, where this module hangs ranks P .. N-1 off labels 0 .. N-P-1.
"""
from functools import lru_cache

from ._cost import NOTHING, Tally
from .all_reduce_swing import rho

AUTO = "measured"   # the binomial tree's figures on a flat switch: its gain is locality


def bine_peer(v, k, p):
    """The label that label ``v`` of a power-of-two ``p`` talks to in step ``k``."""
    return (v + rho(k)) % p if v % 2 == 0 else (v - rho(k)) % p


@lru_cache(maxsize=1024)
def tree(n, root, far_first=True):
    """{rank: (parent rank, step)} of the Bine tree from ``root`` on ``n`` ranks (root absent)."""
    p = 1 << (n.bit_length() - 1)
    levels = p.bit_length() - 1
    parent = {}
    holders = [0]
    for step in range(levels):
        k = levels - 1 - step if far_first else step
        for v in list(holders):
            u = bine_peer(v, k, p)
            parent[u] = (v, step)
            holders.append(u)
    for v in range(p, n):
        parent[v] = (v - p, levels)
    real = lambda v: (v + root) % n  # noqa: E731
    return {real(v): (real(q), k) for v, (q, k) in parent.items()}


@lru_cache(maxsize=1024)
def children(n, root, far_first=True):
    """{rank: [(child rank, step), ...] in step order}."""
    out = {}
    for v, (q, k) in sorted(tree(n, root, far_first).items(), key=lambda item: item[1][1]):
        out.setdefault(q, []).append((v, k))
    return out


def cost(n, s, item=1):
    if n == 1:
        return NOTHING
    t = Tally(n)
    for v, (q, k) in tree(n, 0).items():
        t.message(k, q, v, s)
    return t.cost()


def broadcast(comm, tensor, root, far_first=True, step0=0):
    n, r = comm.size, comm.rank
    up = tree(n, root, far_first).get(r)
    if up is not None:
        comm.recv(tensor, up[0], step0 + up[1])
    for child, k in children(n, root, far_first).get(r, ()):
        comm.send(tensor, child, step0 + k)
