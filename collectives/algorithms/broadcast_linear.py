"""broadcast, linear: the root sends the whole tensor to every other rank.

Semantics: every rank's ``tensor`` ends equal to the root's.

Communication steps: N-1. The root posts all N-1 sends at once (one message
tag, which ``cost()`` counts as its one step), but a rank sends one message at
a time over its link, so they leave one after another: by chapter 5's rule (a
step is at most one message per rank) that is N-1 steps, and the cost model
charges them so, alpha x max(steps, messages) = (N-1) alpha.
Messages the root sends: N-1, each S bytes; every other rank receives one
Bytes the root sends: (N-1) * S; other ranks send nothing

Steps:
  1. The root posts a send of the tensor to each other rank, then waits for all.
  2. Every other rank receives the tensor from the root.

Worked example, N=4, root 0 holds x (the root's messages queue on its link):

  step | rank 0    | rank 1    | rank 2    | rank 3
  -----+-----------+-----------+-----------+----------
    0  | x -> 1    | x <- 0    | idle      | idle
    1  | x -> 2    | idle      | x <- 0    | idle
    2  | x -> 3    | idle      | idle      | x <- 0

The root's link carries everything: time grows like (N-1) * S. The tree and
pipeline broadcasts exist to take that load off the root.

Extra memory: none.
"""
from ._cost import NOTHING, Cost


def cost(n, s, item=1):
    if n == 1 or s == 0:
        return NOTHING
    # the root sends N-1 messages, the others none: N-1 in all, whichever rank is the root
    return Cost(steps=1, messages=n - 1, total_messages=n - 1,
                sent_bytes=(n - 1) * s, recv_bytes=s, critical_bytes=s)


def broadcast(comm, tensor, root):
    if comm.rank == root:
        comm.exchange(0, sends=[(tensor, peer) for peer in range(comm.size) if peer != root])
    else:
        comm.recv(tensor, root, 0)
