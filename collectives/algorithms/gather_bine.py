"""gather, Bine tree (binomial negabinary, SC'25): the Bine reduce's tree, concatenating.

Semantics: ``gather_list[i]`` on the root ends equal to rank i's ``tensor``.

Communication steps: ceil(log2 N)
Messages each rank sends: 1 (the root: 0); the root receives ceil(log2 N)
Bytes: a rank whose subtree has m ranks sends m * S/N to its parent (S = the whole
  output, N pieces); the root receives (N-1) * S/N in all (the binomial tree's figures)

What changes from ``gather_binomial_tree`` is who talks to whom: the tree is
``broadcast_bine``'s, whose hops are signed negabinary distances rho(k) = 1, -1, 3,
-5, 11, ... instead of 2^k, so about two thirds as long, and more of the subtrees'
bytes stay inside a group of nearby ranks (a Dragonfly's group, a fat tree's pod).
On a power of two every subtree is a run of consecutive ranks around its root (mod N),
which the paper uses to send each subtree from the root's buffer in rank order; here
every rank lays out its subtree's pieces in the tree's pre-order (itself, then each
child's subtree), so a subtree is one range of that buffer at any N, and the root
puts the pieces into rank order once at the end.

Steps (the tree of ``broadcast_bine``: labels v = (rank - root) mod N, P the largest
power of two <= N, L = ceil(log2 N); the broadcast's step k is the gather's step
L-1-k):
  1. A rank with children allocates a buffer for its subtree's pieces and copies its
     own piece to the front.
  2. Labels P .. N-1 (N not a power of two) send their piece to label v - P.
  3. For the broadcast's steps, last first: every rank that the broadcast reaches in
     that step (from its peer at distance rho(k), k = 0, 1, ..., log2(P)-1: 1, -1, 3,
     -5, 11, ..., near first) sends its subtree's pieces, all in one message, to
     that peer, which receives them into their range of its buffer.
  4. The root copies the pieces from pre-order into ``gather_list``.

Worked example, N=4, root 0, rank r holds x_r (tree: 0 -> 3 in step 0, then 0 -> 1
and 3 -> 2; pre-order 0, 3, 2, 1):

  step | messages
  -----+------------------------------------------
    0  | 1 -> 0: [x1]        2 -> 3: [x2]
    1  | 3 -> 0: [x3, x2]
  root's buffer [x0, x3, x2, x1] -> gather_list = [x0, x1, x2, x3]
  The binomial tree's 2 -> 0 (two ranks away) is 3 -> 0 here (one, around the ring).

Extra memory: S on the root, the subtree's pieces (m x S/N) on a non-root rank with
children (a subtree of m > 1 ranks); a leaf sends its tensor as it is.

Reference: De Sensi et al., "Bine Trees: Enhancing Collective Operations by
Optimizing Communication Locality", SC'25 (arXiv 2508.17311); the gather as the
binomial one of Thakur, Rabenseifner and Gropp, IJHPCA 2005, on the Bine tree.
"""
from functools import lru_cache

from ._cost import NOTHING, Tally, pieces
from ._util import ceil_log2
from .broadcast_bine import children, tree

AUTO = "measured"   # the binomial tree's figures on a flat switch: its gain is locality


@lru_cache(maxsize=1024)
def layout(n, root):
    """(ranks in the Bine tree's pre-order from ``root``, {rank: its index there},
    {rank: ranks in its subtree}): a subtree of rank q is ``order[index[q]:index[q] + size[q]]``."""
    below = children(n, root)
    order, size = [], {}

    def visit(q):                       # iterative would be no clearer: depth is log2 N
        order.append(q)
        size[q] = 1 + sum(visit(c) for c, _ in below.get(q, ()))
        return size[q]
    visit(root)
    return tuple(order), {q: i for i, q in enumerate(order)}, size


def cost(n, s, item=1):
    """S = the whole output (N pieces of S/N)."""
    if n == 1:
        return NOTHING
    m = pieces(s, n, item)[0]
    _, _, size = layout(n, 0)
    last = ceil_log2(n) - 1
    t = Tally(n)
    for v, (q, k) in tree(n, 0).items():
        t.message(last - k, v, q, size[v] * m)
    for q in children(n, 0):
        t.allocate(q, size[q] * m)
    return t.cost()


def gather(comm, tensor, gather_list, root):
    n, r = comm.size, comm.rank
    last = ceil_log2(n) - 1
    order, index, size = layout(n, root)
    below = children(n, root).get(r, ())
    c = tensor.numel()
    buf = tensor
    if below:
        buf = tensor.new_empty(size[r] * c)
        buf[:c].copy_(tensor)
        for child, k in reversed(below):          # the gather's step order
            a = index[child] - index[r]
            comm.recv(buf[a * c:(a + size[child]) * c], child, last - k)
    up = tree(n, root).get(r)
    if up is not None:
        comm.send(buf, up[0], last - up[1])
        return
    for i, q in enumerate(order):
        gather_list[q].copy_(buf[i * c:(i + 1) * c])
