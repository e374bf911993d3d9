"""broadcast, binomial tree.

Semantics: every rank's ``tensor`` ends equal to the root's.

Communication steps: ceil(log2 N)
Messages: N-1 in all; the root sends ceil(log2 N), each S bytes
Bytes each rank sends: at most ceil(log2 N) * S (the root); leaves send nothing

Steps (relative rank v = (rank - root) mod N, L = ceil(log2 N)):
  1. A rank with v > 0 receives from its parent v - lowbit(v), where lowbit(v)
     is v's lowest set bit.
  2. It then sends to children v + m for m = lowbit(v)/2, lowbit(v)/4, ..., 1
     (the root: m = 2^(L-1), ..., 1), farthest first. The message from v to
     v + m travels in step L-1-log2(m), so the number of ranks holding the
     data doubles every step.

Worked example, N=4, root 0 holds x:

  step | messages
  -----+--------------------
    0  | 0 -> 2
    1  | 0 -> 1, 2 -> 3

Reference: Thakur, Rabenseifner and Gropp, IJHPCA 2005, section 3 (MPICH's
short-message broadcast).

Extra memory: none.
"""
from ._cost import NOTHING, Tally
from ._util import ceil_log2


def parent(comm, root, step0=0):
    """(group rank, step) of the message this rank receives in the tree; None on the root."""
    n = comm.size
    v = (comm.rank - root) % n
    if v == 0:
        return None
    mask = v & -v   # lowbit(v)
    return (v - mask + root) % n, step0 + ceil_log2(n) - mask.bit_length()


def binomial_tree(comm, root, view, step0=0, received=False):
    """Walk the binomial tree from ``root`` down; ``view(a, b)`` is what travels to the
    subtree of relative ranks [a, b).

    For a broadcast every message is the whole tensor; ``scatter_binomial_tree``
    walks the same tree with each message holding only the receiver's subtree's pieces.
    ``received=True``: the caller has already received this rank's message.
    """
    n = comm.size
    v = (comm.rank - root) % n
    levels = ceil_log2(n)
    lowbit = v & -v if v else 1 << levels   # v's subtree is [v, v + lowbit)
    source = parent(comm, root, step0)
    if source is not None and not received:
        comm.recv(view(v, min(v + lowbit, n)), *source)
    mask = lowbit >> 1
    while mask:
        if v + mask < n:
            comm.send(view(v + mask, min(v + 2 * mask, n)), (v + mask + root) % n,
                      step0 + levels - mask.bit_length())
        mask >>= 1


def tally_binomial_tree(tally, size, step0=0):
    """Count :func:`binomial_tree` from root 0; ``size(a, b)`` is the bytes sent to subtree [a, b)."""
    n = tally.n
    levels = ceil_log2(n)
    for v in range(n):
        mask = (v & -v if v else 1 << levels) >> 1
        while mask:
            if v + mask < n:
                tally.message(step0 + levels - mask.bit_length(), v, v + mask,
                              size(v + mask, min(v + 2 * mask, n)))
            mask >>= 1


def cost(n, s, item=1):
    if n == 1:
        return NOTHING
    t = Tally(n)
    tally_binomial_tree(t, lambda a, b: s)
    return t.cost()


def broadcast(comm, tensor, root, step0=0, received=False):
    binomial_tree(comm, root, lambda a, b: tensor, step0, received)
