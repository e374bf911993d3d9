"""all_gather, ring algorithm.

Semantics: ``tensor_list[i]`` on every rank ends as rank i's ``tensor``.

Communication steps: N-1
Messages each rank sends: N-1, each S bytes
Bytes each rank sends: (N-1) * S        (S = bytes of one rank's tensor)

Steps (left = r-1, right = r+1):
  1. Put the own tensor in slot r.
  2. For s = 0..N-2: send slot (r-s) mod N to the right and receive slot
     (r-s-1) mod N from the left: every step forwards what arrived the step
     before, so all links are busy all the time.

Worked example, N=4, rank r starts with x_r; slot each rank sends per step:

  step | rank 0 | rank 1 | rank 2 | rank 3
  -----+--------+--------+--------+-------
    0  |  x0    |  x1    |  x2    |  x3
    1  |  x3    |  x0    |  x1    |  x2
    2  |  x2    |  x3    |  x0    |  x1
  result on every rank: [x0, x1, x2, x3]

Extra memory: none (the pieces travel between the slots of ``tensor_list``).

Reference: Patarasuk and Yuan, JPDC 2009 (the all-gather half of ring all-reduce).
"""
from ._cost import NOTHING, Tally, pieces


def ring_all_gather(comm, chunks, step0=0):
    """In place: ``chunks[comm.rank]`` is valid on entry; all chunks are valid on exit."""
    n, r = comm.size, comm.rank
    right, left = (r + 1) % n, (r - 1) % n
    for s in range(n - 1):
        send_i, recv_i = (r - s) % n, (r - s - 1) % n
        comm.sendrecv(chunks[send_i], right, chunks[recv_i], left, step0 + s)


def tally_ring_all_gather(tally, sizes, step0=0):
    """Count :func:`ring_all_gather` over chunks of ``sizes`` bytes."""
    tally.ring(sizes, range(step0, step0 + tally.n - 1))


def cost(n, s, item=1):
    """S = the whole output (N pieces of S/N)."""
    if n == 1:
        return NOTHING
    t = Tally(n)
    tally_ring_all_gather(t, [pieces(s, n, item)[0]] * n)
    return t.cost()


def all_gather(comm, tensor_list, tensor):
    tensor_list[comm.rank].copy_(tensor)
    ring_all_gather(comm, tensor_list)
