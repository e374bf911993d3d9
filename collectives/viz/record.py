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
import contextlib

import torch

from .. import observers
from ..engine import engine
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
        if self.mode is None:      # a summary's run (meta tensors): sizes only, no provenance to check
            return acc.add_(x)
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
    lazy_clock = False    # its snapshots and notes read ``now`` from the ranks' code: it must be theirs

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
        return super().post(rank, step, sends, recvs, collective, algorithm)

    def _posted(self, rank, step, ends):
        # before the rank's posting time (o per message), in which a message may complete
        for end in ends:
            t = end.tensor
            cell = self.cell_of(rank, t)
            values = None if t.is_meta else [int(x) for x in t.reshape(-1).tolist()]
            self.carried[id(end)] = (cell, t.numel(), values, self.call[rank] * STRIDE + step)

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


def _checked_world(n, collective, root, most, why):
    """``n`` if it is a world this page can draw (else the error that says why not)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"world_size must be a whole number >= 1, got {n!r}")
    if n > most:
        raise TooLarge(f"world_size {n} is more than {most} ranks: {why}")
    if collective in ROOTED and not 0 <= root < n:
        raise ValueError(f"root={root} is out of range for {n} ranks")
    return n


def record(collective, algorithm, world_size, topology="ethernet-100g", root=0):
    """Run ``algorithm`` (a registered name or a function with the algorithm modules'
    signature) of ``collective`` on ``world_size`` simulated ranks and return the run as a
    dict of plain values (what :func:`collectives.viz.page` draws).

    Raises:
        ValueError: unknown collective or algorithm, ``world_size`` < 1, root out of range.
        TooLarge: more than ``MAX_RANKS`` ranks or ``MAX_MESSAGES`` messages.
    """
    name, fn = resolve_algorithm(collective, algorithm)
    n = _checked_world(world_size, collective, root, MAX_RANKS,
                       "too many boxes to draw; python -m collectives.sim gives the figures at any size")
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


# ---- the same recording from a real run: processes, gloo, the real door --------------------

REAL_RANKS = 15          # nibbles only: a real run's page always draws its chunks
REAL_TIMEOUT = 120.0     # seconds before the world is killed (a learner's loop may never end)
REAL_HANG = 10.0         # seconds a rank waits at the door for one message before the run is called hung


class _Clock:
    """What :class:`Provenance` reads of a world, for one real rank: the time since the call
    began (seconds, wall clock) and the rank's snapshots so far."""

    def __init__(self, rank, n):
        self.rank, self.t0 = rank, None
        self.snapshots = [[] for _ in range(n)]

    @property
    def now(self):
        import time
        return time.time() - self.t0


def _cell(tensor, outs):
    """The first cell of the outputs ``tensor`` lies in (cells numbered across ``outs``), or None."""
    where = _where(tensor, outs)
    return None if where is None else sum(o.numel() for o in outs[:where[0]]) + where[1]


def _source(fn):
    """(file, name): where the processes find the function ``fn``.

    A function is not pickled into the processes but loaded there from its file, as the
    grader loads a solution: a lambda, a nested function or one typed into a notebook has no
    file to load it from, and is refused here, before any process starts."""
    import os
    name = getattr(fn, "__name__", None)
    path = getattr(getattr(fn, "__code__", None), "co_filename", None)
    if (name is None or getattr(fn, "__qualname__", name) != name or not path or not path.endswith(".py")
            or not os.path.isfile(path)):
        raise ValueError(f"a function runs in real processes loaded from its file: {getattr(fn, '__qualname__', fn)!r} "
                         f"must be defined at the top level of a .py file (not a lambda, a nested function or a "
                         f"notebook cell); record() draws any function on the simulator")
    return os.path.realpath(path), name


def _load(source):
    """The function of :func:`_source`'s ``(file, name)``, loaded in this process."""
    import importlib.util
    path, name = source
    spec = importlib.util.spec_from_file_location(f"_viz_real_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def _recording_comm(*args, clock, outs, seen, **kwargs):
    """A real door (:class:`collectives.p2p_communications.Comm`) that notes, before each post,
    the rank's buffers and what each message carries; the door itself still moves every byte.
    A wait that fails (the door's timeout, or a peer that gave up) leaves the message it was
    waiting for in ``comm.stuck``: ``(kind, peer, step, nbytes)``, this rank's edge of the
    wait-for graph. Built in the worker, so the door's module is imported only where a real
    run happens."""
    from ..errors import CollectiveError
    from ..p2p_communications import Comm

    class RecordingComm(Comm):
        def post(self, step, sends=(), recvs=(), tagged=True):
            state = [int(x) for t in outs for x in t.tolist()]
            clock.snapshots[self.rank].append((clock.now, step, state))
            for t, peer in sends:
                if t.numel():    # the door skips empty tensors: both sides know the sizes
                    cell = _cell(t, outs)
                    self.sent.append((step, peer, cell, t.numel(), [int(x) for x in t.reshape(-1).tolist()]))
            for t, peer in recvs:
                if t.numel():
                    cell = _cell(t, outs)
                    self.received.append((step, peer, cell))
            pending = super().post(step, sends, recvs, tagged)
            entries = [(kind, peer, nbytes) for _, kind, peer, nbytes in pending.entries]
            wait = pending.wait
            posted = [[(kind, peer, step, nbytes) for kind, peer, nbytes in entries], False]
            self.posted.append(posted)

            def watched_wait():
                posted[1] = True
                before = len(seen)
                try:
                    wait()
                except CollectiveError:
                    # the door reports each message of a post as its wait ends, in post order:
                    # the first one not reported is the one this rank could not finish
                    kind, peer, nbytes = entries[min(len(seen) - before, len(entries) - 1)]
                    self.stuck = (kind, peer, step, nbytes)
                    raise
            pending.wait = watched_wait
            return pending

        def unwaited(self):
            """The messages of every post whose wait was never called: ``(kind, peer, step, nbytes)``."""
            return [edge for edges, waited in self.posted if not waited for edge in edges]

    comm = RecordingComm(*args, **kwargs)
    comm.sent, comm.received, comm.stuck, comm.posted = [], [], None, []
    return comm


class _TorchCalls:
    """``torch.distributed``'s point-to-point calls, for one real rank of a drawing of a
    function written against torch's API (the course's process-world exercises): while
    :meth:`patched` is active, torch.distributed's ``send``, ``recv``, ``isend``, ``irecv``,
    ``batch_isend_irecv`` and ``P2POp`` are this library's own
    (:mod:`collectives.p2p_api`, torch's names and signatures), so every message goes
    through the door, where :mod:`collectives.observers` sees it. Each post is noted as
    :func:`_recording_comm` notes one: the rank's buffers, the cell a message leaves or
    reaches, what a send carries.

    A message's step is its place among the messages of its direction (and tag): the k-th
    message rank r sends rank q is the k-th q receives from r, so both ends number it alike
    (torch's messages between two ranks arrive in the order they were sent).
    """

    NAMES = ("send", "recv", "isend", "irecv", "batch_isend_irecv", "P2POp")

    def __init__(self, rank, outs, clock):
        self.rank, self.outs, self.clock = rank, outs, clock
        self.sent, self.received, self.stuck = [], [], None
        self.count = {}          # (kind, peer, tag) -> messages posted that way so far
        self.posted = []         # [edge, waited]: every isend/irecv handle, to name the ones never waited on

    def note(self, kind, tensor, peer, tag):
        """Note a post; return its edge ``(kind, peer, step, nbytes)``."""
        k = self.count.get((kind, peer, tag), 0)
        step = tag * STRIDE + k
        self.clock.snapshots[self.rank].append((self.clock.now, step, [int(x) for t in self.outs for x in t.tolist()]))
        if tensor.numel():       # the door sends no empty message: it takes no place in its direction
            self.count[(kind, peer, tag)] = k + 1
            cell = _cell(tensor, self.outs)
            if kind == "send":
                self.sent.append((step, peer, cell, tensor.numel(), [int(x) for x in tensor.reshape(-1).tolist()]))
            else:
                self.received.append((step, peer, cell))
        return (kind, peer, step, tensor.nbytes)

    def blocking(self, edge, fn, *args):
        from ..errors import CollectiveError
        try:
            return fn(*args)
        except CollectiveError:
            self.stuck = self.stuck or edge      # the first wait that failed is this rank's edge
            raise

    def handle(self, edge, work):
        """``work`` whose ``wait`` notes ``edge`` as this rank's if it fails, and notes that it was waited on."""
        calls, entry = self, [edge, False]
        self.posted.append(entry)

        class Watched:
            def wait(self, timeout=None):
                entry[1] = True
                return calls.blocking(edge, work.wait)

            def __getattr__(self, attr):
                return getattr(work, attr)
        return Watched()

    def steps(self, messages):
        """The door's messages (``observers.Message``) with each one's step as :meth:`note` numbered it."""
        seen = {}
        for m in messages:
            peer = m.dst if m.kind == "send" else m.src
            k = seen.get((m.kind, peer, m.step), 0)
            seen[(m.kind, peer, m.step)] = k + 1
            m.step = m.step * STRIDE + k
        return messages

    def unwaited(self):
        """The isends and irecvs whose handle was never waited on: ``(kind, peer, step, nbytes)``."""
        return [edge for edge, waited in self.posted if not waited]

    @contextlib.contextmanager
    def patched(self):
        import torch.distributed as dist

        from .. import p2p_api

        def send(tensor, dst=None, group=None, tag=0):
            self.blocking(self.note("send", tensor, dst, tag), p2p_api.send, tensor, dst, group, tag)

        def recv(tensor, src=None, group=None, tag=0):
            self.blocking(self.note("recv", tensor, src, tag), p2p_api.recv, tensor, src, group, tag)
            return src

        def isend(tensor, dst=None, group=None, tag=0):
            edge = self.note("send", tensor, dst, tag)
            return self.handle(edge, p2p_api.isend(tensor, dst, group, tag))

        def irecv(tensor, src=None, group=None, tag=0):
            edge = self.note("recv", tensor, src, tag)
            return self.handle(edge, p2p_api.irecv(tensor, src, group, tag))

        def batch_isend_irecv(p2p_op_list):
            ops = {isend: p2p_api.isend, irecv: p2p_api.irecv}
            mine = [p2p_api.P2POp(ops.get(p.op, p.op), p.tensor, p.peer, p.group, p.tag) for p in p2p_op_list]
            edges = [self.note("send" if p.op is p2p_api.isend else "recv", p.tensor, p.peer, p.tag) for p in mine]
            return [self.handle(e, w) for e, w in zip(edges, p2p_api.batch_isend_irecv(mine))]

        def P2POp(op, tensor, peer=None, group=None, tag=0):     # noqa: N802 (torch's name)
            return p2p_api.P2POp(op, tensor, peer, group, tag)

        mine = dict(send=send, recv=recv, isend=isend, irecv=irecv, batch_isend_irecv=batch_isend_irecv, P2POp=P2POp)
        before = {name: getattr(dist, name) for name in self.NAMES}
        for name in self.NAMES:
            setattr(dist, name, mine[name])
        try:
            yield self
        finally:
            for name, fn in before.items():
                setattr(dist, name, fn)


def _real_rank(rank, n, collective, name, root, mode, source, calls="door"):
    """One rank of :func:`record_real`: run the algorithm (registered, or loaded from
    ``source``) once on the real door, watched, and return what it saw to the launcher.

    ``calls="torch"``: the function is written against torch's API (``fn(*args)``, as
    ``dist.all_reduce(tensor)`` is called) and its ``torch.distributed`` point-to-point calls
    go through the door (:class:`_TorchCalls`); it runs even alone (a world of one must do nothing).

    A wait that fails at the door (its timeout: the world hangs) ends the rank's run, not the
    rank: what it finished, its buffers as they froze and the message it waited for are
    returned, so the page can draw the hang. Any other error fails the world as usual."""
    import time

    import torch.distributed as dist

    from ..errors import CollectiveError
    args, outs, expect = inputs(collective, rank, n, root, mode, "cpu")
    clock, notes, seen = _Clock(rank, n), [], observers.Trace()
    stuck = None
    with contextlib.ExitStack() as stack:
        if calls == "torch":
            door = _TorchCalls(rank, outs, clock)
            stack.enter_context(door.patched())   # before the file is loaded: a name it imports from dist is ours too
            fn = _load(source)
            run = lambda: fn(*args)   # noqa: E731
        else:
            fn = REGISTRY[collective][name] if source is None else _load(source)
            door = _recording_comm(None, collective, name, clock=clock, outs=outs, seen=seen)
            if collective in REDUCING:
                args.append(Provenance(mode, clock, rank, notes))
            run = (lambda: local(collective, args)) if n == 1 else (lambda: fn(door, *args))
        dist.barrier()       # the ranks start together, so one clock (time.time, one host) serves all
        clock.t0 = time.time()
        with observers.observing(seen), observers.count_traffic() as counted:
            try:
                run()
                # a send the program posted and never waited for still goes out (torch's isend
                # hands it to gloo at once; ours is queued on its lane): finish this rank's queued
                # work before the rank's run ends, as the engine's exit hook would at a normal
                # exit, which a forked rank skips. Without it a rank could end before its dropped
                # isend was posted, and its peer wait for it (each wait bounded by ``hang``)
                engine().drain()
            except CollectiveError as exc:
                if door.stuck is None:      # not a wait that never ended: the world failed
                    raise
                kind, peer, step, nbytes = door.stuck
                stuck = dict(kind=kind, peer=peer, step=step, nbytes=nbytes, error=str(exc).splitlines()[0])
    ended = time.time()
    messages = door.steps(seen.messages) if calls == "torch" else seen.messages
    return dict(t0=clock.t0, end=ended, traffic=[counted.sent_bytes, counted.recv_bytes, counted.sent_messages,
                                                 counted.recv_messages], sent=door.sent, received=door.received,
                messages=[(m.kind, m.src, m.dst, m.step, m.nbytes, m.start, m.end) for m in messages],
                snapshots=clock.snapshots[rank], final=[int(x) for t in outs for x in t.tolist()], want=expect,
                notes=[(t, r, _cell(acc, outs), [i for i, b in enumerate(both.tolist()) if b], s, v.tolist())
                       for t, r, acc, both, s, v in notes], stuck=stuck,
                unwaited=door.unwaited() if stuck is None else [])


def _hang(ranks, collective, name, hang, calls="door"):
    """The failure a real run's hang is drawn as (the simulator's deadlock, in its shape), from
    the message each stuck rank waited for; None if no rank was stuck.

    Each stuck rank waits for one peer (the other end of the message its wait was on): the
    simulator's own analysis (:func:`collectives.sim.deadlock.analyse`) walks those edges to the
    cycle, or to a rank that finished without posting the other end."""
    from types import SimpleNamespace as Plain

    from ..sim.deadlock import analyse
    ends = {r: Plain(rank=r, collective=collective, algorithm=name, done=False, **{k: got["stuck"][k] for k in
                                                                                   ("kind", "peer", "step", "nbytes")})
            for r, got in enumerate(ranks) if got["stuck"]}
    if not ends:
        return None
    unmatched = {}
    for r, e in ends.items():
        unmatched.setdefault((r, e.peer) if e.kind == "send" else (e.peer, r), []).append(e)
    world = Plain(unmatched=unmatched, ranks=[Plain(finished=got["stuck"] is None) for got in ranks])
    kind, cycle, report = analyse(world, [Plain(id=r, waiting=[e]) for r, e in ends.items()])
    if calls == "torch":     # the advice in the learner's own terms
        report = report.replace("(comm.sendrecv, comm.exchange)", "(torch.distributed's isend + irecv, or batch_isend_irecv)")
    how = "torch.distributed's calls through our door" if calls == "torch" else "gloo processes"
    return {"kind": "deadlock", "type": kind,
            "report": f"{report}\n  (a real run: each rank above waited {hang:g} s at the door, {how})",
            "cycle": [dict(rank=int(r), kind=end.kind, peer=int(end.peer), step=int(end.step), nbytes=int(end.nbytes))
                      for r, end in cycle]}


def record_real(collective, algorithm, world_size, root=0, timeout=REAL_TIMEOUT, hang=REAL_HANG, calls="door"):
    """Run ``algorithm`` of ``collective`` in a real world of ``world_size`` processes (gloo, one
    host, one thread each) with :func:`record`'s provenance inputs, and return the run in
    :func:`record`'s shape, so :func:`collectives.viz.model.build` draws it the same way.

    ``algorithm`` is a registered name or a function with the algorithm modules' signature
    (the learner's own): a function is loaded in each process from the file that defines it
    (it must be at the top level of a .py file). ``calls="torch"``: the function is written
    against torch's API instead, as the course's process-world exercises are
    (``all_reduce(tensor, group=None)``, ``broadcast(tensor, src, group=None)``, ...: the
    arguments of ``torch.distributed``'s collective, without ``op``; the reduction is a sum):
    its ``torch.distributed`` ``send``/``recv``/``isend``/``irecv``/``batch_isend_irecv`` go through this
    library's door (:mod:`collectives.p2p_api`, torch's names), so the same page is drawn, a
    message's step being its place among its direction's messages.

    Each rank watches its own door (a :class:`collectives.observers.Trace` for the door's own
    messages and times, and what each post carried, read before the post) and returns it to
    the launcher. A message's ``start`` is the later of its two posts and its ``end`` the later
    of the two sides' completions, in seconds of wall clock after the ranks left a barrier
    together: the page's time axis is measured, not simulated (``clock="measured"``).
    ``traffic`` holds each rank's own ``count_traffic`` figures, counted in its process
    (sent bytes, received bytes, sent messages, received messages).

    A world whose ranks wait at the door for ``hang`` seconds (``COLLECTIVES_TIMEOUT`` in the
    processes) is drawn as the simulator draws a deadlock: ``failure`` holds the ranks' wait-for
    cycle (or the finished rank they wait for), built from the message each rank waited for,
    and the page freezes at the messages each rank finished.

    ``unwaited`` lists, per rank, the messages it posted and never waited on (an ``isend``
    dropped, a post whose wait was never called): ``(kind, peer, step, bytes)``; the page
    names them (a program that leaves a message unwaited may read a buffer before it lands).

    Raises:
        ValueError: unknown collective or algorithm, a function not defined at the top level
            of a file, ``world_size`` < 1 or above :data:`REAL_RANKS`, root out of range,
            ``hang`` not below ``timeout``, ``calls`` neither "door" nor "torch" (or "torch"
            with a registered name).
        TimeoutError: the world did not finish within ``timeout`` seconds (every process killed).
        collectives.tools.launch.WorldError: a rank failed otherwise (the launcher's verdict).
    """
    name, fn = resolve_algorithm(collective, algorithm)
    n = _checked_world(world_size, collective, root, REAL_RANKS,
                       f"a real run is drawn with its chunks, so at most {REAL_RANKS} processes; record() "
                       f"draws larger worlds on the simulator")
    source = _source(fn) if callable(algorithm) else None
    if calls not in ("door", "torch") or (calls == "torch" and source is None):
        raise ValueError(f"calls={calls!r}: 'door' (the algorithm modules' signature) or 'torch' (a function of "
                         f"one's own written against torch.distributed's point-to-point calls)")
    if not 0 < hang < timeout:
        raise ValueError(f"hang={hang!r} s must be positive and below the world's timeout ({timeout!r} s)")
    from ..tools.launch import run_in_group
    spec = topologies.load("ethernet-100g")     # flat: each rank's port in and out, as on one host
    fabric = topologies.build(spec, n)
    mode = mode_for(n)
    ranks = run_in_group(_real_rank, n, collective, name, root, mode, source, calls, backend="gloo", threads=1,
                         timeout=timeout, start_method="forkserver", preload=[__name__],
                         env={"COLLECTIVES_TIMEOUT": f"{hang:g}"})
    t0 = min(r["t0"] for r in ranks)
    # pair each side's k-th message of (src, dst, step): the door reports them in post order
    sends, recvs = {}, {}
    for r, got in enumerate(ranks):
        carried = {}
        for step, peer, cell, cells, values in got["sent"]:
            carried.setdefault((step, peer), []).append((cell, cells, values))
        landed = {}
        for step, peer, cell in got["received"]:
            landed.setdefault((step, peer), []).append(cell)
        for kind, src, dst, step, nbytes, start, end in got["messages"]:
            if kind == "send":
                cell, cells, values = carried[(step, dst)].pop(0)
                sends.setdefault((src, dst, step), []).append((nbytes, start, end, cell, cells, values))
            else:
                recvs.setdefault((src, dst, step), []).append((start, end, landed[(step, src)].pop(0)))
    messages = []
    for k, out in sends.items():     # a message both sides finished (a hang leaves halves)
        for (nbytes, s0, e0, cell, cells, values), (s1, e1, dcell) in zip(out, recvs.get(k, [])):
            src, dst, step = k
            messages.append(dict(src=src, dst=dst, step=step, nbytes=nbytes, start=max(s0, s1) - t0,
                                 end=max(e0, e1) - t0, links=list(fabric.route(src, dst)[0]), values=values,
                                 src_cell=cell, dst_cell=dcell, cells=cells))
    messages.sort(key=lambda m: (m["end"], m["src"], m["dst"]))
    snapshots = [[(t + got["t0"] - t0, s, v) for t, s, v in got["snapshots"]] for got in ranks]
    notes = [(t + got["t0"] - t0, r, cell, both, s, v) for got in ranks for t, r, cell, both, s, v in got["notes"]]
    return dict(kind="collective", collective=collective, algorithm=name, n=n, root=root, mode=mode,
                topology=spec, fabric=fabric, messages=messages, snapshots=snapshots,
                final=[got["final"] for got in ranks], want=[got["want"] for got in ranks], notes=notes,
                failure=_hang(ranks, collective, name, hang, calls), clock="measured",
                traffic=[got["traffic"] for got in ranks],
                unwaited=[[list(edge) for edge in got["unwaited"]] for got in ranks],
                title=f"{collective} / {name} on {n} ranks: a real run ({n} processes on one host, "
                      f"{'torch.distributed point-to-point calls through our door' if calls == 'torch' else 'gloo'})",
                time=max([got["end"] - t0 for got in ranks] + [m["end"] for m in messages] + [0.0]))
