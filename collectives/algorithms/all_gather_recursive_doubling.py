"""all_gather, recursive doubling (any group size).

Semantics: ``tensor_list[i]`` on every rank ends as rank i's ``tensor``.

Communication steps: log2(N) for a power of two; log2(P) + 2 otherwise
Messages each rank sends: log2(N)
Bytes each rank sends: (N-1) * S for a power of two (S + 2S + 4S + ...);
  with the fold, the odd ranks of folded pairs also send N*S back at the end

Steps (N a power of two; otherwise fold first, see ``_util``):
  1. Put the own tensor in its slot of a working buffer of N slots.
  2. For mask = 1, 2, ..., N/2: exchange everything gathered so far (an aligned
     run of ``mask`` blocks) with virtual rank ``v XOR mask``. The run doubles.
  3. Unfold: odd ranks of folded pairs send the full buffer to their neighbour.

Worked example, N=4, rank r starts with x_r:

  step | pairs     | each rank then holds
  -----+-----------+----------------------------------
    0  | 0-1, 2-3  | r0, r1: [x0, x1]   r2, r3: [x2, x3]
    1  | 0-2, 1-3  | all: [x0, x1, x2, x3]

Extra memory: S, the working buffer of N slots (every step sends an aligned run
of slots, which ``tensor_list``'s separate tensors are not).

Reference: Thakur, Rabenseifner and Gropp, IJHPCA 2005, section 3.
"""
from ._cost import NOTHING, Tally, pieces
from ._util import (first_real_rank, fold, fold_in, fold_out, real_rank, tally_fold_in,
                    tally_fold_out, virtual_rank)


def recursive_doubling(comm, buf, bounds, vrank, p, extra, step0):
    """All-gather over P virtual ranks; block v is ``buf[bounds[v]:bounds[v+1]]``."""
    mask, step = 1, step0
    while mask < p:
        partner = real_rank(vrank ^ mask, extra)
        mine, theirs = vrank & ~(mask - 1), (vrank ^ mask) & ~(mask - 1)
        comm.sendrecv(buf[bounds[mine]:bounds[mine + mask]], partner,
                      buf[bounds[theirs]:bounds[theirs + mask]], partner, step)
        mask, step = mask << 1, step + 1


def tally_recursive_doubling(tally, bounds, p, extra, step0):
    """Count :func:`recursive_doubling` with ``bounds`` in bytes."""
    for v in range(p):
        mask, step = 1, step0
        while mask < p:
            mine = v & ~(mask - 1)
            tally.message(step, real_rank(v, extra), real_rank(v ^ mask, extra),
                          bounds[mine + mask] - bounds[mine])
            mask, step = mask << 1, step + 1


def cost(n, s, item=1):
    """S = the whole output (N pieces of S/N)."""
    if n == 1:
        return NOTHING
    p, extra = fold(n)
    c = pieces(s, n, item)[0]
    t = Tally(n)
    step = 0
    if extra:
        tally_fold_in(t, extra, step, c)
        step += 1
    tally_recursive_doubling(t, [first_real_rank(u, extra) * c for u in range(p)] + [n * c], p, extra, step)
    step += p.bit_length() - 1
    if extra:
        tally_fold_out(t, extra, step, n * c)
    for r in range(n):
        t.allocate(r, n * c)
    return t.cost()


def all_gather(comm, tensor_list, tensor):
    n, r = comm.size, comm.rank
    p, extra = fold(n)
    c = tensor.numel()
    work = tensor.new_empty(n * c)
    work[r * c:(r + 1) * c].copy_(tensor)
    v = virtual_rank(r, extra)
    step = 0
    if extra:
        fold_in(comm, extra, step, tensor, work[(r - 1) * c:r * c])
        step += 1
    if v is not None:
        bounds = [first_real_rank(u, extra) * c for u in range(p)] + [n * c]
        recursive_doubling(comm, work, bounds, v, p, extra, step)
    step += p.bit_length() - 1
    if extra:
        fold_out(comm, extra, step, work, work)
    for i, out in enumerate(tensor_list):
        out.copy_(work[i * c:(i + 1) * c])
