"""broadcast, pipeline: the tensor flows in segments down a chain of ranks.

Semantics: every rank's ``tensor`` ends equal to the root's.

Communication steps: N-2+K, with K = ceil(S / SEGMENT_BYTES) segments
Messages each rank sends: K (the last rank of the chain sends none)
Bytes each rank sends: S; no link carries more than S, so for large S the
  time approaches S / bandwidth whatever N is

Steps (chain in relative order v = (rank - root) mod N: 0 -> 1 -> ... -> N-1):
  1. Cut the tensor into K segments.
  2. Rank v receives segment k from v-1 and forwards it to v+1; while it
     forwards segment k it already receives segment k+1, so all links work at
     once after the pipeline fills. Segment k crosses link v -> v+1 in step v + k.

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
"""
SEGMENT_BYTES = 1 << 20


def broadcast(comm, tensor, root, segment_bytes=None):
    n = comm.size
    v = (comm.rank - root) % n
    prev, nxt = (comm.rank - 1) % n, (comm.rank + 1) % n
    has_prev, has_next = v > 0, v < n - 1
    seg = max(1, (segment_bytes or SEGMENT_BYTES) // max(1, tensor.element_size()))
    segments = list(tensor.split(seg)) or [tensor]
    incoming = comm.post(v - 1, recvs=[(segments[0], prev)]) if has_prev else None
    outgoing = None
    for k, segment in enumerate(segments):
        if has_prev:
            incoming.wait()
            if k + 1 < len(segments):
                incoming = comm.post(v - 1 + k + 1, recvs=[(segments[k + 1], prev)])
        if has_next:
            if outgoing is not None:
                outgoing.wait()
            outgoing = comm.post(v + k, sends=[(segment, nxt)])
    if outgoing is not None:
        outgoing.wait()
