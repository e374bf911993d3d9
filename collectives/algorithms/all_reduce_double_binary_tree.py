"""all_reduce, double binary tree (NCCL's tree algorithm): two complementary binary
trees, each reducing and broadcasting half of the tensor, pipelined in chunks.

Semantics: every rank ends with ``op`` over all ranks' tensors, bitwise equal
(each element is combined once, at its tree's root, and copied down).

Communication steps: the chain of one chunk is 2h hops (h = the trees' height,
  about log2 N): up to the root, then down; K chunks per half follow each other,
  so a call takes about K + 2h hop times, not 2hK. (``steps`` in ``cost()``
  counts tags: one per chunk, half, direction and level.)
  K = min(MAX_CHUNKS, ceil(S / (2 * CHUNK_BYTES))) chunks per half.
Messages each rank sends: at most 3K per tree (one up, two down per chunk)
Bytes each rank sends: about 2 S on a rank that is inner in one tree and a leaf
  in the other (S/2 up and 2 x S/2 down in the first, S/2 up in the second);
  the ring sends 2(N-1)/N S. What the trees buy is latency: log2 N hops,
  not 2(N-1), with every rank busy in both directions.

The trees (NCCL's ``ncclGetBtree`` and ``ncclGetDtree``):
  * tree 0, an in-order binary tree over ranks 0..N-1: a rank whose lowest set
    bit is b has children r - b/2 and r + b/2 (the latter, or the nearest
    r + b/4, r + b/8, ... below N); the root 0 has one child, the largest power
    of two below N. The odd ranks are its leaves.
  * tree 1: tree 0 mirrored (rank r plays N-1-r) when N is even, shifted by one
    (rank r plays r-1) when N is odd. For even N the leaves of one tree are the
    inner ranks of the other, so every rank has at most two children in total
    and the two halves' traffic spreads over all links.

Steps (rank r; half t of the tensor goes through tree t, cut into K chunks):
  1. Post every down receive (the result of chunk q of half t, from the parent
     in tree t) straight into the tensor: it cannot arrive before this rank's
     own contribution to that chunk has left, and it is the final value.
  2. Up, per chunk q and tree t: receive the children's partial sums (into
     DEPTH slots per child), fold them into the own chunk, send it to the
     parent. At the root the chunk is then final: send it down to the children.
  3. Down, per chunk: when the result arrives from the parent, send it on to
     the children.
  Each rank handles its events in the order of a virtual clock in which every
  message arrives strictly later than it left (a chunk q leaves a rank at depth
  d on the way up at q + h - d, and on the way down at q + h + d): so no rank
  ever waits for a message whose sender is waiting, in turn, for it. Sends are
  posted without waiting, so the trees' levels and the two trees overlap.

Worked example, N=4, K=1, SUM, rank r holds [a_r, b_r] (a goes through tree 0, b tree 1):

  tree 0: 0 - 2 - {1, 3}      tree 1 (mirror): 3 - 1 - {2, 0}
  up:   1 -> 2 (a1), 3 -> 2 (a3);   2 -> 1 (b2), 0 -> 1 (b0)
        2 -> 0 (a1+a2+a3);          1 -> 3 (b0+b1+b2)
        root 0: A = a0+a1+a2+a3;     root 3: B = b0+b1+b2+b3
  down: 0 -> 2 (A);  3 -> 1 (B)
        2 -> 1, 2 -> 3 (A);         1 -> 2, 1 -> 0 (B)
  result on every rank: [A, B]. Rank 2 is inner in tree 0 and a leaf in tree 1,
  rank 1 the other way round.

Extra memory: DEPTH chunk-sized slots per child per tree (the partial sums
received on the way up); at most 3 children in all, 2 for even N.

Reference: Sanders, Speck and Träff, "Two-tree algorithms for full bandwidth
broadcast, reduction and scan", Parallel Computing 35(12), 2009; Jeaugey,
"Massively scale your deep learning training with NCCL 2.4", NVIDIA developer
blog, 2019 (double binary trees in NCCL).
"""
from ._cost import NOTHING, Tally
from ._util import split_bounds

AUTO = "measured"   # algorithm=None picks it only where tuning measured it win (collectives.tuning.choice)

CHUNK_BYTES = 1 << 20
MAX_CHUNKS = 8
DEPTH = 2


def btree(n, r):
    """(parent, children) of rank ``r`` in NCCL's binary tree over 0..n-1 (parent None at the root)."""
    if r == 0:
        return None, ([1 << ((n - 1).bit_length() - 1)] if n > 1 else [])
    bit = r & -r
    parent = (r ^ bit) | (bit << 1)
    if parent >= n:
        parent = r ^ bit
    children = []
    low = bit >> 1
    if low:
        children.append(r - low)
        while low and r + low >= n:
            low >>= 1
        if low:
            children.append(r + low)
    return parent, children


def tree(n, r, t):
    """(parent, children) of rank ``r`` in tree ``t`` (0 or 1) of the double binary tree."""
    if t == 0:
        return btree(n, r)
    if n % 2:   # shift by one
        p, cs = btree(n, (r - 1) % n)
        return (None if p is None else (p + 1) % n), [(c + 1) % n for c in cs]
    p, cs = btree(n, n - 1 - r)   # mirror
    return (None if p is None else n - 1 - p), [n - 1 - c for c in cs]


def depth(n, r, t):
    d = 0
    while (r := tree(n, r, t)[0]) is not None:
        d += 1
    return d


def chunks(half_bytes, chunk_bytes=None):
    """K: how many chunks each half is cut into (the larger half has ``half_bytes``)."""
    return max(1, min(MAX_CHUNKS, -(-half_bytes // (chunk_bytes or CHUNK_BYTES))))


def _layout(n, numel, item, chunk_bytes=None):
    """(bounds, K, heights): element bounds of the K chunks of each half (bounds[t][q] ..
    bounds[t][q + 1]), and the height of each tree."""
    halves = split_bounds(numel, 2)
    k = chunks((halves[1] - halves[0]) * item, chunk_bytes)
    bounds = []
    for t in range(2):
        lo = halves[t]
        bounds.append([lo + b for b in split_bounds(halves[t + 1] - lo, k)])
    height = [max(depth(n, r, t) for r in range(n)) for t in range(2)]
    return bounds, k, height


def tag(t, q, up, level, height):
    """The step of a message of tree ``t``, chunk ``q``, sent by a rank at depth ``level``.

    One tag per chunk, tree, direction and level: messages of one level of one
    tree go at once, and no two messages between the same two ranks share one.
    """
    h = max(height)
    return ((q * 2 + (0 if up else 1)) * (h + 1) + level) * 2 + t


def cost(n, s, item=1):
    if n == 1:
        return NOTHING
    numel = s // item
    bounds, k, height = _layout(n, numel, item)
    tally = Tally(n)
    for r in range(n):
        for t in range(2):
            parent, children = tree(n, r, t)
            d = depth(n, r, t)
            slot = max(bounds[t][q + 1] - bounds[t][q] for q in range(k)) * item
            tally.allocate(r, len(children) * min(DEPTH, k) * slot)
            for q in range(k):
                nbytes = (bounds[t][q + 1] - bounds[t][q]) * item
                if parent is not None:
                    tally.message(tag(t, q, True, d, height), r, parent, nbytes)
                for c in children:
                    tally.message(tag(t, q, False, d, height), r, c, nbytes)
                    tally.reduce(r, nbytes)
    return tally.cost()


def time(n, s, alpha, beta, gamma):
    """Seconds in the alpha-beta-gamma model: a chunk's 2h hops, then one hop per further
    chunk; an inner rank sends three chunks (one up, two down) and folds two per hop time."""
    if n == 1:
        return 0.0
    _, k, height = _layout(n, s, 1)
    chunk = s / 2 / k
    hop = alpha + chunk * beta
    return (2 * max(height) + k - 1) * 3 * hop + 2 * (k + max(height)) * chunk * gamma


def all_reduce(comm, tensor, op, chunk_bytes=None, depth_slots=DEPTH):
    n, r = comm.size, comm.rank
    if n == 1:
        return
    bounds, k, height = _layout(n, tensor.numel(), tensor.element_size(), chunk_bytes)
    piece = [[tensor[bounds[t][q]:bounds[t][q + 1]] for q in range(k)] for t in range(2)]
    slots = min(depth_slots, k)
    family = [tree(n, r, t) for t in range(2)]
    level = [depth(n, r, t) for t in range(2)]
    # the inboxes: per tree and child, ``slots`` chunk-sized buffers (one allocation)
    sizes = [max(p.numel() for p in piece[t]) for t in range(2)]
    total = sum(len(family[t][1]) * slots * sizes[t] for t in range(2))
    inbox = tensor.new_empty(total)
    boxes, at = {}, 0
    for t in range(2):
        for c in family[t][1]:
            boxes[t, c] = [inbox[at + i * sizes[t]:at + (i + 1) * sizes[t]] for i in range(slots)]
            at += slots * sizes[t]

    def post_up_recv(t, q, c):
        buf = boxes[t, c][q % slots][:piece[t][q].numel()]
        return comm.post(tag(t, q, True, level[t] + 1, height), recvs=[(buf, c)]), buf

    sends = []
    down = {}
    up = {}
    for t in range(2):
        parent, children = family[t]
        for q in range(k):
            if parent is not None:
                down[t, q] = comm.post(tag(t, q, False, level[t] - 1, height),
                                       recvs=[(piece[t][q], parent)])
        for q in range(slots):
            for c in children:
                up[t, q, c] = post_up_recv(t, q, c)

    def send_down(t, q):
        children = family[t][1]
        if children:
            sends.append(comm.post(tag(t, q, False, level[t], height),
                                   sends=[(piece[t][q], c) for c in children]))

    # every rank takes its events in the order of one virtual clock (see the card)
    events = []
    for t in range(2):
        h, d = height[t], level[t]
        for q in range(k):
            events.append((q + h - d, 0, t, q))          # up: children's sums in, own sum out
            if family[t][0] is not None:
                events.append((q + h + d, 1, t, q))      # down: the result in, on to the children
    events.sort()
    for _, kind, t, q in events:
        parent, children = family[t]
        if kind == 0:
            for c in children:
                pending, buf = up.pop((t, q, c))
                pending.wait()
                op.combine(piece[t][q], buf)
                if q + slots < k:
                    up[t, q + slots, c] = post_up_recv(t, q + slots, c)
            if parent is not None:
                sends.append(comm.post(tag(t, q, True, level[t], height),
                                       sends=[(piece[t][q], parent)]))
            else:
                send_down(t, q)
        else:
            down.pop((t, q)).wait()
            send_down(t, q)
    for pending in sends:
        pending.wait()
