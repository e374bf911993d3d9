"""all_reduce, naive ring: the whole-tensor ring of the PyTorch tutorial, made correct.

Semantics: every rank ends with ``op`` over all ranks' tensors, bitwise equal.

Communication steps: N-1
Messages each rank sends: N-1, each S bytes
Bytes each rank sends: (N-1) * S   (N/2 times the chunked ring's 2(N-1)/N * S)

Steps:
  1. Every rank passes whole tensors around the ring: at step s it forwards to
     the right the tensor it received at step s-1 (its own at step 0) and
     receives rank (r-s-1)'s original tensor from the left, into slot r-s-1.
  2. After N-1 steps every rank holds all N original tensors and reduces them
     in rank order 0, 1, ..., N-1.

Worked example, N=4, rank r starts with x_r; tensor each rank receives:

  step | rank 0 | rank 1 | rank 2 | rank 3
  -----+--------+--------+--------+-------
    0  |  x3    |  x0    |  x1    |  x2
    1  |  x2    |  x3    |  x0    |  x1
    2  |  x1    |  x2    |  x3    |  x0
  result on every rank: ((x0 + x1) + x2) + x3, the same bits everywhere

Why the slots: the tutorial's version adds each tensor to an accumulator as it
arrives, so rank 0 computes ((x0 + x3) + x2) + x1 while rank 1 computes
((x1 + x0) + x3) + x2. Floating-point addition is not associative: those differ
in the last bits. In data-parallel training that means replicas that were
meant to be identical drift apart a little more every step, and nothing ever
pulls them back. ``torch.distributed.all_reduce`` promises the same result on
every rank; meeting that promise here costs N slots of memory, where the
chunked ring (``all_reduce_ring``) meets it for free because each chunk is
reduced by exactly one rank.

Extra memory: N x S, the N slots (the own tensor's copy and N-1 received ones):
this is the teaching copy, kept whole-tensor on purpose; use ``ring`` (S/N) for
anything large. (Measured, largest rank, 64 MiB float32: 127.9 MiB at N=2, 255.9
MiB at N=4; the built-in 2.0 MiB. ``python -m benchmarks.memory -b 64M
--world-size 2,4``, 2026-11-23.)

Reference: PyTorch tutorial "Writing Distributed Applications with PyTorch"
(Arnold), section "Our Own Ring-Allreduce".
"""
from ._cost import NOTHING, Cost


def cost(n, s, item=1):
    if n == 1:
        return NOTHING
    moved = s > 0   # an empty tensor is not sent
    # every rank sends the whole tensor at each of the N-1 steps: N(N-1) messages in all
    return Cost(steps=(n - 1) * moved, messages=(n - 1) * moved, total_messages=n * (n - 1) * moved,
                sent_bytes=(n - 1) * s, recv_bytes=(n - 1) * s, critical_bytes=(n - 1) * s,
                reduced_bytes=(n - 1) * s, extra_memory=n * s)


def all_reduce(comm, tensor, op):
    n, r = comm.size, comm.rank
    right, left = (r + 1) % n, (r - 1) % n
    slots = [None] * n
    slots[r] = tensor.clone()
    for s in range(n - 1):
        outgoing, incoming = (r - s) % n, (r - s - 1) % n
        slots[incoming] = tensor.new_empty(tensor.shape)
        comm.sendrecv(slots[outgoing], right, slots[incoming], left, s)
    tensor.copy_(slots[0])
    for x in slots[1:]:
        op.combine(tensor, x)
