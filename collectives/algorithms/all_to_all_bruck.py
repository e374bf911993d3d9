"""all_to_all, Bruck's index algorithm: ceil(log2 N) steps, with local rotations.

Semantics: ``output_tensor_list[j]`` on rank i ends equal to
``input_tensor_list[i]`` on rank j. Every piece must have the same number of
elements (``collectives.all_to_all`` refuses uneven pieces for this algorithm:
a piece travels through ranks that neither send nor receive it, and they could
not know its size).

Communication steps: ceil(log2 N)
Messages each rank sends: ceil(log2 N), one per step
Bytes each rank sends: about (N/2) ceil(log2 N) * S/N  (S = one rank's whole input,
  N pieces of S/N): each step moves the blocks whose index has that step's bit
  set, about half of them, so a piece may travel several hops. More bytes than
  ``pairwise``'s (N-1) S/N, in log2 N messages instead of N-1: a small-message
  algorithm.

Steps (rank r, slots 0..N-1 of one piece each):
  1. Rotate up: slot i holds the piece for rank (r+i) mod N (``input[(r+i) mod N]``).
  2. For d = 1, 2, 4, ... < N: pack the slots i with bit d set, send them to rank
     (r+d) mod N, receive the same slots from rank (r-d) mod N, unpack. A piece in
     slot i is d closer to its destination after each set bit d of i: after the
     last step every piece is home, and slot i holds the piece from rank (r-i) mod N.
  3. Rotate down: ``output[(r-i) mod N]`` = slot i. (The slots are the outputs
     themselves, in rotated order, so the rotations are the only local copies.)

Worked example, N=4, rank r holds pieces x_r0 .. x_r3 (x_rj is for rank j); rank 0's slots:

  start (rotated)  | x00 x01 x02 x03
  step 0 (d=1)     | sends slots 1, 3 (x01, x03) to rank 1; gets slots 1, 3 from rank 3:
                   | x00 x30 x02 x32
  step 1 (d=2)     | sends slots 2, 3 (x02, x32) to rank 2; gets slots 2, 3 from rank 2:
                   | x00 x30 x20 x10
  rotate down: output[(0-i) mod 4] = slot i: [x00, x10, x20, x30].

Extra memory: two buffers of the largest packed message (about S/2 each): one
to pack into, one to receive into.

Reference: Bruck, Ho, Kipnis, Upfal and Weathersby, "Efficient algorithms for
all-to-all communications in multiport message-passing systems", IEEE TPDS
8(11), 1997 (the index algorithm, radix 2); Thakur, Rabenseifner and Gropp,
IJHPCA 2005 (MPICH's alltoall for short messages).
"""
from ._cost import NOTHING, Tally, pieces

AUTO = "never"   # algorithm=None: pieces of one size only, while all_to_all allows uneven ones (collectives.tuning.choice)


def moving(n, d):
    """The slots that move at distance ``d``: those whose index has bit ``d`` set."""
    return [i for i in range(n) if i & d]


def distances(n):
    d = 1
    while d < n:
        yield d
        d <<= 1


def cost(n, s, item=1):
    """S = one rank's whole input (N pieces of S/N)."""
    if n == 1:
        return NOTHING
    c = pieces(s, n, item)[0]
    t = Tally(n)
    most = 0
    for step, d in enumerate(distances(n)):
        m = len(moving(n, d))
        most = max(most, m)
        for r in range(n):
            t.message(step, r, (r + d) % n, m * c)
    for r in range(n):
        t.allocate(r, 2 * most * c)
    return t.cost()


def all_to_all(comm, output_tensor_list, input_tensor_list):
    n, r = comm.size, comm.rank
    c = input_tensor_list[0].numel()
    # slot i lives in output[(r-i) mod n], where it ends: every piece has c elements
    slots = [output_tensor_list[(r - i) % n] for i in range(n)]
    for i in range(n):
        slots[i].copy_(input_tensor_list[(r + i) % n])
    most = max((len(moving(n, d)) for d in distances(n)), default=0)
    buffers = input_tensor_list[0].new_empty(2 * most * c)
    packed, inbox = buffers[:most * c], buffers[most * c:]
    for step, d in enumerate(distances(n)):
        idx = moving(n, d)
        for k, i in enumerate(idx):
            packed[k * c:(k + 1) * c].copy_(slots[i])
        size = len(idx) * c
        comm.sendrecv(packed[:size], (r + d) % n, inbox[:size], (r - d) % n, step)
        for k, i in enumerate(idx):
            slots[i].copy_(inbox[k * c:(k + 1) * c])
