"""all_reduce, Rabenseifner: recursive-halving reduce-scatter + recursive-doubling all-gather.

Semantics: every rank ends with ``op`` over all ranks' tensors, bitwise equal.

Communication steps: 2 log2(N) for a power of two; 2 log2(P) + 2 otherwise
  (up to S = 2 MiB, 1 MiB with a fold, and at any size on 2 ranks; beyond, the
  halves travel as several messages, below)
Messages each rank sends: 2 log2(N) (large tensors: about N-1 + log2 N)
Bytes each rank sends: 2(N-1)/N * S for a power of two, like the ring, in
  log2 N steps instead of N-1; the fold adds S for the N-P folded pairs

Steps:
  1. Fold to P ranks (see ``_util``) if N is not a power of two.
  2. Cut the tensor into P blocks; recursive halving: at each step exchange
     half of the current range with virtual rank ``v XOR mask`` and combine,
     until virtual rank v owns the finished block v.
  3. Recursive doubling all-gather of the P blocks (the halving in reverse).
  4. Unfold: odd ranks send the result to their even neighbour.

Worked example, N=4, SUM, blocks [A, B, C, D]:

  step | partner | rank 0        | rank 1        | rank 2        | rank 3
  -----+---------+---------------+---------------+---------------+--------------
    0  |  r^2    | sends C,D     | sends C,D     | sends A,B     | sends A,B
    1  |  r^1    | sends B       | sends A       | sends D       | sends C
       |         | owns sum(A)   | owns sum(B)   | owns sum(C)   | owns sum(D)
    2  |  r^1    | sends A       | sends B       | sends C       | sends D
    3  |  r^2    | sends A,B     | sends A,B     | sends C,D     | sends C,D
  result on every rank: [sum(A), sum(B), sum(C), sum(D)]

Large tensors travel in pieces: no message is larger than one N-th of the
tensor or ``CHUNK_BYTES`` (1 MiB), whichever is larger. A step whose half is
larger is cut into several messages, each with its own step number, each
received into one reused buffer and folded in before the next is received.
Tensors up to 2 MiB (1 MiB with a fold) keep the schedule above, and so does
any tensor on 2 ranks; larger ones send the same bytes in more messages (about
N-1 + log2 N for a power of two).

Extra memory: about max(S/N, CHUNK_BYTES), at most S/N + 1 MiB: the reused
receive buffer. The halving works in place on the tensor and the all-gather
receives straight into it. The even rank of a folded pair allocates nothing; the
odd one receives its partner's tensor piece by piece into the same buffer.
(Measured, largest rank, 64 MiB float32: 31.9 MiB at N=2, 16.0 MiB at N=4; the
built-in 2.0 MiB. ``python -m benchmarks.memory -b 64M --world-size 2,4``,
2026-11-23.)

Reference: Rabenseifner, "Optimization of Collective Reduction Operations",
ICCS 2004; Thakur, Rabenseifner and Gropp, IJHPCA 2005.
"""
from ._cost import CHUNK_BYTES, NOTHING, Tally
from ._util import fold, fold_out, split_bounds, tally_fold_out, virtual_rank
from ._util import inbox as scratch_inbox
from .all_gather_recursive_doubling import recursive_doubling, tally_recursive_doubling
from .reduce_scatter_recursive_halving import (cut, halving_steps, largest_kept, recursive_halving,
                                               tally_recursive_halving)


def message_limit(numel, n, item):
    """The largest message, in bytes: one N-th of the tensor or CHUNK_BYTES."""
    return max(CHUNK_BYTES, -(-numel // n) * item)


def fold_pieces(numel, item, limit):
    """The fold's messages: the whole tensor cut so that none exceeds ``limit``."""
    return cut(0, numel, max(1, -(-numel * item // limit)))


def inbox_size(bounds, v, p, item, limit, folded_receiver):
    """Elements of the one buffer a rank receives into."""
    size = largest_kept(bounds, v, p, item, limit) if v is not None else 0
    if folded_receiver:
        size = max([size] + [b - a for a, b in fold_pieces(bounds[-1], item, limit)])
    return size


def cost(n, s, item=1):
    if n == 1:
        return NOTHING
    p, extra = fold(n)
    numel = s // item
    bounds = split_bounds(numel, p)
    limit = message_limit(numel, n, item)
    t = Tally(n)
    step = 0
    if extra:
        for k, (a, b) in enumerate(fold_pieces(numel, item, limit)):
            for i in range(extra):
                t.message(step + k, 2 * i, 2 * i + 1, (b - a) * item)
                t.reduce(2 * i + 1, (b - a) * item)
        step += len(fold_pieces(numel, item, limit))
    tally_recursive_halving(t, bounds, p, extra, step, item, limit)
    step += halving_steps(bounds, p, item, limit)
    tally_recursive_doubling(t, [b * item for b in bounds], p, extra, step)
    step += p.bit_length() - 1
    if extra:
        tally_fold_out(t, extra, step, s)
    for r in range(n):
        t.allocate(r, item * inbox_size(bounds, virtual_rank(r, extra), p, item, limit,
                                        r < 2 * extra and r % 2))
    return t.cost()


def all_reduce(comm, tensor, op):
    n, r = comm.size, comm.rank
    p, extra = fold(n)
    v = virtual_rank(r, extra)
    numel, item = tensor.numel(), tensor.element_size()
    bounds = split_bounds(numel, p)
    limit = message_limit(numel, n, item)
    folded_receiver = r < 2 * extra and r % 2
    inbox = scratch_inbox(comm, tensor, inbox_size(bounds, v, p, item, limit, folded_receiver))
    step = 0
    if extra:
        # The fold, piece by piece: the even rank posts every piece at once, the odd
        # one receives them one after another into the inbox and folds each in.
        parts = [tensor[a:b] for a, b in fold_pieces(numel, item, limit)]
        if r < 2 * extra and r % 2 == 0:
            for pending in [comm.post(step + k, sends=[(x, r + 1)]) for k, x in enumerate(parts)]:
                pending.wait()
        elif folded_receiver:
            for k, x in enumerate(parts):
                got = inbox[:x.numel()]
                comm.recv(got, r - 1, step + k)
                op.combine(x, got)
        step += len(parts)
    if v is not None:
        recursive_halving(comm, tensor, bounds, v, p, extra, op, step, limit, inbox)
        recursive_doubling(comm, tensor, bounds, v, p, extra, step + halving_steps(bounds, p, item, limit))
    step += halving_steps(bounds, p, item, limit) + p.bit_length() - 1
    if extra:
        fold_out(comm, extra, step, tensor, tensor)
