"""reduce, binomial tree.

Semantics: the root's ``tensor`` ends as ``op`` over all ranks' tensors;
other ranks' tensors are unchanged.

Communication steps: ceil(log2 N)
Messages each rank sends: 1 (the root: 0), each S bytes
Bytes each rank sends: S; a rank receives one S per child (at most ceil(log2 N))

Steps (relative rank v = (rank - root) mod N):
  1. For mask = 1, 2, 4, ...: if v has bit ``mask`` set, send the partial
     result to v - mask and stop; otherwise, if v + mask < N, receive the
     partial result of the subtree at v + mask and combine it.
  The binomial broadcast run backwards: the number of ranks still holding
  partial results halves every step.

Worked example, N=4, root 0, SUM, rank r holds x_r:

  step | messages          | after the step
  -----+-------------------+---------------------------
    0  | 1 -> 0, 3 -> 2    | r0: x0+x1, r2: x2+x3
    1  | 2 -> 0            | r0: (x0+x1) + (x2+x3)

Extra memory: S on the root (one inbox), 2S on a non-root rank with children
(an inbox, and a copy of its tensor to accumulate into, since a non-root's
tensor must stay unchanged); leaves allocate nothing.

Reference: Thakur, Rabenseifner and Gropp, IJHPCA 2005 (MPICH short-message reduce).
"""
from ._cost import NOTHING, Tally


def tally_reduce_tree(tally, s, step0=0):
    """Count :func:`reduce` to root 0, allocations included."""
    n = tally.n
    for v in range(n):
        mask, step, allocated = 1, step0, False
        while mask < n:
            if v & mask:
                tally.message(step, v, v - mask, s)
                break
            if v + mask < n:
                if not allocated:   # the inbox, and on a non-root the copy it accumulates into
                    tally.allocate(v, s if v == 0 else 2 * s)
                    allocated = True
                tally.reduce(v, s)
            mask, step = mask << 1, step + 1


def cost(n, s, item=1):
    if n == 1:
        return NOTHING
    t = Tally(n)
    tally_reduce_tree(t, s)
    return t.cost()


def reduce(comm, tensor, root, op, step0=0, recv_with_send=None):
    """``recv_with_send=(buffer, peer, step)``: a receive to post together with the
    send to the parent (``all_reduce_tree`` posts its broadcast receive there)."""
    n = comm.size
    v = (comm.rank - root) % n
    acc = tensor
    inbox = None
    mask, step = 1, step0
    while mask < n:
        if v & mask:
            parent = (v - mask + root) % n
            if recv_with_send is None:
                comm.send(acc, parent, step)
            else:
                buf, peer, recv_step = recv_with_send
                pending = [comm.post(recv_step, recvs=[(buf, peer)]), comm.post(step, sends=[(acc, parent)])]
                for p in pending:
                    p.wait()
            return
        if v + mask < n:
            if inbox is None:
                inbox = tensor.new_empty(tensor.shape)
                if v != 0:
                    acc = tensor.clone()  # a non-root's own tensor must stay unchanged
            comm.recv(inbox, (v + mask + root) % n, step)
            op.combine(acc, inbox)
        mask, step = mask << 1, step + 1
