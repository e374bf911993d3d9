"""reduce_scatter, ring algorithm.

Semantics: rank r ends with ``output = op(input_list[r] of every rank)``.

Communication steps: N-1
Messages each rank sends: N-1, each S/N bytes
Bytes each rank sends: (N-1)/N * S      (S = bytes of the whole input, N chunks)

Steps (ranks on a ring, left = r-1, right = r+1):
  1. Copy the input chunks into a working buffer of N chunks.
  2. For s = 0..N-2: send chunk (r-s-1) mod N to the right, receive chunk
     (r-s-2) mod N from the left and fold it into the local copy with op.
     The partial result travels around the ring, one hop per step.
  3. After N-1 steps chunk r has been through every rank: it is the result.

Worked example, N=4, SUM, rank r holds chunks [a_r, b_r, c_r, d_r]; the table
shows which chunk each rank *sends* at each step:

  step | rank 0 | rank 1 | rank 2 | rank 3
  -----+--------+--------+--------+-------
    0  |   d    |   a    |   b    |   c
    1  |   c    |   d    |   a    |   b
    2  |   b    |   c    |   d    |   a
  result: rank 0 has a0+a1+a2+a3 (summed in order 1,2,3,0 around the ring), rank 1 b, ...

Each chunk is reduced on exactly one rank, so there is exactly one answer for
it: the all-gather that follows in ring all_reduce copies bits, and every
rank ends with bitwise the same tensor.

Extra memory: S + S/N (the concatenated input, so that ``input_list`` stays
unchanged as torch's does, and one chunk to receive into).

Reference: Patarasuk and Yuan, "Bandwidth optimal all-reduce algorithms for
clusters of workstations", JPDC 2009.
"""
import torch

from ._cost import NOTHING, Tally, pieces
from ._util import inbox


def ring_reduce_scatter(comm, chunks, op, step0=0):
    """In place: afterwards ``chunks[comm.rank]`` holds the reduction over all ranks.

    ``chunks`` are contiguous views (sizes may differ, may be empty); the other
    chunks are left holding partial results.
    """
    n, r = comm.size, comm.rank
    right, left = (r + 1) % n, (r - 1) % n
    buf = inbox(comm, chunks[0], max(c.numel() for c in chunks))
    for s in range(n - 1):
        send_i, recv_i = (r - s - 1) % n, (r - s - 2) % n
        got = buf[:chunks[recv_i].numel()]
        comm.sendrecv(chunks[send_i], right, got, left, step0 + s)
        op.combine(chunks[recv_i], got)


def tally_ring_reduce_scatter(tally, sizes, step0=0):
    """Count :func:`ring_reduce_scatter` over chunks of ``sizes`` bytes."""
    tally.ring(sizes, range(step0, step0 + tally.n - 1), shift=1, reduce=True)
    for r in range(tally.n):
        tally.allocate(r, max(sizes))


def cost(n, s, item=1):
    """S = the whole input (N chunks of S/N)."""
    if n == 1:
        return NOTHING
    t = Tally(n)
    tally_ring_reduce_scatter(t, [pieces(s, n, item)[0]] * n)
    for r in range(n):
        t.allocate(r, s)
    return t.cost()


def reduce_scatter(comm, output, input_list, op):
    work = torch.cat(input_list)
    c = output.numel()
    chunks = [work[i * c:(i + 1) * c] for i in range(comm.size)]
    ring_reduce_scatter(comm, chunks, op)
    output.copy_(chunks[comm.rank])
