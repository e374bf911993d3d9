"""scatter, Bine tree (binomial negabinary, SC'25): the Bine broadcast's tree, splitting.

Semantics: rank i's ``tensor`` ends equal to ``scatter_list[i]`` of the root.

Communication steps: ceil(log2 N)
Messages: N-1 in all; the root sends ceil(log2 N)
Bytes the root sends: (N-1) * S/N (S = the whole input, N pieces); a rank whose
  subtree has m ranks receives m * S/N and passes (m-1) * S/N on (the binomial tree's
  figures)

What changes from ``scatter_binomial_tree`` is who talks to whom: the tree is
``broadcast_bine``'s, whose hops are signed negabinary distances rho(k) = 1, -1, 3,
-5, 11, ... instead of 2^k, so about two thirds as long, and more of the subtrees'
bytes stay inside a group of nearby ranks. On a power of two every subtree is a run
of consecutive ranks around its root (mod N), which the paper uses to send each
subtree straight from the root's buffer in rank order; here the root lays the pieces
out once in the tree's pre-order (each rank, then each child's subtree), so a subtree
is one range of the buffer at any N.

Steps (the tree of ``broadcast_bine``: labels v = (rank - root) mod N, P the largest
power of two <= N):
  1. The root lays out the pieces in the tree's pre-order.
  2. In step j = 0 .. log2(P)-1 every rank holding its subtree's pieces sends to its
     child at signed distance rho(k), k = log2(P)-1-j (far first), the pieces of that
     child's subtree, one message; the child receives them into a buffer of its
     subtree's size (a leaf: straight into ``tensor``).
  3. Labels P .. N-1 (N not a power of two) receive their piece in one more step
     from label v - P.
  4. Every rank with children copies its own piece, the front of its buffer, into
     ``tensor``.

Worked example, N=4, root 0 holds pieces [p0, p1, p2, p3] (tree: 0 -> 3 in step 0,
then 0 -> 1 and 3 -> 2; pre-order 0, 3, 2, 1):

  step | messages
  -----+-------------------------------------------
    0  | 0 -> 3: [p3, p2]
    1  | 0 -> 1: [p1]        3 -> 2: [p2]
  The binomial tree's first hop 0 -> 2 is two ranks long; every hop here is one.

Extra memory: S on the root (the pieces laid out in one buffer), the subtree's pieces
(m x S/N) on a non-root rank with children (a subtree of m > 1 ranks).

Reference: De Sensi et al., "Bine Trees: Enhancing Collective Operations by
Optimizing Communication Locality", SC'25 (arXiv 2508.17311); the scatter as the
binomial one of Thakur, Rabenseifner and Gropp, IJHPCA 2005, on the Bine tree.
"""
import torch

from ._cost import NOTHING, Tally, pieces
from .broadcast_bine import children, tree
from .gather_bine import layout

AUTO = "measured"   # the binomial tree's figures on a flat switch: its gain is locality


def cost(n, s, item=1):
    """S = the whole input (N pieces of S/N)."""
    if n == 1:
        return NOTHING
    m = pieces(s, n, item)[0]
    _, _, size = layout(n, 0)
    t = Tally(n)
    for v, (q, k) in tree(n, 0).items():
        t.message(k, q, v, size[v] * m)
    for q in children(n, 0):
        t.allocate(q, size[q] * m)
    return t.cost()


def scatter(comm, tensor, scatter_list, root):
    n, r = comm.size, comm.rank
    order, index, size = layout(n, root)
    below = children(n, root).get(r, ())
    c = tensor.numel()
    if r == root:
        buf = torch.cat([scatter_list[q] for q in order])
    elif below:
        buf = tensor.new_empty(size[r] * c)
    else:
        buf = tensor
    up = tree(n, root).get(r)
    if up is not None:
        comm.recv(buf, up[0], up[1])
    for child, k in below:
        a = index[child] - index[r]
        comm.send(buf[a * c:(a + size[child]) * c], child, k)
    if buf is not tensor:
        tensor.copy_(buf[:c])
