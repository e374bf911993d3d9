"""all_reduce, Rabenseifner: recursive-halving reduce-scatter + recursive-doubling all-gather.

Semantics: every rank ends with ``op`` over all ranks' tensors, bitwise equal.

Communication steps: 2 log2(N) for a power of two; 2 log2(P) + 2 otherwise
Messages each rank sends: 2 log2(N)
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

Reference: Rabenseifner, "Optimization of Collective Reduction Operations",
ICCS 2004; Thakur, Rabenseifner and Gropp, IJHPCA 2005.
"""
from ._util import fold, fold_in, fold_out, split_bounds, virtual_rank
from .all_gather_recursive_doubling import recursive_doubling
from .reduce_scatter_recursive_halving import recursive_halving


def all_reduce(comm, tensor, op):
    n, r = comm.size, comm.rank
    p, extra = fold(n)
    v = virtual_rank(r, extra)
    step = 0
    if extra:
        inbox = tensor.new_empty(tensor.shape) if r < 2 * extra else None
        if fold_in(comm, extra, step, tensor, inbox):
            op.combine(tensor, inbox)
        step += 1
    rounds = p.bit_length() - 1
    if v is not None:
        bounds = split_bounds(tensor.numel(), p)
        recursive_halving(comm, tensor, bounds, v, p, extra, op, step)
        recursive_doubling(comm, tensor, bounds, v, p, extra, step + rounds)
    step += 2 * rounds
    if extra:
        fold_out(comm, extra, step, tensor, tensor)
