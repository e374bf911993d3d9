"""reduce, Bine tree (binomial negabinary, SC'25): the Bine broadcast's tree, run backwards.

Semantics: ``tensor`` on the root ends as ``op`` over every rank's ``tensor``; the
other ranks' tensors are left unchanged.

Communication steps: ceil(log2 N)
Messages: N-1 in all; the root receives ceil(log2 N), each S bytes
Bytes each rank sends: S (every rank but the root, once); the root combines
  ceil(log2 N) * S

Steps (the tree of ``broadcast_bine``: labels v = (rank - root) mod N, P the largest
power of two <= N, L = ceil(log2 N); the broadcast's step k is the reduce's step
L-1-k):
  1. Labels P .. N-1 (N not a power of two) send their tensor to label v - P.
  2. For the broadcast's steps, last first: every label that received the broadcast
     in that step (from its peer at distance rho(k), k = 0, 1, ..., log2(P)-1: 1, -1,
     3, -5, 11, ..., near first) sends its partial result back to that peer, which
     combines it into its own.
  A rank combines its children's partials in a fixed order (latest broadcast step
  first), so the result's rounding is the same in every run.

Worked example, N=4, SUM, root 0, rank r holds x_r:

  step | messages                  | partial results
  -----+---------------------------+--------------------------------
    0  | 1 -> 0, 2 -> 3            | rank 0: x0+x1, rank 3: x3+x2
    1  | 3 -> 0                    | rank 0: (x0+x1)+(x3+x2)

Extra memory: S to receive into on every rank with children, and S more on a
non-root one (a copy of its own tensor to combine into: inputs stay unchanged).

Reference: De Sensi et al., "Bine Trees: Enhancing Collective Operations by
Optimizing Communication Locality", SC'25 (arXiv 2508.17311).
"""
from ._cost import NOTHING, Tally
from ._util import ceil_log2
from .broadcast_bine import children, tree

AUTO = "measured"   # the binomial tree's figures on a flat switch: its gain is locality


def cost(n, s, item=1):
    if n == 1:
        return NOTHING
    t = Tally(n)
    last = ceil_log2(n) - 1
    for v, (q, k) in tree(n, 0).items():
        t.message(last - k, v, q, s)
        t.reduce(q, s)
    for q in children(n, 0):
        t.allocate(q, s if q == 0 else 2 * s)
    return t.cost()


def reduce(comm, tensor, root, op, keep_input=True):
    """``keep_input=False``: combine into ``tensor`` on every rank (``all_reduce_bine``,
    which overwrites it anyway), saving the copy."""
    n, r = comm.size, comm.rank
    last = ceil_log2(n) - 1
    below = children(n, root).get(r, ())
    acc = tensor
    if below:
        inbox = tensor.new_empty(tensor.shape)
        if r != root and keep_input:
            acc = tensor.clone()   # a non-root's own tensor must stay unchanged
        for child, k in reversed(below):
            comm.recv(inbox, child, last - k)
            op.combine(acc, inbox)
    up = tree(n, root).get(r)
    if up is not None:
        comm.send(acc, up[0], last - up[1])
