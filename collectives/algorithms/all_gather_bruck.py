"""all_gather, Bruck's algorithm: ceil(log2 N) steps for any group size, then a rotation.

Semantics: ``tensor_list[i]`` on every rank ends as rank i's ``tensor``.

Communication steps: ceil(log2 N), for any N (recursive doubling needs
  log2(P) + 2 when N is not a power of two P)
Messages each rank sends: ceil(log2 N), one per step
Bytes each rank sends: (N-1) * S/N  (S = the whole output, N pieces of S/N):
  the least any all-gather can send, like the ring, in log2 N steps instead of N-1

Steps (rank r, a working buffer of N blocks; block i will hold rank (r+i) mod N's piece):
  1. Put the own piece in block 0.
  2. For d = 1, 2, 4, ... < N: send blocks 0 .. m-1, m = min(d, N-d), to rank
     (r-d) mod N and receive blocks d .. d+m-1 from rank (r+d) mod N. Before the
     step a rank holds the d pieces of ranks r .. r+d-1; rank r+d holds those of
     r+d .. r+2d-1, which are exactly the ones it sends: the run doubles, and the
     last step, for N not a power of two, sends only the N-d blocks still missing.
  3. Rotate: block i is rank (r+i) mod N's piece; copy it to ``tensor_list[(r+i) mod N]``.

Worked example, N=4, rank r starts with x_r; blocks each rank holds after each step:

  step | d | rank 0            | rank 1            | rank 2            | rank 3
  -----+---+-------------------+-------------------+-------------------+------------------
    0  | 1 | x0 x1             | x1 x2             | x2 x3             | x3 x0
    1  | 2 | x0 x1 x2 x3       | x1 x2 x3 x0       | x2 x3 x0 x1       | x3 x0 x1 x2
  rotation: rank 1 writes its blocks to slots 1, 2, 3, 0: [x0, x1, x2, x3] everywhere.

  With N=3 the second step (d=2) sends one block (min(2, 3-2) = 1): 2 steps, not
  the fold's 3 (``recursive_doubling``).

Extra memory: S, the working buffer of N blocks (each step sends a run of
blocks, which ``tensor_list``'s separate tensors are not).

Reference: Bruck, Ho, Kipnis, Upfal and Weathersby, "Efficient algorithms for
all-to-all communications in multiport message-passing systems", IEEE TPDS
8(11), 1997 (the concatenation algorithm); Thakur, Rabenseifner and Gropp,
IJHPCA 2005, section 3 (MPICH's all-gather for short messages on any N).
"""
from ._cost import NOTHING, Tally, pieces

AUTO = "measured"   # algorithm=None picks it only where tuning measured it win (collectives.tuning.choice)


def distances(n):
    """The steps' distances d = 1, 2, 4, ... < n, each with its run length min(d, n - d)."""
    d = 1
    while d < n:
        yield d, min(d, n - d)
        d <<= 1


def cost(n, s, item=1):
    """S = the whole output (N pieces of S/N)."""
    if n == 1:
        return NOTHING
    c = pieces(s, n, item)[0]
    t = Tally(n)
    for step, (d, m) in enumerate(distances(n)):
        for r in range(n):
            t.message(step, r, (r - d) % n, m * c)
    for r in range(n):
        t.allocate(r, n * c)
    return t.cost()


def all_gather(comm, tensor_list, tensor):
    n, r = comm.size, comm.rank
    c = tensor.numel()
    work = tensor.new_empty(n * c)
    work[:c].copy_(tensor)
    for step, (d, m) in enumerate(distances(n)):
        comm.sendrecv(work[:m * c], (r - d) % n, work[d * c:(d + m) * c], (r + d) % n, step)
    for i in range(n):
        tensor_list[(r + i) % n].copy_(work[i * c:(i + 1) * c])
