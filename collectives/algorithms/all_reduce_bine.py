"""all_reduce, Bine trees: a Bine reduce to rank 0, then a Bine broadcast from it.

Semantics: every rank ends with ``op`` over all ranks' tensors, bitwise equal on
every rank: one rank (0) combines everything, in one fixed order, and then the result
is copied out.

Communication steps: 2 ceil(log2 N)
Messages each rank sends: at most 2 ceil(log2 N) (rank 0 receives ceil(log2 N) and
  sends as many)
Bytes each rank sends: at most ceil(log2 N) * S (rank 0, in the broadcast); every
  other rank S up the tree plus S to each of its broadcast children

This is the latency-oriented Bine all-reduce: whole tensors over the Bine trees of
``reduce_bine`` and ``broadcast_bine``, whose hops start far but are about two thirds
of the binomial tree's (``all_reduce_tree``'s) lengths, so more of them stay inside a
group of nearby ranks. (Bine's bandwidth-optimal all-reduce, a reduce-scatter and an
all-gather over the same negabinary peers with blocks renumbered so that each message
is one run, is the communication pattern of ``all_reduce_swing``: the Bine schedule
generator cited in ``broadcast_bine`` picks the peer v + rho(k) from an even rank and
v - rho(k) from an odd one, exactly Swing's rule, so it is not registered twice.)

Steps (L = ceil(log2 N)):
  1. Steps 0 .. L-1: ``reduce_bine`` to rank 0, combining in place (every tensor is
     overwritten in step 2 anyway).
  2. Steps L .. 2L-1: ``broadcast_bine`` from rank 0.

Worked example, N=4, SUM, rank r holds x_r:

  step | messages           | after the step
  -----+--------------------+--------------------------------------
    0  | 1 -> 0, 2 -> 3     | rank 0: x0+x1, rank 3: x3+x2
    1  | 3 -> 0             | rank 0: s = (x0+x1)+(x3+x2)
    2  | 0 -> 3             | rank 3: s
    3  | 0 -> 1, 3 -> 2     | every rank: s

Extra memory: S to receive into on every rank with children in the reduce tree.

Reference: De Sensi et al., "Bine Trees: Enhancing Collective Operations by
Optimizing Communication Locality", SC'25 (arXiv 2508.17311).
"""
from ._cost import NOTHING, Tally
from ._util import ceil_log2
from .broadcast_bine import broadcast, children, tree
from .reduce_bine import reduce

AUTO = "measured"   # on a flat switch it is the binomial tree's figures; its gain is locality


def cost(n, s, item=1):
    if n == 1:
        return NOTHING
    t = Tally(n)
    levels = ceil_log2(n)
    for v, (q, k) in tree(n, 0).items():
        t.message(levels - 1 - k, v, q, s)
        t.reduce(q, s)
        t.message(levels + k, q, v, s)
    for q in children(n, 0):
        t.allocate(q, s)
    return t.cost()


def all_reduce(comm, tensor, op):
    reduce(comm, tensor, 0, op, keep_input=False)
    broadcast(comm, tensor, 0, step0=ceil_log2(comm.size))
