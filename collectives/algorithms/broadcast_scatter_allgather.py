"""broadcast, scatter + all-gather (van de Geijn): the long-message broadcast.

Semantics: every rank's ``tensor`` ends equal to the root's.

Communication steps: ceil(log2 N) + N-1
Bytes each rank sends: about 2 (N-1)/N * S: the root sends (N-1)/N * S in the
  scatter, every rank (N-1)/N * S in the all-gather; no rank sends S more than
  twice, whatever N is (linear: the root sends (N-1)*S; binomial: log2(N)*S)

Steps:
  1. Cut the tensor into N pieces; piece v belongs to relative rank v = (rank - root) mod N.
  2. Binomial-tree scatter: each rank receives its piece (``scatter_binomial_tree``).
  3. Ring all-gather of the pieces (``all_gather_ring``): every rank gets all.

Worked example, N=4, root 0 holds x = [p0, p1, p2, p3]:

  step | messages
  -----+-----------------------------------------------
    0  | 0 -> 2: [p2, p3]                           (scatter)
    1  | 0 -> 1: p1, 2 -> 3: p3                     (scatter)
    2  | 0 -> 1: p0, 1 -> 2: p1, 2 -> 3: p2, 3 -> 0: p3   (ring)
    3  | ring continues, each forwards what it got
    4  | ring ends: every rank holds [p0, p1, p2, p3]

Reference: Barnett, Shuler, van de Geijn, Gupta, Payne and Watts,
"Interprocessor collective communication library (InterCom)", SHPCC 1994;
Thakur, Rabenseifner and Gropp, IJHPCA 2005.

Extra memory: none (the pieces are slices of the tensor).
"""
from ._cost import NOTHING, Tally
from ._util import ceil_log2, split_bounds
from .all_gather_ring import ring_all_gather, tally_ring_all_gather
from .broadcast_binomial_tree import tally_binomial_tree
from .scatter_binomial_tree import binomial_scatter


def cost(n, s, item=1):
    if n == 1:
        return NOTHING
    bounds = [b * item for b in split_bounds(s // item, n)]
    t = Tally(n)
    tally_binomial_tree(t, lambda a, b: bounds[b] - bounds[a])
    tally_ring_all_gather(t, [bounds[i + 1] - bounds[i] for i in range(n)], step0=ceil_log2(n))
    return t.cost()


def broadcast(comm, tensor, root):
    n = comm.size
    bounds = split_bounds(tensor.numel(), n)
    binomial_scatter(comm, lambda a, b: tensor[bounds[a]:bounds[b]], root)
    pieces = [tensor[bounds[(r - root) % n]:bounds[(r - root) % n + 1]] for r in range(n)]
    ring_all_gather(comm, pieces, step0=ceil_log2(n))
