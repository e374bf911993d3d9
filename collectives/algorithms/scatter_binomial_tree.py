"""scatter, binomial tree.

Semantics: rank i's ``tensor`` ends equal to ``scatter_list[i]`` of the root.

Communication steps: ceil(log2 N)
Messages: N-1 in all; the root sends ceil(log2 N)
Bytes the root sends: (N-1) * S (S = one rank's piece); a rank with a subtree of
  m ranks receives m*S and passes (m-1)*S on

Steps (relative rank v = (rank - root) mod N; pieces in relative order):
  1. The root lays out the pieces in relative order: piece v belongs to v.
  2. Rank v > 0 receives pieces [v, v + lowbit(v)) from its parent v - lowbit(v):
     its own piece plus those of its whole subtree.
  3. It forwards pieces [v+m, v+2m) to child v+m for m = lowbit(v)/2, ..., 1,
     the farthest (largest) subtree first, like the binomial broadcast.

Worked example, N=4, root 0 holds pieces [p0, p1, p2, p3]:

  step | messages
  -----+-------------------------------------------
    0  | 0 -> 2: [p2, p3]
    1  | 0 -> 1: [p1]        2 -> 3: [p3]

Extra memory: S on the root (the pieces laid out in one buffer), the subtree's
pieces (m x S/N) on a rank with a subtree of m ranks.

Reference: Thakur, Rabenseifner and Gropp, IJHPCA 2005 (MPICH scatter).
"""
import torch

from ._cost import NOTHING, Tally, pieces
from .broadcast_binomial_tree import binomial_tree, tally_binomial_tree


def cost(n, s, item=1):
    """S = the whole input (N pieces of S/N)."""
    if n == 1:
        return NOTHING
    m = pieces(s, n, item)[0]
    t = Tally(n)
    tally_binomial_tree(t, lambda a, b: (b - a) * m)
    for v in range(n):
        t.allocate(v, n * m if v == 0 else min(v & -v, n - v) * m)
    return t.cost()


def binomial_scatter(comm, view, root, step0=0):
    """Tree scatter where ``view(a, b)`` is this rank's buffer for relative pieces [a, b).

    On entry the root's ``view(0, N)`` holds every piece; on exit rank v's
    ``view(v, v+1)`` holds its own piece. It is the broadcast's tree: only the
    messages differ.
    """
    binomial_tree(comm, root, view, step0)


def scatter(comm, tensor, scatter_list, root):
    n = comm.size
    v = (comm.rank - root) % n
    c = tensor.numel()
    if v == 0:
        buf = torch.cat([scatter_list[(root + i) % n] for i in range(n)])
        base = 0
    else:
        subtree = min(v & -v, n - v)
        buf = tensor.new_empty(subtree * c)
        base = v
    binomial_scatter(comm, lambda a, b: buf[(a - base) * c:(b - base) * c], root)
    tensor.copy_(buf[(v - base) * c:(v - base + 1) * c])
