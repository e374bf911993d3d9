"""reduce_scatter, PAT (Parallel Aggregated Trees): the PAT all-gather run backwards, a log-sized pool.

Semantics: ``output`` on rank i ends as ``op`` over every rank's ``input_list[i]``.

Communication steps: as ``all_gather_pat``: ceil(log2 N) while P/2 blocks fit in one
  message (P = the power of two >= N, a block = S/N), else (W-1) + W log2 A with A
  the aggregation bound and W = ceil(N/A)
Messages each rank sends: one per step
Bytes each rank sends and combines: (N-1) * S/N (the ring's figures)

The all-gather's trees reversed: block t's partial result flows up rank t's binomial
tree over offsets (x = (r - t) mod N on rank r) from the leaves to offset 0, near
hops first, the big aggregated messages to near ranks and the far hops one block at a
time. The order of the messages is exactly the reverse of ``all_gather_pat.schedule``;
each message's blocks are the all-gather's message with the roles swapped. A partial
result lives from the first contribution a rank receives for it until the rank sends
it on, and visiting the offsets window by window (the bounded aggregation) keeps at
most one window (A blocks) and the chain of the window roots' ancestors
(log2 W blocks) alive at once: the pool of partial blocks is log-sized, allocated
once, independent of N when A is bounded.

Steps (rank r; "take offset z from distance d" means: send the partial at offset
z + d to r - d, receive rank (r + d)'s partial for its offset z + d, which is my
offset z, and combine it into my partial at offset z):
  1. ``output`` = the own block input_list[r]: the partial at offset 0.
  2. For each all-gather message (d, sent, got), last first: send the partials at
     the offsets ``got`` to r - d (the input block itself where nothing was
     received for it: no copy), receive the partials for the offsets ``sent`` from
     r + d, combine each into its partial (a pool slot, seeded from the input
     block at the first contribution).
  3. Several blocks in one message are packed into a staging buffer and unpacked.

Worked example, N=4, SUM, full aggregation; rank r holds x_r = [A_r, B_r, C_r, D_r]:

  step | distance | rank 0 sends    | rank 0 receives (from 1)  | after the step, rank 0 holds
  -----+----------+-----------------+---------------------------+-----------------------------
    0  |    1     | D_0, B_0 to 3   | A_1, C_1                  | A_0+A_1, C_0+C_1
    1  |    2     | C_0+C_1 to 2    | A_2+A_3 (from 2)          | A_0+A_1+A_2+A_3
  Offsets on rank 0: 0 = block A (its own), 1 = D, 2 = C, 3 = B. Every rank does the
  same shifted: rank 1 ends with sum(B), rank 2 sum(C), rank 3 sum(D).

Extra memory: the pool (``pool_slots`` blocks, at most A + log2 W; 0 when every
partial goes straight out) plus staging: 2 * (A/2) blocks when a message holds
several, else one block to receive into.

Reference: Sylvain Jeaugey, "PAT: a new algorithm for all-gather and reduce-scatter
operations at scale", arXiv 2506.20252 (2025); NCCL 2.23's ``PatRSAlgorithm``
(NVIDIA/nccl, src/include/collectives.h), whose point is the same bounded buffer.
The window order is this module's reading of the bounded aggregation.
"""
from functools import lru_cache

from ._cost import NOTHING, Cost
from .all_gather_pat import aggregation, schedule

AUTO = "measured"


def steps(n, a):
    """The reduce-scatter's messages, in order: (distance, offsets sent to r - distance,
    offsets received from r + distance): the all-gather's, reversed, roles swapped."""
    return tuple((d, got, sent) for d, sent, got in reversed(schedule(n, a)))


@lru_cache(maxsize=256)
def pool_plan(n, a):
    """Which pool slot holds each offset's partial, message by message, and how many
    slots: [(slots freed by the message's sends, {offset: slot} of first contributions)]."""
    free, live, used, plan = [], {}, 0, []
    for _, out, into in steps(n, a):
        freed = [live.pop(x) for x in out if x in live]
        free.extend(freed)
        new = {}
        for z in into:
            if z and z not in live:
                if not free:
                    free.append(used)
                    used += 1
                free.sort()
                live[z] = new[z] = free.pop(0)
        plan.append(new)
    return tuple(plan), used


def pool_slots(n, a):
    return pool_plan(n, a)[1]


def cost(n, s, item=1):
    """S = the whole input (N blocks of S/N)."""
    if n == 1:
        return NOTHING
    block = (s // item // n) * item
    if block == 0:
        return NOTHING
    a = aggregation(n, block)
    todo = steps(n, a)
    widest = max(len(out) for _, out, _ in todo)
    total = (n - 1) * block   # every rank the same, every step (see all_gather_pat.cost)
    return Cost(steps=len(todo), messages=len(todo), total_messages=n * len(todo),
                sent_bytes=total, recv_bytes=total, critical_bytes=total, reduced_bytes=total,
                extra_memory=(pool_slots(n, a) + (2 * widest if widest > 1 else 1)) * block)


def reduce_scatter(comm, output, input_list, op):
    n, r = comm.size, comm.rank
    c = output.numel()
    a = aggregation(n, c * output.element_size())
    todo = steps(n, a)
    plan, slots = pool_plan(n, a)
    widest = max((len(out) for _, out, _ in todo), default=0)
    pool = output.new_empty(slots * c)
    stage = output.new_empty((2 * widest if widest > 1 else 1) * c)
    output.copy_(input_list[r])
    partial = {0: output}       # offset -> where its partial result lives

    def block(x):
        return partial.get(x, input_list[(r - x) % n])

    for step, ((d, out, into), new) in enumerate(zip(todo, plan)):
        to, frm = (r - d) % n, (r + d) % n
        if len(out) == 1:
            inbox = stage[:c]
            comm.sendrecv(block(out[0]), to, inbox, frm, step)
        else:
            packed, inbox = stage[:len(out) * c], stage[widest * c:(widest + len(into)) * c]
            for i, x in enumerate(out):
                packed[i * c:(i + 1) * c].copy_(block(x))
            comm.sendrecv(packed, to, inbox, frm, step)
        for x in out:
            partial.pop(x, None)   # sent on: its slot is free again
        for i, z in enumerate(into):
            if z in new:
                slot = pool[new[z] * c:(new[z] + 1) * c]
                slot.copy_(input_list[(r - z) % n])
                partial[z] = slot
            op.combine(partial[z], inbox[i * c:(i + 1) * c])
