"""gather, binomial tree: the scatter tree run backwards.

Semantics: ``gather_list[i]`` on the root ends equal to rank i's ``tensor``.

Communication steps: ceil(log2 N)
Messages each rank sends: 1 (the root: 0); the root receives ceil(log2 N)
Bytes: a rank with a subtree of m ranks sends m * S to its parent; the root
  receives (N-1) * S in all

Steps (relative rank v = (rank - root) mod N):
  1. Each rank keeps a buffer for its subtree's pieces [v, v + subtree), own piece first.
  2. For mask = 1, 2, 4, ...: if v has bit ``mask`` set, send the whole buffer
     to the parent v - mask and stop; otherwise receive the pieces
     [v+mask, v+2*mask) of the child v + mask, if it exists.
  3. The root unpacks the pieces from relative into rank order.

Worked example, N=4, root 0, rank r holds x_r:

  step | messages
  -----+------------------------------------------
    0  | 1 -> 0: [x1]        3 -> 2: [x3]
    1  | 2 -> 0: [x2, x3]
  root: gather_list = [x0, x1, x2, x3]

Extra memory: S on the root, the subtree's pieces (m x S/N) on a rank with a
subtree of m ranks.

Reference: Thakur, Rabenseifner and Gropp, IJHPCA 2005 (MPICH gather).
"""
from ._cost import NOTHING, Tally, pieces


def cost(n, s, item=1):
    """S = the whole output (N pieces of S/N)."""
    if n == 1:
        return NOTHING
    m = pieces(s, n, item)[0]
    t = Tally(n)
    for v in range(n):
        subtree = n if v == 0 else min(v & -v, n - v)
        t.allocate(v, subtree * m)
        if v:
            lowbit = v & -v
            t.message(lowbit.bit_length() - 1, v, v - lowbit, subtree * m)
    return t.cost()


def gather(comm, tensor, gather_list, root):
    n = comm.size
    v = (comm.rank - root) % n
    c = tensor.numel()
    subtree = n if v == 0 else min(v & -v, n - v)
    buf = tensor.new_empty(subtree * c)
    buf[:c].copy_(tensor)
    mask, step = 1, 0
    while mask < n:
        if v & mask:
            comm.send(buf, (v - mask + root) % n, step)
            return
        if v + mask < n:
            hi = min(v + 2 * mask, n)
            comm.recv(buf[mask * c:(hi - v) * c], (v + mask + root) % n, step)
        mask, step = mask << 1, step + 1
    for i in range(n):
        gather_list[(root + i) % n].copy_(buf[i * c:(i + 1) * c])
