"""all_reduce, hierarchical: reduce-scatter inside each host, all_reduce across hosts,
all-gather inside each host, the three overlapped through pipelined segments.

Semantics: every rank ends with ``op`` over all ranks' tensors, bitwise equal
(each element is combined on one rank per host in the same order, then copied).

The layout: H hosts of M ranks each (N = H M). It comes from, first match wins:
  * ``ranks_per_host=M`` (group ranks placed host by host) or ``hosts=[...]``
    (the host of each group rank), where the algorithm is called directly;
  * the door's ``hosts``: the real door derives them from ``LOCAL_WORLD_SIZE``
    (torchrun's ranks per host; global rank g on host g // L), so a group of
    any ranks, in any order, gets its true layout;
  * else one host (M = N, H = 1): a pipelined ring reduce-scatter + all-gather.
  Every rank derives the same layout from the same inputs, so all agree without
  a message. Hosts that hold different numbers of the group's ranks (5 ranks at
  2 per host: 2, 2, 1; a group of 3 of a 2x2 world: 2, 1) have no shard l on
  every host, so they take the unpipelined scheme below ("Uneven hosts").

Communication steps, per segment: 2(M-1) inside a host, 2(H-1) across hosts;
  K = min(MAX_SEGMENTS, ceil(S / SEGMENT_BYTES)) segments follow each other, so
  the slow phase (across hosts) of one overlaps the fast ones of the others.
Bytes each rank sends: 2(M-1)/M S inside its host, 2(H-1)/(HM) S across hosts.
Bytes over each host's link, each way: 2(H-1)/H S (M ranks x 2(H-1)/(HM) S):
  S for two hosts. A flat ring with ranks host by host sends 2(N-1)/N S over
  the link of each host it crosses: 1.5 S for 2 x 2, so the hierarchy's bound
  there is 1.5x. With ranks interleaved (0, 2 on one host, 1, 3 on the other)
  the flat ring crosses hosts on every hop and the bound is larger; the
  hierarchy, which follows the true hosts, moves the same S.

Steps (rank r is local rank l of its host and sits on host h; segment j of the
tensor is cut into M shards, shard l into H pieces):
  1. Inside the host, ring reduce-scatter each segment's M shards: afterwards
     local rank l holds shard l summed over its host (M-1 steps).
  2. Across hosts, the ranks with local rank l run a ring all_reduce on shard
     l: reduce-scatter of its H pieces, then all-gather (2(H-1) steps).
  3. Inside the host, ring all-gather the shards (M-1 steps).
  Each segment's chain starts as soon as the step before it on that segment is
  done, not when the whole tensor's is: every rank posts its sends without
  waiting and takes its events in the order of a virtual clock in which every
  message arrives strictly later than it left (a step inside a host counts 1,
  one across hosts K + M), which is also their likely order in time: all
  reduce-scatters inside the host first, then the transfers across hosts back
  to back, each segment's all-gather as soon as its shard is final. No rank
  waits for a message whose sender waits, in turn, for it.

Worked example, 2 hosts x 2 ranks (host 0: ranks 0, 1; host 1: ranks 2, 3), one
segment, SUM, rank r holds [a_r, b_r, c_r, d_r] (shard 0 = [a, b], shard 1 = [c, d]):

  1. inside hosts:  0 -> 1 sends [c0 d0], 1 -> 0 sends [a1 b1] (and 2 <-> 3 alike):
                    rank 0 holds [a0+a1, b0+b1], rank 1 [c0+c1, d0+d1],
                    rank 2 [a2+a3, b2+b3],       rank 3 [c2+c3, d2+d3]
  2. across hosts:  ranks 0 and 2 all_reduce shard 0: 0 -> 2 sends b, 2 -> 0 sends a;
                    0 -> 2 sends A, 2 -> 0 sends B. Ranks 1 and 3 shard 1 alike.
                    rank 0 and 2 hold [A, B], ranks 1 and 3 [C, D]
  3. inside hosts:  0 <-> 1 and 2 <-> 3 swap shards: [A, B, C, D] everywhere.
  Over the link between the hosts: 4 quarters each way (S), where a flat ring
  0-1-2-3 sends 6 (1.5 S).

Uneven hosts (M_h ranks on host h, M = max M_h; the first rank of each host
is its leader):
  1. Inside each host, local rank l >= 1 sends its whole tensor to the leader at
     step l-1; the leader combines them in the order l = 1, 2, ... (M-1 steps).
  2. The H leaders run a ring all_reduce (reduce-scatter, all-gather) over H
     pieces (2(H-1) steps, M-1+u and M-1+H-1+u).
  3. The leader sends the result to local rank l at step M-1+2(H-1)+l-1.
  Bitwise equal: each piece is combined on one leader, in one order, then copied.
  Bytes: a non-leader sends S and receives S; a leader receives (M_h-1) S and
  sends as much, plus the ring's 2(H-1)/H S across hosts. Extra memory: S on a
  leader (what it receives), nothing on the others. Hosts of 2 and 1, rank r
  holding x_r: rank 1 sends x1 to rank 0 (step 0); leaders 0 and 2 swap halves,
  reduce, swap back (steps 1, 2); rank 0 sends x0+x1+x2 to rank 1 (step 3).

Extra memory: with H > 1, K slots of one piece (about S/(KN) each: the pieces
received across hosts, one slot per segment, S/N in all), plus, with M > 1,
min(K, M-1) slots of one shard (about S/(KM) each: what the reduce-scatter
inside the host receives into; M-1 segments are in that phase at once). One
host, 16 MiB, N = 4: 8 segments, 3 slots of 512 KiB: 1.5 MiB (the ring: 4 MiB).

Reference: Jia et al., "Highly scalable deep learning training system with
mixed-precision: training ImageNet in four minutes", 2018 (hierarchical
all-reduce: in the node, across nodes, in the node); Sergeev and Del Balso,
"Horovod: fast and easy distributed deep learning in TensorFlow", 2018, and
Horovod's ``HOROVOD_HIERARCHICAL_ALLREDUCE``. The pipelining of the three
phases over segments is that of the segmented ring (Patarasuk and Yuan, JPDC 2009).
"""
from ._cost import NOTHING, Tally
from ._util import split_bounds

AUTO = "measured"   # algorithm=None: the cost model sees no hosts (collectives.tuning.choice)

SEGMENT_BYTES = 1 << 20
MAX_SEGMENTS = 8
MAX_STEP = (1 << 14) - 1


def layout(n, rank, ranks_per_host=None, hosts=None):
    """(members, host, local): each host's group ranks, this rank's host and local index.

    Hosts may hold different numbers of the group's ranks (see ``even``).
    """
    if hosts is None and ranks_per_host is not None:
        if isinstance(ranks_per_host, bool) or not isinstance(ranks_per_host, int) or ranks_per_host < 1:
            raise ValueError(f"hierarchical all_reduce: ranks_per_host must be a positive int, "
                             f"got {ranks_per_host!r}")
        hosts = [g // ranks_per_host for g in range(n)]
    if hosts is None:
        hosts = [0] * n
    hosts = list(hosts)
    if len(hosts) != n:
        raise ValueError(f"hierarchical all_reduce: hosts names {len(hosts)} ranks, the group has {n}")
    members = {}
    for g, h in enumerate(hosts):
        members.setdefault(h, []).append(g)
    members = list(members.values())       # hosts in order of their lowest group rank
    for h, ranks in enumerate(members):
        if rank in ranks:
            return members, h, ranks.index(rank)
    raise ValueError(f"hierarchical all_reduce: rank {rank} is not in the group of {n}")


def even(members):
    """Whether every host holds as many of the group's ranks (the pipelined scheme)."""
    return len({len(m) for m in members}) == 1


def check(n, rank, hosts):
    """What ``collectives.all_reduce`` asks before any message: ValueError if ``hosts`` (the
    door's: from ``LOCAL_WORLD_SIZE``) name another group or need more steps than a tag holds."""
    members, _, _ = layout(n, rank, hosts=hosts)
    if even(members):
        segments(1, len(members[0]), len(members))
    else:
        uneven_steps(members)


def uneven_steps(members):
    m, k = max(len(h) for h in members), len(members)
    steps = 2 * (m - 1) + 2 * (k - 1)
    if steps > MAX_STEP + 1:
        raise ValueError(f"hierarchical all_reduce: up to {m} ranks per host x {k} hosts need "
                         f"more steps than a tag holds")
    return m, k


def segments(nbytes, m, k, segment_bytes=None):
    """K: how many segments the tensor is cut into (bounded by the tags available)."""
    per = 2 * (m - 1) + 2 * (k - 1)
    if per > MAX_STEP + 1:
        raise ValueError(f"hierarchical all_reduce: {m} ranks per host x {k} hosts need more "
                         f"steps than a tag holds")
    want = max(1, min(MAX_SEGMENTS, -(-nbytes // (segment_bytes or SEGMENT_BYTES))))
    return max(1, min(want, (MAX_STEP + 1) // max(per, 1)))


def plan(numel, m, k, nseg):
    """Element bounds: shards[j][x] = (lo, hi) of shard x of segment j; pieces[j][x][y] of piece y of it."""
    seg = split_bounds(numel, nseg)
    shards, pieces = [], []
    for j in range(nseg):
        sb = split_bounds(seg[j + 1] - seg[j], m)
        shards.append([(seg[j] + sb[x], seg[j] + sb[x + 1]) for x in range(m)])
        row = []
        for lo, hi in shards[-1]:
            pb = split_bounds(hi - lo, k)
            row.append([(lo + pb[y], lo + pb[y + 1]) for y in range(k)])
        pieces.append(row)
    return shards, pieces


def _size(bounds):
    return bounds[1] - bounds[0]


def slots(m, k, nseg, shards, pieces, local, shard=None):
    """(intra slots, shard slot size, inter slots, piece slot size), in elements. ``shard``: the
    largest shard, if known (it is every rank's: cost() finds it once, not once per rank)."""
    intra = min(nseg, max(1, m - 1)) if m > 1 else 0
    if shard is None:
        shard = max(_size(b) for row in shards for b in row)
    inter = nseg if k > 1 else 0
    piece = max(_size(b) for j in range(nseg) for b in pieces[j][local])
    return intra, shard, inter, piece


def cost(n, s, item=1, ranks_per_host=None, hosts=None):
    """One host unless ``ranks_per_host`` (ranks host by host) or ``hosts`` say otherwise."""
    if n == 1:
        return NOTHING
    members, _, _ = layout(n, 0, ranks_per_host or (None if hosts else n), hosts)
    if not even(members):
        return uneven_cost(n, s, item, members)
    m, k = len(members[0]), len(members)
    numel = s // item
    nseg = segments(s, m, k)
    shards, pieces = plan(numel, m, k, nseg)
    per = 2 * (m - 1) + 2 * (k - 1)
    t = Tally(n)
    largest = max(_size(b) for row in shards for b in row)
    for li in range(m):               # the li-th rank of every host holds the same slots
        intra, shard, inter, piece = slots(m, k, nseg, shards, pieces, li, largest)
        for ranks in members:
            t.allocate(ranks[li], (intra * shard + inter * piece) * item)
    for j in range(nseg):
        base = j * per
        sizes = [_size(x) * item for x in shards[j]]
        for ranks in members:         # inside each host: reduce-scatter, then (last) all-gather
            t.ring(sizes, range(base, base + m - 1), shift=1, reduce=True, members=ranks)
            t.ring(sizes, range(base + m - 1 + 2 * (k - 1), base + 2 * (m - 1) + 2 * (k - 1)), members=ranks)
        for li in range(m):           # across hosts, the li-th rank of each: reduce-scatter, then all-gather
            across, mine = [h[li] for h in members], [_size(x) * item for x in pieces[j][li]]
            t.ring(mine, range(base + m - 1, base + m - 1 + k - 1), shift=1, reduce=True, members=across)
            t.ring(mine, range(base + m - 1 + k - 1, base + m - 1 + 2 * (k - 1)), members=across)
    return t.cost()


def uneven_cost(n, s, item, members):
    m, k = uneven_steps(members)
    numel = s // item
    bounds = split_bounds(numel, k)
    t = Tally(n)
    leaders = [h[0] for h in members]
    for hi, ranks in enumerate(members):
        lead = ranks[0]
        t.allocate(lead, numel * item)
        for li, r in enumerate(ranks[1:], 1):
            t.message(li - 1, r, lead, numel * item)
            t.reduce(lead, numel * item)
            t.message(m - 1 + 2 * (k - 1) + li - 1, lead, r, numel * item)
        right = leaders[(hi + 1) % k]
        for u in range(k - 1):
            nbytes = (bounds[(hi - u) % k + 1] - bounds[(hi - u) % k]) * item
            t.message(m - 1 + u, lead, right, nbytes)
            t.reduce(right, nbytes)
            p = (hi - u + 1) % k
            t.message(m - 1 + k - 1 + u, lead, right, (bounds[p + 1] - bounds[p]) * item)
    return t.cost()


def uneven(comm, tensor, op, members, hi, li):
    """The scheme of the card's "Uneven hosts": to the leader, a ring of leaders, back."""
    m, k = uneven_steps(members)
    ranks = members[hi]
    lead = ranks[0]
    last = m - 1 + 2 * (k - 1)
    if li > 0:
        comm.send(tensor, lead, li - 1)
        comm.recv(tensor, lead, last + li - 1)
        return
    inbox = tensor.new_empty(tensor.numel())
    for l, r in enumerate(ranks[1:], 1):
        comm.recv(inbox, r, l - 1)
        op.combine(tensor, inbox)
    if k > 1:
        leaders = [h[0] for h in members]
        right, left = leaders[(hi + 1) % k], leaders[(hi - 1) % k]
        b = split_bounds(tensor.numel(), k)
        piece = lambda p: tensor[b[p]:b[p + 1]]   # noqa: E731
        for u in range(k - 1):      # reduce-scatter: leader h ends with piece h+1 combined
            got = piece((hi - u - 1) % k)
            buf = inbox[:got.numel()]
            comm.sendrecv(piece((hi - u) % k), right, buf, left, m - 1 + u)
            op.combine(got, buf)
        for u in range(k - 1):      # all-gather: the combined pieces, copied around the ring
            comm.sendrecv(piece((hi - u + 1) % k), right, piece((hi - u) % k), left, m - 1 + k - 1 + u)
    for l, r in enumerate(ranks[1:], 1):
        comm.send(tensor, r, last + l - 1)


def time(n, s, alpha, beta, gamma, ranks_per_host=None):
    """Seconds in the alpha-beta-gamma model, which knows one link speed and no hosts:
    the three phases over the whole tensor, one after another (inside a host and across
    hosts the same links, so overlapping them buys nothing here), plus an alpha for each
    further segment's steps. Its gain comes from fast links inside a host and slow ones
    between, which this model cannot see: ``algorithm=None`` picks it only from a
    measured table (``AUTO``)."""
    if n == 1:
        return 0.0
    m = ranks_per_host or n
    k = n // m
    nseg = segments(s, m, k)

    def ring_rs(p, x):     # a ring reduce-scatter of x bytes over p ranks
        return (p - 1) * (alpha + x / p * beta + x / p * gamma)

    def ring_ag(p, x):
        return (p - 1) * (alpha + x / p * beta)
    phases = ring_rs(m, s) + ring_rs(k, s / m) + ring_ag(k, s / m) + ring_ag(m, s)
    return phases + (nseg - 1) * (2 * (m - 1) + 2 * (k - 1)) * alpha


def all_reduce(comm, tensor, op, ranks_per_host=None, hosts=None, segment_bytes=None):
    n, r = comm.size, comm.rank
    if ranks_per_host is None and hosts is None:
        hosts = getattr(comm, "hosts", None)
    members, hi, li = layout(n, r, ranks_per_host, hosts)   # refuses before any message
    if n == 1:
        return
    if not even(members):
        return uneven(comm, tensor, op, members, hi, li)
    m, k = len(members[0]), len(members)
    nseg = segments(tensor.numel() * tensor.element_size(), m, k, segment_bytes)
    shards, pieces = plan(tensor.numel(), m, k, nseg)
    view = lambda b: tensor[b[0]:b[1]]  # noqa: E731
    shard = [[view(b) for b in row] for row in shards]
    piece = [[view(b) for b in pieces[j][li]] for j in range(nseg)]     # of this rank's shard
    host = members[hi]
    right, left = host[(li + 1) % m], host[(li - 1) % m]
    xright, xleft = members[(hi + 1) % k][li], members[(hi - 1) % k][li]
    per = 2 * (m - 1) + 2 * (k - 1)
    rs = lambda j, st: j * per + st                           # noqa: E731  tags of each segment's steps
    xrs = lambda j, u: j * per + m - 1 + u                    # noqa: E731
    xag = lambda j, u: j * per + m - 1 + k - 1 + u            # noqa: E731
    ag = lambda j, st: j * per + m - 1 + 2 * (k - 1) + st     # noqa: E731

    intra, shard_slot, inter, piece_slot = slots(m, k, nseg, shards, pieces, li)
    inbox = tensor.new_empty(intra * shard_slot + inter * piece_slot)
    intra_box = [inbox[i * shard_slot:(i + 1) * shard_slot] for i in range(intra)]
    base = intra * shard_slot
    inter_box = [inbox[base + i * piece_slot:base + (i + 1) * piece_slot] for i in range(inter)]

    sends, waiting = [], {}

    def send(t, x, peer):
        sends.append(comm.post(t, sends=[(x, peer)]))

    def recv_rs(j, st):        # inside the host, into segment j's slot
        buf = intra_box[j % intra][:shard[j][(li - st - 2) % m].numel()]
        waiting["R", j, st] = comm.post(rs(j, st), recvs=[(buf, left)]), buf

    def recv_xrs(j, u):        # across hosts, into segment j's slot
        buf = inter_box[j][:piece[j][(hi - u - 2) % k].numel()]
        waiting["X", j, u] = comm.post(xrs(j, u), recvs=[(buf, xleft)]), buf

    def shard_done(j):         # shard l of segment j is final: gather it inside the host
        if m > 1:
            send(ag(j, 0), shard[j][li], right)

    def host_done(j):          # shard l of segment j is summed over the host: go across
        if k > 1:
            send(xrs(j, 0), piece[j][(hi - 1) % k], xright)
        else:
            shard_done(j)

    # Post first what needs nothing: the first sends and receives of every chain, and
    # the all-gathers' receives, straight into the tensor (each arrives only after
    # this rank's last read of that part: it is the final value).
    for j in range(nseg):
        if m > 1:
            send(rs(j, 0), shard[j][(li - 1) % m], right)
            if j < intra:
                recv_rs(j, 0)
            for st in range(m - 1):
                waiting["G", j, st] = comm.post(ag(j, st), recvs=[(shard[j][(li - st - 1) % m], left)]), None
        else:
            host_done(j)
        if k > 1:
            recv_xrs(j, 0)
            for u in range(k - 1):
                waiting["Y", j, u] = comm.post(xag(j, u), recvs=[(piece[j][(hi - u - 1) % k], xleft)]), None

    # The virtual clock (see the card): a step inside a host counts 1, one across hosts w.
    w = nseg + m
    events = []
    for j in range(nseg):
        t0 = j + m - 1                  # segment j is reduced over its host
        a0 = t0 + 2 * (k - 1) * w       # ... and over all hosts
        events += [(j + st + 1, "R", j, st) for st in range(m - 1)]
        events += [(t0 + (u + 1) * w, "X", j, u) for u in range(k - 1)]
        events += [(t0 + (k - 1 + u + 1) * w, "Y", j, u) for u in range(k - 1)]
        events += [(a0 + st + 1, "G", j, st) for st in range(m - 1)]
    events.sort(key=lambda e: e[0])
    for _, kind, j, st in events:
        pending, buf = waiting.pop((kind, j, st))
        pending.wait()
        if kind == "R":
            x = shard[j][(li - st - 2) % m]
            op.combine(x, buf)
            if st + 1 < m - 1:
                recv_rs(j, st + 1)
                send(rs(j, st + 1), x, right)
            else:
                if j + intra < nseg:
                    recv_rs(j + intra, 0)   # the slot is free for a later segment
                host_done(j)
        elif kind == "X":
            x = piece[j][(hi - st - 2) % k]
            op.combine(x, buf)
            if st + 1 < k - 1:
                recv_xrs(j, st + 1)
            # the piece just completed goes on: to the next reduce-scatter step, or, once
            # it is this rank's own (final) piece, as the all-gather's first message
            send(xrs(j, st + 1) if st + 1 < k - 1 else xag(j, 0), x, xright)
        elif kind == "Y":
            if st + 1 < k - 1:
                send(xag(j, st + 1), piece[j][(hi - st - 1) % k], xright)
            else:
                shard_done(j)
        elif st + 1 < m - 1:
            send(ag(j, st + 1), shard[j][(li - st - 1) % m], right)
    for pending in sends:
        pending.wait()
