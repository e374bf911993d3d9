"""broadcast, pipeline: the tensor flows in segments down a chain of ranks.

Semantics: every rank's ``tensor`` ends equal to the root's.

Communication steps: N-2+K, with K = ceil(S / SEGMENT_BYTES) segments
Messages each rank sends: K (the last rank of the chain sends none)
Bytes each rank sends: S; no link carries more than S, so for large S the
  time approaches S / bandwidth whatever N is

Steps (chain in relative order v = (rank - root) mod N: 0 -> 1 -> ... -> N-1):
  1. Cut the tensor into K segments.
  2. Rank v posts the receives of all K segments from v-1 at once; as each
     one arrives it forwards it to v+1 (without waiting for the previous
     forward), so all links work at once after the pipeline fills. Segment k
     crosses link v -> v+1 in step v + k.

Worked example, N=4, root 0, K=3 segments s0, s1, s2:

  step | link 0->1 | link 1->2 | link 2->3
  -----+-----------+-----------+----------
    0  |    s0     |           |
    1  |    s1     |    s0     |
    2  |    s2     |    s1     |    s0
    3  |           |    s2     |    s1
    4  |           |           |    s2

Reference: Traff and Ripke, "Optimal broadcast for fully connected
processor-node networks", JPDC 2008 (pipelined chains); MPICH/Open MPI
"pipeline" broadcast.

Extra memory: none (every segment lands in its own slice of the tensor).
"""
from ._cost import NOTHING, Tally

SEGMENT_BYTES = 1 << 20


def cost(n, s, item=1):
    if n == 1:
        return NOTHING
    seg = max(1, SEGMENT_BYTES // item) * item
    sizes = [min(seg, s - x) for x in range(0, s, seg)]
    t = Tally(n)
    # every rank but the last forwards every segment (O(N + segments), not their product): rank
    # v sends segment k at step v + k, so step q carries segments max(0, q-N+2) .. min(q, K-1)
    # (virtual ranks: the root is 0, as rank r is (r - root) mod N; the busiest figures are alike)
    total, count = sum(sizes), sum(1 for x in sizes if x)
    for v in range(n - 1):
        t.stream(v, v + 1, total, count)
    # the largest segment in each window of steps: the segments are equal but the last
    for q in range(n - 1 + len(sizes) - 1 if sizes else 0):
        lo, hi = max(0, q - (n - 2)), min(q, len(sizes) - 1)
        big = max(sizes[lo], sizes[hi])       # a window of equal segments and maybe the shorter last
        if big:
            t.largest[q] = big
    return t.cost()


def broadcast(comm, tensor, root, segment_bytes=None):
    n = comm.size
    v = (comm.rank - root) % n
    prev, nxt = (comm.rank - 1) % n, (comm.rank + 1) % n
    seg = max(1, (segment_bytes or SEGMENT_BYTES) // max(1, tensor.element_size()))
    segments = list(tensor.split(seg)) or [tensor]
    # Each segment lands in its own slice of the tensor, so every receive can be
    # posted at once, and each segment is forwarded the moment it has arrived
    # without waiting for the previous forward: no rank ever idles a link.
    incoming = [comm.post(v - 1 + k, recvs=[(s, prev)]) for k, s in enumerate(segments)] if v > 0 else []
    outgoing = []
    for k, segment in enumerate(segments):
        if incoming:
            incoming[k].wait()
        if v < n - 1:
            outgoing.append(comm.post(v + k, sends=[(segment, nxt)]))
    for pending in outgoing:
        pending.wait()
