"""all_reduce, pipelined ring: the ring with each chunk cut into segments, so
the reduction of one segment overlaps with the transfer of the next.

Semantics: every rank ends with ``op`` over all ranks' tensors, bitwise equal.

Communication steps: 2(N-1)K segment-steps, K = min(MAX_SEGMENTS, ceil(S / (N * SEGMENT_BYTES)))
  segments per chunk; they overlap in time: each segment moves on as soon as it is ready
Messages each rank sends: 2(N-1)K, each about S/(NK) bytes
Bytes each rank sends: 2(N-1)/N * S, exactly like ``ring``
Time (alpha-beta-gamma): about 2(N-1)K alpha + 2(N-1)/N S beta + S/(NK) gamma
  when gamma <= beta: all but one segment's reduction hides behind transfers
  (``ring`` pays the whole (N-1)/N S gamma on top). K stays small because
  every segment costs a wake-up of the waiting thread, which is cheap on an
  idle core and milliseconds on an oversubscribed one.

Steps (left = r-1, right = r+1; chunk c is cut into segments c.0 .. c.K-1):
  1. Post the reduce-scatter sends of chunk r-1 and the first receives from
     the left (into DEPTH inbox slots of one segment each), and every all-gather
     receive straight into the tensor.
  2. Reduce-scatter: for each segment as it arrives (steps s = 0..N-2, then
     k = 0..K-1), fold it into the local copy of chunk r-s-2 and at once post
     it to the right: as step s+1's send, or, once s = N-2 and chunk r is
     final, as the all-gather's first send. Re-post the freed inbox slot.
  3. All-gather: as each final segment arrives, post it on to the right
     (unless it has gone all the way round).
  4. Wait for the outstanding sends.

Worked example, N=4, K=2, SUM, rank r holds [a_r, b_r, c_r, d_r]; what rank 0 does:

  posts send d0.0, d0.1 -> 1; receives c3.0 (from 3)
  c3.0 arrives: c0.0 += c3.0, send c0.0 -> 1 while c3.1 is still on the wire
  c3.1 arrives: c0.1 += c3.1, send c0.1 -> 1
  ... b.0, b.1 (step 1), then a.0, a.1 (step 2): a is final, so a.0 goes
  out as the all-gather's first message while a.1 is still being reduced;
  then D, C, B arrive segment by segment and are forwarded.
  result on every rank: [A, B, C, D], the same bits as ``ring``.

Extra memory: min(DEPTH, (N-1)K) segments of S/(NK), at most DEPTH/K chunks of
S/N (S/(2N) when K = 4): the inbox slots the reduce-scatter receives into; the
all-gather receives straight into the tensor. (Measured, largest rank, 64 MiB
float32: 15.9 MiB at N=2, 8.0 MiB at N=4; the built-in 2.0 MiB. ``python -m
benchmarks.memory -b 64M --world-size 2,4``, 2026-11-23.)

Reference: Patarasuk and Yuan, JPDC 2009 (segmented rings); gloo's
``allreduce_ring_chunked`` and NCCL's ring, which pipeline the same way.
"""
from ._cost import NOTHING, Tally, pieces
from ._util import split_bounds

SEGMENT_BYTES = 1 << 20
MAX_SEGMENTS = 4
DEPTH = 2


def segments(chunk_bytes, segment_bytes=None):
    """K: how many segments each chunk is cut into (the largest chunk has ``chunk_bytes``)."""
    return max(1, min(MAX_SEGMENTS, -(-chunk_bytes // (segment_bytes or SEGMENT_BYTES))))


def cost(n, s, item=1, depth=DEPTH):
    if n == 1:
        return NOTHING
    chunks = pieces(s, n, item)
    k = segments(chunks[0])
    segs = [pieces(c, k, item) for c in chunks]
    t = Tally(n)
    for q in range(k):     # segment q of every chunk goes round as a ring of its own
        sizes = [seg[q] for seg in segs]
        t.ring(sizes, [st * k + q for st in range(n - 1)], shift=1, reduce=True)     # reduce-scatter
        t.ring(sizes, [(n - 1) * k + st * k + q for st in range(n - 1)])             # all-gather
    for r in range(n):
        t.allocate(r, min(depth, (n - 1) * k) * segs[0][0])
    return t.cost()


def time(n, s, alpha, beta, gamma):
    """Seconds in the alpha-beta-gamma model: the reduction of each segment overlaps
    with the transfer of the next, so per step the slower of the two counts."""
    m = pieces(s, n)[0]
    k = segments(m)
    seg = m / k
    return (2 * (n - 1) * k * alpha + (n - 1) * m * max(beta, gamma) + seg * min(beta, gamma)
            + (n - 1) * m * beta)

def all_reduce(comm, tensor, op, segment_bytes=None, depth=DEPTH):
    n, r = comm.size, comm.rank
    if n == 1:
        return
    right, left = (r + 1) % n, (r - 1) % n
    chunks = list(tensor.tensor_split(n))
    k = segments(chunks[0].numel() * tensor.element_size(), segment_bytes)
    segs = [[c[a:b] for a, b in zip(split_bounds(c.numel(), k), split_bounds(c.numel(), k)[1:])]
            for c in chunks]
    slot = segs[0][0].numel()
    rs_total = (n - 1) * k   # reduce-scatter segment-steps; all-gather ones follow: tag rs_total + t*k + q
    depth = min(depth, rs_total)   # no more slots than segments to receive
    inbox = tensor.new_empty(depth * slot)
    slots = [inbox[i * slot:(i + 1) * slot] for i in range(depth)]

    def post_rs_recv(j):
        s, q = divmod(j, k)
        buf = slots[j % depth][:segs[(r - s - 2) % n][q].numel()]
        return comm.post(j, recvs=[(buf, left)]), buf

    sends = [comm.post(q, sends=[(segs[(r - 1) % n][q], right)]) for q in range(k)]
    inflight = {j: post_rs_recv(j) for j in range(min(depth, rs_total))}
    gathers = [comm.post(rs_total + t * k + q, recvs=[(segs[(r - t - 1) % n][q], left)])
               for t in range(n - 1) for q in range(k)]
    for j in range(rs_total):
        pending, buf = inflight.pop(j)
        pending.wait()
        s, q = divmod(j, k)
        seg = segs[(r - s - 2) % n][q]
        op.combine(seg, buf)
        if j + depth < rs_total:
            inflight[j + depth] = post_rs_recv(j + depth)
        # Step s+1 sends exactly the chunk step s reduced; after the last step it is final.
        sends.append(comm.post(j + k, sends=[(seg, right)]))
    for i, pending in enumerate(gathers):
        pending.wait()
        t, q = divmod(i, k)
        if t + 1 < n - 1:
            sends.append(comm.post(rs_total + (t + 1) * k + q, sends=[(segs[(r - t - 1) % n][q], right)]))
    for pending in sends:
        pending.wait()
