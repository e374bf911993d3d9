"""all_reduce, recursive doubling.

Semantics: every rank ends with ``op`` over all ranks' tensors, bitwise equal.

Communication steps: log2(N) for a power of two; log2(P) + 2 otherwise
  (P = largest power of two <= N)
Messages each rank sends: log2(N), each S bytes
Bytes each rank sends: log2(N) * S  (few steps, many bytes: the small-message choice)

Steps:
  1. Fold (only if N is not a power of two): each of the first N-P even ranks
     sends its tensor to its odd neighbour, which combines it (see ``_util``).
  2. For mask = 1, 2, 4, ..., P/2: exchange the whole tensor with virtual rank
     ``v XOR mask`` and combine. After step k each rank holds the reduction of
     a block of 2^(k+1) ranks; both partners compute a op b and b op a, which
     are the same bits because +, *, min, max are commutative.
  3. Unfold: each odd rank sends the result back to its even neighbour.

Worked example, N=4, SUM, rank r starts with x_r:

  step | pairs          | after the step
  -----+----------------+---------------------------------------------
    0  | 0-1, 2-3       | r0, r1: x0+x1      r2, r3: x2+x3
    1  | 0-2, 1-3       | all: (x0+x1) + (x2+x3)

Extra memory: S, inherently: every step receives the partner's whole tensor
before combining it, and both partners' whole tensors are needed at once.
(Measured, largest rank, 64 MiB float32: 63.9 MiB at N=2, 64.0 MiB at N=4; the
built-in 2.0 MiB. ``python -m benchmarks.memory -b 64M --world-size 2,4``,
2026-11-23.)

Reference: Thakur, Rabenseifner and Gropp, "Optimization of Collective
Communication Operations in MPICH", IJHPCA 2005.
"""
from ._cost import NOTHING, Tally
from ._util import fold, fold_in, fold_out, real_rank, tally_fold_in, tally_fold_out, virtual_rank
from ._util import inbox as scratch_inbox


def cost(n, s, item=1):
    if n == 1:
        return NOTHING
    p, extra = fold(n)
    t = Tally(n)
    step = 0
    if extra:
        tally_fold_in(t, extra, step, s, reduced=True)
        step += 1
    for mask_bit in range(p.bit_length() - 1):
        for v in range(p):
            t.message(step, real_rank(v, extra), real_rank(v ^ (1 << mask_bit), extra), s)
            t.reduce(real_rank(v, extra), s)
        step += 1
    if extra:
        tally_fold_out(t, extra, step, s)
    for r in range(n):
        t.allocate(r, s)
    return t.cost()


def all_reduce(comm, tensor, op):
    n, r = comm.size, comm.rank
    p, extra = fold(n)
    inbox = scratch_inbox(comm, tensor, tensor.numel()).view(tensor.shape)
    v = virtual_rank(r, extra)
    step = 0
    if extra:
        if fold_in(comm, extra, step, tensor, inbox):
            op.combine(tensor, inbox)
        step += 1
    if v is not None:
        mask = 1
        while mask < p:
            partner = real_rank(v ^ mask, extra)
            comm.sendrecv(tensor, partner, inbox, partner, step)
            op.combine(tensor, inbox)
            mask <<= 1
            step += 1
    else:
        step += p.bit_length() - 1
    if extra:
        fold_out(comm, extra, step, tensor, tensor)
