"""all_reduce, ring algorithm (reduce-scatter, then all-gather, over N chunks).

Semantics: every rank ends with ``op`` over all ranks' tensors, bitwise equal.

Communication steps: 2(N-1)
Messages each rank sends: 2(N-1), each about S/N bytes
Bytes each rank sends: 2(N-1)/N * S   (bandwidth-optimal: no algorithm sends less)

Steps:
  1. Cut the tensor into N chunks (``tensor_split``: sizes differ by at most one
     element; with fewer elements than ranks some chunks are empty and are not sent).
  2. Ring reduce-scatter (N-1 steps): afterwards rank r owns the finished chunk r.
  3. Ring all-gather (N-1 steps): the finished chunks travel around the ring
     until every rank has all of them.

Worked example, N=4, SUM, rank r holds [a_r, b_r, c_r, d_r]:

  after reduce-scatter: rank 0 owns A=sum(a), rank 1 B, rank 2 C, rank 3 D
  all-gather step 0: r0 sends A, r1 B, r2 C, r3 D   (each to its right)
  all-gather step 1: r0 sends D, r1 A, r2 B, r3 C
  all-gather step 2: r0 sends C, r1 D, r2 A, r3 B
  result on every rank: [A, B, C, D]

This is the chunked ring the PyTorch tutorial hints at with ``torch.chunk``;
compare ``all_reduce_naive_ring``, which sends the whole tensor N-1 times.

Extra memory: one chunk, S/N (rounded up to whole elements): the buffer every
reduce-scatter step receives into before folding it into the tensor; the
all-gather receives straight into the tensor. (Measured, largest rank, 64 MiB
float32: 31.9 MiB at N=2, 16.0 MiB at N=4; the built-in 2.0 MiB. ``python -m
benchmarks.memory -b 64M --world-size 2,4``, 2026-11-23.)

Reference: Patarasuk and Yuan, "Bandwidth optimal all-reduce algorithms for
clusters of workstations", JPDC 2009; Baidu's ring-allreduce, 2017.
"""
from ._cost import NOTHING, Tally, pieces
from .all_gather_ring import ring_all_gather, tally_ring_all_gather
from .reduce_scatter_ring import ring_reduce_scatter, tally_ring_reduce_scatter


def cost(n, s, item=1):
    if n == 1:
        return NOTHING
    t = Tally(n)
    sizes = pieces(s, n, item)
    tally_ring_reduce_scatter(t, sizes)
    tally_ring_all_gather(t, sizes, step0=n - 1)
    return t.cost()


def all_reduce(comm, tensor, op):
    chunks = list(tensor.tensor_split(comm.size))
    ring_reduce_scatter(comm, chunks, op)
    ring_all_gather(comm, chunks, step0=comm.size - 1)
