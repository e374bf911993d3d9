"""reduce, linear: every rank sends its tensor to the root, which reduces them.

Semantics: the root's ``tensor`` ends as ``op`` over all ranks' tensors;
other ranks' tensors are unchanged.

Communication steps: 1 (the root posts all N-1 receives at once)
Messages each non-root rank sends: 1, S bytes; the root receives N-1
Bytes the root receives: (N-1) * S, and it does all N-1 reductions itself

Steps:
  1. Every non-root rank sends its tensor to the root.
  2. The root receives all of them into N-1 buffers, then combines them in
     rank order 0, 1, ..., N-1, so the result does not depend on arrival order.

Worked example, N=4, root 0, SUM, rank r holds x_r:

  step | messages                 | root computes
  -----+--------------------------+------------------------------
    0  | 1 -> 0, 2 -> 0, 3 -> 0   | ((x0 + x1) + x2) + x3

Extra memory: N x S on the root (N-1 inboxes and a copy of its own tensor).
"""
from ._cost import NOTHING, Cost


def cost(n, s, item=1):
    if n == 1 or s == 0:
        return NOTHING
    # every rank but the root sends its tensor once: N-1 in all, whichever rank is the root
    return Cost(steps=1, messages=n - 1, total_messages=n - 1, sent_bytes=s, recv_bytes=(n - 1) * s,
                critical_bytes=s, reduced_bytes=(n - 1) * s, extra_memory=n * s)


def reduce(comm, tensor, root, op):
    if comm.rank != root:
        comm.send(tensor, root, 0)
        return
    inbox = {peer: tensor.new_empty(tensor.shape) for peer in range(comm.size) if peer != root}
    comm.exchange(0, recvs=[(buf, peer) for peer, buf in inbox.items()])
    own = tensor.clone()
    pieces = [own if peer == root else inbox[peer] for peer in range(comm.size)]
    tensor.copy_(pieces[0])
    for x in pieces[1:]:
        op.combine(tensor, x)
