"""Recording a run for the page: every message, and whose contributions every chunk holds.

The algorithm runs unchanged on the simulator's door (``collectives.sim``), on real tensors
whose values *are* their provenance, so nothing is drawn that the run did not do:

* ``nibbles`` (N <= 15): rank r's input elements hold ``16**r``; a reduction adds, so an
  element's hexadecimal digit r counts how many times rank r's contribution is in it
  (a digit of 2 is "rank r counted twice", whatever the learner's code does to add);
* ``bits`` (16 <= N <= 64): rank r's elements hold bit r; the reduction is OR (an
  overlap, a contribution counted twice, is caught in ``combine`` itself, where it happens).

Above 64 ranks the run is on ``meta`` tensors (sizes and times only) and the page is a
summary: counters, links, the time axis, no chunks. Above :data:`MAX_RANKS` ranks or
:data:`MAX_MESSAGES` messages there is no page, but a clear error.

Every message is recorded as the simulator completes it (source, destination, step, bytes,
posted and finished in simulated time, the links it crossed) together with the provenance of
what it carried and the cells of the buffers it left and reached.
"""
import torch

from .. import observers
from ..algorithms import REGISTRY
from ..sim import topology as topologies
from ..sim.collective import REDUCING, ROOTED, local, resolve_algorithm
from ..sim.deadlock import Deadlock
from ..sim.world import SimDoor, SimulationError, World

MAX_RANKS = 256        # above it: an error (a page of that many boxes is a picture of nothing)
DETAIL_RANKS = 64      # above it: a summary page (no chunks: 64 bits of provenance per element)
STRIDE = 1 << 20       # a program's step (call c, step s) is c * STRIDE + s
MAX_MESSAGES = 40000   # above it: an error before the page is built (the page stays under 2 MB)


class TooLarge(ValueError):
    """The run cannot be drawn (too many ranks or messages): the message says what to do."""


TWICE = torch.tensor(int("e" * 15, 16), dtype=torch.int64)   # bits 1-3 of every hex digit (digit 15 is rank 15's: none)


def mode_for(n):
    return "nibbles" if n <= 15 else "bits" if n <= DETAIL_RANKS else None


def contribution(r, mode):
    """The value that stands for rank r's contribution."""
    if mode == "nibbles":
        return 1 << (4 * r)
    return (1 << r) if r < 63 else -(1 << 63)     # bit 63 is int64's sign bit


def decode(value, mode, n):
    """{rank: count} of an element's value."""
    v = int(value) & ((1 << 64) - 1)
    if mode == "nibbles":
        return {r: (v >> (4 * r)) & 15 for r in range(n) if (v >> (4 * r)) & 15}
    return {r: 1 for r in range(n) if (v >> r) & 1}


def key(value):
    return format(int(value) & ((1 << 64) - 1), "x")


class Provenance:
    """The reduction the algorithm is handed: adds (nibbles) or ORs (bits), and notes where a
    contribution arrives twice (bits: the sum could not show it)."""

    def __init__(self, mode, world, rank, notes):
        self.mode, self.world, self.rank, self.notes = mode, world, rank, notes
        self.op, self.name, self.average = None, "SUM", False
        self.fn = torch.add if mode == "nibbles" else torch.bitwise_or

    def combine(self, acc, x):
        if self.mode == "bits":
            both = acc & x
            if bool(both.any()):
                snaps = self.world.snapshots[self.rank]
                self.notes.append((self.world.now, self.rank, acc, both.clone(), snaps[-1][1] if snaps else 0, both.clone()))
            acc.bitwise_or_(x)
        else:
            acc.add_(x)
            high = acc & TWICE      # a hex digit of 2 or more: a contribution arrived again
            if bool(high.any()):
                snaps = self.world.snapshots[self.rank]
                self.notes.append((self.world.now, self.rank, acc, high, snaps[-1][1] if snaps else 0, acc.clone()))
        return acc


def inputs(collective, r, n, root, mode, device):
    """(arguments after the door, outputs to draw, expected provenance of each output cell)."""
    e = n if collective in ("all_reduce", "reduce", "broadcast") else 1
    if collective == "barrier":
        return [], [], []
    if device == "meta":
        v = lambda: torch.empty(e, dtype=torch.int64, device="meta")  # noqa: E731
        zero = v
    else:
        v = lambda: torch.full((e,), contribution(r, mode), dtype=torch.int64)  # noqa: E731
        zero = lambda: torch.zeros(e, dtype=torch.int64)  # noqa: E731
    everyone = set(range(n))
    if collective == "all_reduce":
        t = v()
        return [t], [t], [everyone] * e
    if collective == "broadcast":
        t = v() if r == root else zero()
        return [t, root], [t], [{root}] * e
    if collective == "reduce":
        t = v()
        return [t, root], [t], [everyone if r == root else None] * e
    if collective == "scatter":
        out = zero()
        return [out, [v() for _ in range(n)] if r == root else None, root], [out], [{root}]
    if collective == "gather":
        outs = [zero() for _ in range(n)] if r == root else None
        return [v(), outs, root], outs or [], [{q} for q in range(n)] if r == root else []
    if collective == "all_gather":
        outs = [zero() for _ in range(n)]
        return [outs, v()], outs, [{q} for q in range(n)]
    if collective == "reduce_scatter":
        out = zero()
        return [out, [v() for _ in range(n)]], [out], [everyone]
    if collective == "all_to_all":
        outs = [zero() for _ in range(n)]
        return [outs, [v() for _ in range(n)]], outs, [{q} for q in range(n)]
    raise ValueError(f"unknown collective {collective!r}; known: {', '.join(REGISTRY)}")


def link_name(fabric, link):
    """A reader's name for one of ``fabric.route``'s link ids."""
    n, s = fabric.n, fabric.spec
    if link < 2 * n:
        return f"rank {link // 2} {'out' if link % 2 == 0 else 'in'}"
    if s["kind"] == "flat":
        return "host memory"
    x, out = (link - 2 * n) // 2, (link - 2 * n) % 2 == 0
    if s["kind"] == "nodes":
        who = f"rank {x}" if s["nic"] == "rank" else f"node {x}"
        return f"NIC of {who} {'out' if out else 'in'}"
    return f"leaf {x} {'up' if out else 'down'}"


def _where(tensor, bufs):
    """(output index, first cell) where ``tensor`` lies inside one of ``bufs``, or None."""
    if tensor is None or tensor.is_meta:
        return None
    p = tensor.data_ptr()
    for i, b in enumerate(bufs):
        start = b.data_ptr()
        if start <= p < start + b.nbytes and tensor.untyped_storage().data_ptr() == b.untyped_storage().data_ptr():
            return i, (p - start) // b.element_size()
    return None


class VizWorld(World):
    """The simulator's world, watched: each post snapshots the posting rank's buffers, each
    completed message is kept with what it carried."""

    def __init__(self, fabric, real_data, mode, limit):
        super().__init__(fabric, real_data)
        self.mode, self.limit = mode, limit
        self.outputs = [None] * self.n        # per rank: its output tensors
        self.snapshots = [[] for _ in range(self.n)]   # per rank: (time, step, [values])
        self.carried = {}                     # id(end) -> what a send carried / where a recv lands
        self.done = []
        self.call = [0] * self.n              # per rank: which of its calls runs (a program's steps are (call, step))

    def state(self, rank):
        outs = self.outputs[rank]
        if not outs or outs[0].is_meta:
            return []
        return [int(x) for t in outs for x in t.tolist()]

    def cell_of(self, rank, tensor):
        outs = self.outputs[rank] or []
        where = _where(tensor, outs)
        if where is None:
            return None
        i, j = where
        return sum(t.numel() for t in outs[:i]) + j

    def post(self, rank, step, sends, recvs, collective, algorithm):
        self.snapshots[rank].append((self.now, self.call[rank] * STRIDE + step, self.state(rank)))
        ends = super().post(rank, step, sends, recvs, collective, algorithm)
        for end in ends:
            t = end.tensor
            cell = self.cell_of(rank, t)
            values = None if t.is_meta else [int(x) for x in t.reshape(-1).tolist()]
            self.carried[id(end)] = (cell, t.numel(), values, self.call[rank] * STRIDE + step)
        return ends

    def _complete(self, send, recv):
        if len(self.done) >= self.limit:
            raise TooLarge(f"more than {self.limit} messages: too many to draw; choose a smaller world")
        sc, sn, values, step = self.carried.pop(id(send))
        rc, _, _, _ = self.carried.pop(id(recv))
        links, _ = self.fabric.route(send.rank, recv.rank)
        self.done.append(dict(src=send.rank, dst=recv.rank, step=step, nbytes=send.nbytes,
                              start=max(send.posted, recv.posted), end=self.now, links=list(links),
                              values=values, src_cell=sc, dst_cell=rc, cells=sn))
        super()._complete(send, recv)


def record(collective, algorithm, world_size, topology="ethernet-100g", root=0):
    """Run ``algorithm`` (a registered name or a function with the algorithm modules'
    signature) of ``collective`` on ``world_size`` simulated ranks and return the run as a
    dict of plain values (what :func:`collectives.viz.page` draws).

    Raises:
        ValueError: unknown collective or algorithm, ``world_size`` < 1, root out of range.
        TooLarge: more than ``MAX_RANKS`` ranks or ``MAX_MESSAGES`` messages.
    """
    name, fn = resolve_algorithm(collective, algorithm)
    n = world_size
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"world_size must be a whole number >= 1, got {n!r}")
    if n > MAX_RANKS:
        raise TooLarge(f"world_size {n} is more than {MAX_RANKS} ranks: too many boxes to draw; "
                       f"python -m collectives.sim gives the figures at any size")
    if collective in ROOTED and not 0 <= root < n:
        raise ValueError(f"root={root} is out of range for {n} ranks")
    spec = topologies.load(topology)
    fabric = topologies.build(spec, n)
    mode = mode_for(n)
    device = "cpu" if mode else "meta"
    world = VizWorld(fabric, device != "meta", mode, MAX_MESSAGES)
    notes, want = [], [None] * n
    failure = None

    def body(r):
        args, outs, expect = inputs(collective, r, n, root, mode, device)
        world.outputs[r], want[r] = outs, expect
        if n == 1:
            local(collective, args)      # as api.py does a group of one: at most a copy
            return
        if collective in REDUCING:
            args.append(Provenance(mode, world, r, notes))
        fn(SimDoor(world, r, collective, name), *args)

    with observers.trace():          # the world reports its messages only to a listener
        try:
            world.run(body)
        except Deadlock as exc:
            failure = {"kind": "deadlock", "type": exc.kind, "report": str(exc),
                       "cycle": [dict(rank=int(r), kind=end.kind, peer=int(end.peer), step=int(end.step),
                                      nbytes=int(end.nbytes)) for r, end in exc.cycle]}
        except SimulationError as exc:
            if isinstance(exc.__cause__, TooLarge):
                raise exc.__cause__ from None
            failure = {"kind": "error", "report": str(exc)}
    final = [world.state(r) for r in range(n)]
    return dict(kind="collective", collective=collective, algorithm=name, n=n, root=root,
                mode=mode, topology=spec, fabric=fabric, messages=world.done, snapshots=world.snapshots,
                final=final, want=want, notes=[(t, r, world.cell_of(r, acc), [i for i, b in enumerate(both.tolist()) if b], s, v.tolist())
                                               for t, r, acc, both, s, v in notes],
                failure=failure, time=max([r.end_time for r in world.ranks] + [m["end"] for m in world.done] + [0.0]))


def record_program(title, world_size, calls, topology="ethernet-100g", names=None):
    """Record several calls one after the other on the same simulated ranks (a parallelism's
    communication: FSDP's gathers and reduce-scatters, MoE's all_to_all, ...).

    Args:
        calls: ``calls(r, mode)`` returns rank r's list of ``(collective, algorithm, args, outs,
            want)``: the algorithm (a registered name or a function) called as
            ``fn(comm, *args)``, its outputs to draw, the provenance each output cell must have.
        names: a label per call, for the step slider.
    """
    n = world_size
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"world_size must be a whole number >= 1, got {n!r}")
    if n > DETAIL_RANKS:
        raise TooLarge(f"world_size {n}: a parallelism's page draws its chunks, so at most {DETAIL_RANKS} ranks")
    spec = topologies.load(topology)
    fabric = topologies.build(spec, n)
    mode = mode_for(n)
    world = VizWorld(fabric, True, mode, MAX_MESSAGES)
    notes, want = [], [None] * n
    failure = None

    def body(r):
        plan = calls(r, mode)
        world.outputs[r] = [t for _, _, _, outs, _ in plan for t in outs]
        want[r] = [w for _, _, _, _, ws in plan for w in ws]
        for i, (collective, algorithm, args, _, _) in enumerate(plan):
            world.call[r] = i
            name, fn = resolve_algorithm(collective, algorithm)
            if collective in REDUCING:
                args = list(args) + [Provenance(mode, world, r, notes)]
            if n > 1 or callable(algorithm):     # a function of one's own runs even alone
                fn(SimDoor(world, r, collective, name), *args)
            else:
                local(collective, args)

    with observers.trace():
        try:
            world.run(body)
        except Deadlock as exc:
            failure = {"kind": "deadlock", "type": exc.kind, "report": str(exc),
                       "cycle": [dict(rank=int(r), kind=end.kind, peer=int(end.peer), step=int(end.step),
                                      nbytes=int(end.nbytes)) for r, end in exc.cycle]}
    final = [world.state(r) for r in range(n)]
    return dict(kind="collective", collective=title, algorithm="", n=n, root=0, mode=mode, topology=spec,
                fabric=fabric, messages=world.done, snapshots=world.snapshots, final=final, want=want,
                notes=[(t, r, world.cell_of(r, acc), [i for i, b in enumerate(both.tolist()) if b], s, v.tolist())
                       for t, r, acc, both, s, v in notes],
                failure=failure, names=names,
                time=max([r.end_time for r in world.ranks] + [m["end"] for m in world.done] + [0.0]))
