"""all_reduce, Rabenseifner: recursive-halving reduce-scatter + recursive-doubling all-gather.

Semantics: every rank ends with ``op`` over all ranks' tensors, bitwise equal.

Communication steps: 2 log2(N) for a power of two; 2 log2(P) + 2 otherwise
  (while a block S/P fits in 1 MiB; larger blocks travel one message each, below)
Messages each rank sends: 2 log2(N) (large blocks: P-1 + log2 P)
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

Large tensors travel in pieces: when a block (S/P) is smaller than
``CHUNK_BYTES`` (1 MiB), each step's half goes in one message as above; when
blocks are larger, the half goes block by block, each block its own message
and step number, received into one reused buffer and folded in before the
next arrives. More messages, the same bytes.

Extra memory: at most max(S/P, CHUNK_BYTES), about S/N + 1 MiB (P = N for
a power of two): the reused receive buffer. The halving works in place on the
tensor and the all-gather receives straight into it. The even rank of a folded
pair allocates nothing; the odd one receives its partner's tensor piece by
piece into the same buffer. (Measured per rank at 64 MiB: filled in from
``benchmarks/memory.py``.)

Reference: Rabenseifner, "Optimization of Collective Reduction Operations",
ICCS 2004; Thakur, Rabenseifner and Gropp, IJHPCA 2005.
"""
from ._cost import CHUNK_BYTES, NOTHING, Tally, pieces
from ._util import fold, fold_out, real_rank, split_bounds, tally_fold_out, virtual_rank
from .all_gather_recursive_doubling import recursive_doubling, tally_recursive_doubling
from .reduce_scatter_recursive_halving import (cut, halving_steps, largest_kept, recursive_halving,
                                               tally_recursive_halving)


def blocks_per_message(block_bytes, p):
    """How many blocks one message carries: all that fit in ``CHUNK_BYTES``, at least one
    (a power of two, so that every step's half cuts evenly)."""
    if block_bytes == 0:
        return p
    fit = max(1, CHUNK_BYTES // block_bytes)
    return min(p, 1 << (fit.bit_length() - 1))


def fold_steps(p, group):
    return len(cut((0, p), group))


def inbox_size(bounds, v, p, group, folded_receiver):
    """Elements (or bytes, with ``bounds`` in bytes) of the one buffer a rank receives into."""
    kept = largest_kept(bounds, v, p, group) if v is not None else 0
    if folded_receiver:
        return max([kept] + [bounds[b] - bounds[a] for a, b in cut((0, p), group)])
    return kept


def cost(n, s, item=1):
    if n == 1:
        return NOTHING
    p, extra = fold(n)
    bounds = [b * item for b in split_bounds(s // item, p)]
    group = blocks_per_message(bounds[1], p)
    t = Tally(n)
    step = 0
    if extra:
        for k, (a, b) in enumerate(cut((0, p), group)):
            for i in range(extra):
                t.message(step + k, 2 * i, 2 * i + 1, bounds[b] - bounds[a])
                t.reduce(2 * i + 1, bounds[b] - bounds[a])
        step += fold_steps(p, group)
    tally_recursive_halving(t, bounds, p, extra, step, group)
    step += halving_steps(p, group)
    tally_recursive_doubling(t, bounds, p, extra, step)
    step += p.bit_length() - 1
    if extra:
        tally_fold_out(t, extra, step, s)
    for r in range(n):
        t.allocate(r, inbox_size(bounds, virtual_rank(r, extra), p, group, r < 2 * extra and r % 2))
    return t.cost()


def all_reduce(comm, tensor, op):
    n, r = comm.size, comm.rank
    p, extra = fold(n)
    v = virtual_rank(r, extra)
    bounds = split_bounds(tensor.numel(), p)
    group = blocks_per_message((bounds[1] - bounds[0]) * tensor.element_size(), p)
    folded_receiver = r < 2 * extra and r % 2
    inbox = tensor.new_empty(inbox_size(bounds, v, p, group, folded_receiver))
    step = 0
    if extra:
        # The fold, piece by piece: the even rank posts every piece at once, the odd
        # one receives them one after another into the inbox and folds each in.
        parts = [tensor[bounds[a]:bounds[b]] for a, b in cut((0, p), group)]
        if r < 2 * extra and r % 2 == 0:
            for pending in [comm.post(step + k, sends=[(x, r + 1)]) for k, x in enumerate(parts)]:
                pending.wait()
        elif folded_receiver:
            for k, x in enumerate(parts):
                got = inbox[:x.numel()]
                comm.recv(got, r - 1, step + k)
                op.combine(x, got)
        step += fold_steps(p, group)
    if v is not None:
        recursive_halving(comm, tensor, bounds, v, p, extra, op, step, group, inbox)
        recursive_doubling(comm, tensor, bounds, v, p, extra, step + halving_steps(p, group))
    step += halving_steps(p, group) + p.bit_length() - 1
    if extra:
        fold_out(comm, extra, step, tensor, tensor)
