"""reduce_scatter, recursive halving.

Semantics: rank r ends with ``output = op(input_list[r] of every rank)``.

Communication steps: log2(N) for a power of two; log2(P) + 2 otherwise
Messages each rank sends: log2(N)
Bytes each rank sends: (N-1)/N * S for a power of two (S/2 + S/4 + ... + S/N);
  with the fold the N-P folded ranks also send S once

Steps (N a power of two; otherwise fold first, see ``_util``):
  1. Copy the input chunks into one working buffer. Each virtual rank owns a
     block of it: its own chunk, or the two chunks of a folded pair.
  2. For mask = N/2, N/4, ..., 1: the current range of blocks is split in
     half; send the half that the partner ``v XOR mask`` keeps, receive the
     partner's copy of the half you keep, combine. The range halves each step.
  3. Afterwards the block of rank v holds the result; unfold: odd ranks send
     their even neighbour its chunk.

Worked example, N=4, SUM, rank r holds chunks [a_r, b_r, c_r, d_r]:

  step | partner | rank 0 keeps   | rank 1 keeps   | rank 2 keeps | rank 3 keeps
  -----+---------+----------------+----------------+--------------+-------------
    0  |  r^2    | a,b (+ from 2) | a,b (+ from 3) | c,d (+ 0)    | c,d (+ 1)
    1  |  r^1    | a (+ from 1)   | b (+ from 0)   | c (+ 3)      | d (+ 2)
  result: rank 0 has a0+a1+a2+a3, rank 1 b..., rank 2 c..., rank 3 d...

Reference: Thakur, Rabenseifner and Gropp, IJHPCA 2005, section 4.
"""
import torch

from ._util import first_real_rank, fold, fold_in, fold_out, real_rank, virtual_rank


def recursive_halving(comm, buf, bounds, vrank, p, extra, op, step0):
    """Reduce-scatter over P virtual ranks; block v is ``buf[bounds[v]:bounds[v+1]]``."""
    inbox = buf.new_empty(buf.numel())
    lo, mask, step = 0, p // 2, step0
    while mask:
        partner = real_rank(vrank ^ mask, extra)
        mid = lo + mask
        keep, give = ((lo, mid), (mid, mid + mask)) if vrank < mid else ((mid, mid + mask), (lo, mid))
        kept = buf[bounds[keep[0]]:bounds[keep[1]]]
        got = inbox[:kept.numel()]
        comm.sendrecv(buf[bounds[give[0]]:bounds[give[1]]], partner, got, partner, step)
        op.combine(kept, got)
        lo, mask, step = keep[0], mask // 2, step + 1


def reduce_scatter(comm, output, input_list, op):
    n, r = comm.size, comm.rank
    p, extra = fold(n)
    c = output.numel()
    work = torch.cat(input_list)
    v = virtual_rank(r, extra)
    step = 0
    if extra:
        inbox = torch.empty_like(work) if r < 2 * extra else None
        if fold_in(comm, extra, step, work, inbox):
            op.combine(work, inbox)
        step += 1
    if v is not None:
        bounds = [first_real_rank(u, extra) * c for u in range(p)] + [n * c]
        recursive_halving(comm, work, bounds, v, p, extra, op, step)
    step += p.bit_length() - 1
    mine = work[r * c:(r + 1) * c]
    if extra:
        fold_out(comm, extra, step, work[(r - 1) * c:r * c], mine)
    output.copy_(mine)
