"""all_reduce, tree: binomial-tree reduce to rank 0, then binomial-tree broadcast.

Semantics: every rank ends with ``op`` over all ranks' tensors, bitwise equal
(one rank computes the result, the broadcast copies its bits).

Communication steps: 2 ceil(log2 N)
Messages each rank sends: at most 1 + ceil(log2 N), each S bytes
Bytes each rank sends: rank 0 sends ceil(log2 N) * S in the broadcast; every
  other rank S in the reduce plus S per child in the broadcast

Steps:
  1. ``reduce_binomial_tree`` to group rank 0 (ceil(log2 N) steps).
  2. ``broadcast_binomial_tree`` from group rank 0 (ceil(log2 N) steps).
  Every rank but 0 posts its broadcast receive together with its reduce send,
  into its own tensor. That is safe: the result cannot arrive before rank 0
  has every contribution, this rank's included, so the send has left the
  buffer by then. It saves a handshake: gloo sends a message's bytes only
  once the receiver has said it is ready, and a receive posted after the
  reduce often comes after rank 0's send (with bare torch calls this cut a
  back-to-back 4 KiB tree by a third; docs/benchmarks.md, "The door's cost").

Worked example, N=4, SUM, rank r holds x_r:

  step | messages
  -----+---------------------------------------
    0  | 1 -> 0, 3 -> 2       (reduce)
    1  | 2 -> 0               (reduce: r0 has the sum)
    2  | 0 -> 2               (broadcast)
    3  | 0 -> 1, 2 -> 3       (broadcast)

Few, whole-tensor messages: good for small tensors at scale, poor for large
ones, where the ring's S/N pieces win. (NCCL's tree all-reduce pipelines
chunks through two trees; this is the plain textbook form.)

Extra memory: S on rank 0, 2S on a rank with children (see
``reduce_binomial_tree``): a whole-tensor algorithm, for small tensors.
(Measured, largest rank, 64 MiB float32: 63.8 MiB at N=2, 128.0 MiB at N=4; the
built-in 2.0 MiB. ``python -m benchmarks.memory -b 64M --world-size 2,4``,
2026-11-23.)
"""
from ._cost import NOTHING, Tally
from ._util import ceil_log2
from .broadcast_binomial_tree import broadcast, parent, tally_binomial_tree
from .reduce_binomial_tree import reduce, tally_reduce_tree


def cost(n, s, item=1):
    if n == 1:
        return NOTHING
    t = Tally(n)
    tally_reduce_tree(t, s)
    tally_binomial_tree(t, lambda a, b: s, step0=ceil_log2(n))
    return t.cost()


def all_reduce(comm, tensor, op):
    step0 = ceil_log2(comm.size)
    result = parent(comm, 0, step0)   # (from whom, in which step) the result comes; None on rank 0
    reduce(comm, tensor, 0, op, recv_with_send=None if result is None else (tensor, *result))
    broadcast(comm, tensor, 0, step0=step0, received=result is not None)
