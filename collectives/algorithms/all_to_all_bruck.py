"""all_to_all, Bruck's index algorithm: ceil(log2 N) steps, with local rotations.

Semantics: ``output_tensor_list[j]`` on rank i ends equal to
``input_tensor_list[i]`` on rank j. Every piece on every rank must have the same
number of elements: a piece travels through ranks that neither send nor receive
it, and they could not know its size. A rank cannot see its peers' pieces, so
the ranks first agree on them (step 0): every rank raises the same ValueError,
naming the ranks whose pieces differ, instead of some ranks waiting for a
message of the size they expected until COLLECTIVES_TIMEOUT.

Communication steps: 2 ceil(log2 N) (half of them the 16-byte agreement)
Messages each rank sends: 2 ceil(log2 N), two per distance
Bytes each rank sends: about (N/2) ceil(log2 N) * S/N  (S = one rank's whole input,
  N pieces of S/N): each step moves the blocks whose index has that step's bit
  set, about half of them, so a piece may travel several hops. More bytes than
  ``pairwise``'s (N-1) S/N, in log2 N messages instead of N-1: a small-message
  algorithm. Plus 16 (N-1) bytes of agreement.

Steps (rank r, slots 0..N-1 of one piece each):
  0. Agree: all-gather every rank's (smallest, largest) piece, inputs and outputs
     alike, as two int64s, by Bruck's concatenation (for d = 1, 2, 4, ... < N send
     the min(d, N-d) pairs known so far to rank (r-d) mod N, receive as many from
     rank (r+d) mod N). If any rank's smallest differs from its largest or from
     rank 0's piece, every rank holds the same table and raises the same error.
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
  (Before step 0, the agreement: at d=1 rank 0 sends its (1, 1) to rank 3 and gets
  rank 1's; at d=2 it sends the two pairs it knows to rank 2 and gets ranks 2's and 3's.)

Extra memory: two buffers of the largest packed message (about S/2 each): one
to pack into, one to receive into; and the agreement's table of 16 N bytes.

Reference: Bruck, Ho, Kipnis, Upfal and Weathersby, "Efficient algorithms for
all-to-all communications in multiport message-passing systems", IEEE TPDS
8(11), 1997 (the index algorithm, radix 2); Thakur, Rabenseifner and Gropp,
IJHPCA 2005 (MPICH's alltoall for short messages).
"""
import torch

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


PAIR = 16   # bytes of one rank's (smallest, largest) piece, two int64s


def cost(n, s, item=1):
    """S = one rank's whole input (N pieces of S/N)."""
    if n == 1:
        return NOTHING
    c = pieces(s, n, item)[0]
    t = Tally(n)
    hops = len(list(distances(n)))
    for step, d in enumerate(distances(n)):
        for r in range(n):
            t.message(step, r, (r - d) % n, min(d, n - d) * PAIR)
    most = 0
    for step, d in enumerate(distances(n)):
        m = len(moving(n, d))
        most = max(most, m)
        for r in range(n):
            t.message(hops + step, r, (r + d) % n, m * c)
    for r in range(n):
        t.allocate(r, 2 * most * c + n * PAIR)
    return t.cost()


def agree(comm, output_tensor_list, input_tensor_list):
    """Step 0: every rank's (smallest, largest) piece on every rank; the same refusal everywhere."""
    n, r = comm.size, comm.rank
    sizes = [t.numel() for t in (*input_tensor_list, *output_tensor_list)]
    # on the pieces' device: an NCCL group sends device memory only
    known = input_tensor_list[0].new_empty((n, 2), dtype=torch.int64)
    known[0, 0], known[0, 1] = min(sizes), max(sizes)
    for step, d in enumerate(distances(n)):
        k = min(d, n - d)
        comm.sendrecv(known[:k], (r - d) % n, known[d:d + k], (r + d) % n, step)
    if known.is_meta:    # the simulator's tensors carry sizes, not values: nothing to read
        return len(list(distances(n)))
    table = {(r + i) % n: (int(known[i, 0]), int(known[i, 1])) for i in range(n)}
    odd = [q for q in range(n) if table[q][0] != table[q][1]]
    if not odd and len({lo for lo, _ in table.values()}) > 1:
        # every rank's pieces are even, of different sizes: name those off the commonest size
        lows = [table[q][0] for q in range(n)]
        common = max(sorted(set(lows)), key=lows.count)
        odd = [q for q in range(n) if lows[q] != common]
    if odd:
        held = ", ".join(f"rank {q}: {lo}" + (f"..{hi}" if hi != lo else "")
                         for q, (lo, hi) in sorted(table.items()))
        who = f"ranks {odd}" if len(odd) > 1 else f"rank {odd[0]}"
        raise ValueError(f"collectives.all_to_all: algorithm='bruck' needs pieces of one size on "
                         f"every rank; they differ on {who} (elements per input and output "
                         f"piece, {held}); for uneven pieces use 'linear' or 'pairwise'")
    return len(list(distances(n)))


def all_to_all(comm, output_tensor_list, input_tensor_list):
    n, r = comm.size, comm.rank
    hops = agree(comm, output_tensor_list, input_tensor_list)
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
        comm.sendrecv(packed[:size], (r + d) % n, inbox[:size], (r - d) % n, hops + step)
        for k, i in enumerate(idx):
            slots[i].copy_(inbox[k * c:(k + 1) * c])
