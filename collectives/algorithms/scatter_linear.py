"""scatter, linear: the root sends each rank its piece directly.

Semantics: rank i's ``tensor`` ends equal to ``scatter_list[i]`` of the root.

Communication steps: 1 (the root posts all N-1 sends at once)
Messages the root sends: N-1, each S bytes (S = one rank's piece)
Bytes the root sends: (N-1) * S

Steps:
  1. The root copies its own piece and posts one send per other rank.
  2. Every other rank receives its piece.

Worked example, N=4, root 0 holds [p0, p1, p2, p3]:

  step | messages
  -----+------------------------------------
    0  | 0 -> 1: p1, 0 -> 2: p2, 0 -> 3: p3

Extra memory: none.
"""
from ._cost import NOTHING, Cost, pieces


def cost(n, s, item=1):
    """S = the whole input (N pieces of S/N)."""
    m = pieces(s, n, item)[0]
    if n == 1 or m == 0:
        return NOTHING
    # the root sends N-1 pieces, the others none: N-1 in all, whichever rank is the root
    return Cost(steps=1, messages=n - 1, total_messages=n - 1,
                sent_bytes=(n - 1) * m, recv_bytes=m, critical_bytes=m)


def scatter(comm, tensor, scatter_list, root):
    if comm.rank == root:
        tensor.copy_(scatter_list[root])
        comm.exchange(0, sends=[(scatter_list[p], p) for p in range(comm.size) if p != root])
    else:
        comm.recv(tensor, root, 0)
