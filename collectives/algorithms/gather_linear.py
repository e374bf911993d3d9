"""gather, linear: every rank sends its tensor to the root.

Semantics: ``gather_list[i]`` on the root ends equal to rank i's ``tensor``.

Communication steps: 1 (the root posts all N-1 receives at once)
Messages each non-root rank sends: 1, S bytes; the root receives N-1
Bytes the root receives: (N-1) * S

Steps:
  1. Every non-root rank sends its tensor to the root.
  2. The root receives each one straight into its slot of ``gather_list``.

Worked example, N=4, root 0, rank r holds x_r:

  step | messages
  -----+-------------------------
    0  | 1 -> 0, 2 -> 0, 3 -> 0
  root: gather_list = [x0, x1, x2, x3]

Extra memory: none (each piece is received straight into its slot).
"""
from ._cost import NOTHING, Cost, pieces


def cost(n, s, item=1):
    """S = the whole output (N pieces of S/N)."""
    m = pieces(s, n, item)[0]
    if n == 1 or m == 0:
        return NOTHING
    # every rank but the root sends its piece once: N-1 in all, whichever rank is the root
    return Cost(steps=1, messages=n - 1, total_messages=n - 1,
                sent_bytes=m, recv_bytes=(n - 1) * m, critical_bytes=m)


def gather(comm, tensor, gather_list, root):
    if comm.rank == root:
        gather_list[root].copy_(tensor)
        comm.exchange(0, recvs=[(gather_list[p], p) for p in range(comm.size) if p != root])
    else:
        comm.send(tensor, root, 0)
