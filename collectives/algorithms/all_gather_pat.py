"""all_gather, PAT (Parallel Aggregated Trees, NCCL 2.23): a tree per rank, far hops first, bounded aggregation.

Semantics: ``tensor_list[i]`` on every rank ends as rank i's ``tensor``.

Communication steps: ceil(log2 N) while (P/2) blocks fit in one message (P = the
  power of two >= N; a block is S/N); with aggregation bounded to windows of A
  offsets (A a power of two, 2 <= A <= P; at most A/2 blocks a message), (W - 1) + W log2 A messages where
  W = ceil(N/A) windows; A = 2 (a block over the bound): N - 1 one-block messages
Messages each rank sends: as many as steps (one per step)
Bytes each rank sends: (N-1) * S/N, the least an all-gather can send, whatever A

Every rank's block travels down its own binomial tree over *offsets*: the rank
holding rank s's block at offset x = (r - s) mod N gives it to offset x + 2^d, for
each 2^d below x's lowest set bit (the source, offset 0: every 2^d < P), as long as
x + 2^d < N. All N trees have the same shape, shifted, so at one step every rank
sends the same offsets of *different* trees to the same peer: those blocks travel
together in one message (the aggregation). Bruck's all-gather walks these trees
near hops first; PAT walks them far hops first, so the one-block messages cross
the long distances and the large aggregated ones go to near ranks (on a cluster,
inside a node or a rail). The number of blocks one message may hold is bounded
(``AGG_BYTES``): the offsets are cut into windows of A, whose roots are visited one
block at a time, and each window's own levels travel aggregated.

Steps (rank r, A = ``aggregation(N, block bytes)``, W = ceil(N/A) windows of offsets
[hA, hA + A)); "give offset x to distance d" means: send the block at offset x - d
to r + d and receive the block at offset x from r - d, which is rank (r - x)'s:
  1. Put the own block in ``tensor_list[r]``.
  2. For each window h = 0, 1, ..., W-1 (its parent window h - lowbit(h) comes
     before it; run backwards, as ``reduce_scatter_pat`` runs it, this order keeps
     only one window and its root's ancestors half-reduced at a time):
     a. if h > 0: give offset hA to distance lowbit(h) * A (one block);
     b. for d = A/2, A/4, ..., 1: give every offset x = hA + l of the window whose
        lowest set bit of l is d (and x < N) to distance d, all in one message.
  3. A message of several blocks is packed into, and unpacked from, a staging buffer.

Worked example, N=4, full aggregation (A = 4, one window), rank r starts with x_r:

  step | distance | rank 0 gets | rank 1 gets | rank 2 gets | rank 3 gets
  -----+----------+-------------+-------------+-------------+------------
    0  |    2     | x2          | x3          | x0          | x1
    1  |    1     | x3, x1      | x0, x2      | x1, x3      | x2, x0
  (step 0 sends the own block to r+2; step 1 sends offsets 0 and 2, the own block
  and the one just received, to r+1.) With A = 2 (two windows, [0, 2) and [2, 4)):
  step 0 gives offset 1 to distance 1 (window 0's level), step 1 offset 2 to
  distance 2 (window 1's root), step 2 offset 3 to distance 1: three one-block
  messages. Far hops come first inside a window; across windows, a window's root
  hop (distance >= A) comes before its levels (distances < A).

Extra memory: 2 * (A/2) blocks of staging (send and receive) when a message holds
more than one block, else none; never more than about 2 * ``AGG_BYTES``.

Reference: Sylvain Jeaugey, "PAT: a new algorithm for all-gather and reduce-scatter
operations at scale", arXiv 2506.20252 (2025), as shipped in NCCL 2.23
(``PatAGAlgorithm`` in NVIDIA/nccl's src/include/collectives.h: the trees and the
aggregation factor). The window split here is this module's simple reading of the
bounded aggregation, not NCCL's state machine (which also orders the aggregated
steps by bit mirroring).
"""
from functools import lru_cache

from ._cost import CHUNK_BYTES, NOTHING, Cost
from ._util import ceil_log2

AUTO = "measured"   # on a flat switch it equals Bruck's figures; its gain is on hierarchical networks

AGG_BYTES = CHUNK_BYTES
"""Most bytes of blocks one message holds: bounds the staging buffers (the "bounded
aggregation"); small calls aggregate fully and take ceil(log2 N) steps."""


def aggregation(n, block_bytes, limit=None):
    """A: the power of two of offsets one window holds (its largest message: A/2 blocks)."""
    p = 1 << ceil_log2(n)
    limit = AGG_BYTES if limit is None else limit
    if block_bytes == 0 or p <= 2:
        return p
    fit = max(1, limit // block_bytes)            # blocks one message may hold
    return min(p, 2 << (fit.bit_length() - 1))     # A/2 = the largest power of two <= fit


@lru_cache(maxsize=256)
def schedule(n, a):
    """The messages of one call, in order: (distance, offsets sent, offsets received);
    a rank sends the blocks at the sent offsets to r + distance and receives those at the
    received offsets from r - distance (received offset = sent offset + distance)."""
    out = []
    for h in range(-(-n // a)):
        base = h * a
        if h:
            d = (h & -h) * a
            out.append((d, (base - d,), (base,)))
        d = a >> 1
        while d:
            got = tuple(x for x in range(base + d, min(base + a, n), 2 * d))
            if got:
                out.append((d, tuple(x - d for x in got), got))
            d >>= 1
    return tuple(out)


def cost(n, s, item=1):
    """S = the whole output (N blocks of S/N)."""
    if n == 1:
        return NOTHING
    block = (s // item // n) * item
    if block == 0:
        return NOTHING
    plan = schedule(n, aggregation(n, block))
    widest = max(len(sent) for _, sent, _ in plan)
    # every rank sends and receives the same message in every step: no need to tally
    # rank by rank (which at N = 4096 and a block per message takes N^2 calls)
    total = (n - 1) * block
    return Cost(steps=len(plan), messages=len(plan), total_messages=n * len(plan),
                sent_bytes=total, recv_bytes=total, critical_bytes=total,
                extra_memory=2 * widest * block if widest > 1 else 0)


def all_gather(comm, tensor_list, tensor):
    n, r = comm.size, comm.rank
    c = tensor.numel()
    plan = schedule(n, aggregation(n, c * tensor.element_size()))
    tensor_list[r].copy_(tensor)
    block = lambda x: tensor_list[(r - x) % n]  # noqa: E731  (the block at offset x)
    widest = max((len(sent) for _, sent, _ in plan), default=0)
    stage = tensor.new_empty(2 * widest * c) if widest > 1 else None
    for step, (d, sent, got) in enumerate(plan):
        to, frm = (r + d) % n, (r - d) % n
        if len(sent) == 1:   # one block: straight from and into place, no copy
            comm.sendrecv(block(sent[0]), to, block(got[0]), frm, step)
            continue
        out, inbox = stage[:len(sent) * c], stage[widest * c:(widest + len(got)) * c]
        for i, x in enumerate(sent):
            out[i * c:(i + 1) * c].copy_(block(x))
        comm.sendrecv(out, to, inbox, frm, step)
        for i, x in enumerate(got):
            block(x).copy_(inbox[i * c:(i + 1) * c])
