"""One simulated call: the inputs each virtual rank holds, the algorithm called exactly as
``collectives.api`` calls it, the closed form its result must equal, the figures.

Inputs encode the rank, so every result has a closed form (``value``): rank r's
tensor i holds ``(r + 1) + ((7 i + j) mod 13)`` at element j. Sums stay exact in
float32 up to about 5,000 ranks, and each source of an all_to_all or gather piece is
told apart by its ``r + 1``.
"""
from dataclasses import dataclass, field

import torch
from torch.distributed import ReduceOp

from .. import observers, reduce_ops
from ..algorithms import REGISTRY
from ..algorithms._cost import SIZE_OF_CALL
from ..observers import CallRecord
from . import topology as topologies
from .world import ChargedOp, SimDoor, World

ROOTED = ("broadcast", "reduce", "gather", "scatter")
REDUCING = ("all_reduce", "reduce", "reduce_scatter")
PIECES = tuple(c for c, text in SIZE_OF_CALL.items() if "N pieces" in text)
COLLECTIVES = tuple(SIZE_OF_CALL)


def busbw_factor(collective, n):
    """nccl-tests' bus-bandwidth factor (as ``benchmarks.sweep`` uses): busbw = algbw * factor."""
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    if collective in ("broadcast", "reduce", "barrier"):
        return 1.0
    return (n - 1) / n


def elements(collective, nbytes, n, item):
    """Elements of each tensor (of each rank's piece, for the N-piece collectives) for a call of
    ``nbytes`` (rounded down, as nccl-tests does)."""
    if collective == "barrier":
        return 0
    return nbytes // (item * n) if collective in PIECES else nbytes // item


def call_bytes(collective, e, n, item):
    if collective == "barrier":
        return 0
    return e * item * (n if collective in PIECES else 1)


def value(r, i, e, dtype, device):
    """Rank r's tensor i (e elements): (r + 1) + ((7 i + j) mod 13)."""
    if device == "meta":
        return torch.empty(e, dtype=dtype, device="meta")
    return ((torch.arange(e) + 7 * i) % 13 + r + 1).to(dtype)


def expected(collective, r, n, e, root, dtype):
    """What rank r must hold after the call: a list of tensors (None where nothing is promised)."""
    v = lambda q, i: value(q, i, e, dtype, "cpu")  # noqa: E731
    total = lambda i: ((torch.arange(e) + 7 * i) % 13 * n + n * (n + 1) // 2).to(dtype)  # noqa: E731
    if collective == "all_reduce":
        return [total(0)]
    if collective == "broadcast":
        return [v(root, 0)]
    if collective == "reduce":
        return [total(0) if r == root else None]
    if collective == "scatter":
        return [v(root, r)]
    if collective == "gather":
        return [v(q, 0) for q in range(n)] if r == root else []
    if collective == "all_gather":
        return [v(q, 0) for q in range(n)]
    if collective == "reduce_scatter":
        return [total(r)]
    if collective == "all_to_all":
        return [v(q, r) for q in range(n)]
    return []


def setup(collective, r, n, e, root, dtype, device):
    """(arguments after the door, outputs to check) for rank r, as api.py hands them over."""
    v = lambda i: value(r, i, e, dtype, device)  # noqa: E731
    empty = lambda: torch.empty(e, dtype=dtype, device=device)  # noqa: E731
    if collective == "all_reduce":
        t = v(0)
        return [t], [t]
    if collective == "broadcast":
        t = v(0) if r == root else torch.zeros(e, dtype=dtype, device=device)
        return [t, root], [t]
    if collective == "reduce":
        t = v(0)
        return [t, root], [t]
    if collective == "scatter":
        out = empty()
        return [out, [value(r, i, e, dtype, device) for i in range(n)] if r == root else None, root], [out]
    if collective == "gather":
        outs = [empty() for _ in range(n)] if r == root else None
        return [v(0), outs, root], outs or []
    if collective == "all_gather":
        outs = [empty() for _ in range(n)]
        return [outs, v(0)], outs
    if collective == "reduce_scatter":
        out = empty()
        return [out, [v(i) for i in range(n)]], [out]
    if collective == "all_to_all":
        outs = [empty() for _ in range(n)]
        return [outs, [v(i) for i in range(n)]], outs
    return [], []


def local(collective, args):
    """The whole collective on a group of one, as api.py's ``local()`` does it (at most a copy)."""
    if collective == "scatter":
        args[0].copy_(args[1][0])
    elif collective == "gather":
        args[1][0].copy_(args[0])
    elif collective == "all_gather":
        args[0][0].copy_(args[1])
    elif collective == "reduce_scatter":
        args[0].copy_(args[1][0])
    elif collective == "all_to_all":
        args[0][0].copy_(args[1][0])


@dataclass
class Result:
    """One simulated call. Times in seconds of simulated time."""
    collective: str
    algorithm: str
    world_size: int
    bytes: int
    time: float
    topology: str
    ranks: list = field(repr=False)           # per rank: dict of its counts and finishing time
    outputs: list = field(repr=False)         # per rank: its output tensors (empty for meta)
    wrong: object = None                       # (rank, output, element, got, want) of the first error
    link_bytes: dict = field(default_factory=dict)   # link class -> bytes it carried, once per link crossed

    @property
    def algbw(self):
        """Bytes per second of the call (GB/s where printed)."""
        return self.bytes / self.time if self.time > 0 else float("inf")

    @property
    def busbw(self):
        return self.algbw * busbw_factor(self.collective, self.world_size)

    @property
    def max_messages_sent(self):
        return max(r["sent_messages"] for r in self.ranks)

    @property
    def max_bytes_sent(self):
        return max(r["sent_bytes"] for r in self.ranks)

    def row(self):
        """The ``--json`` fields."""
        return {"collective": self.collective, "algorithm": self.algorithm, "world_size": self.world_size,
                "bytes": self.bytes, "time_us": self.time * 1e6, "algbw": self.algbw / 1e9,
                "busbw": self.busbw / 1e9, "max_messages_sent": self.max_messages_sent,
                "max_bytes_sent": self.max_bytes_sent, "topology": self.topology,
                "link_bytes": dict(self.link_bytes)}


def resolve_algorithm(collective, algorithm):
    """(name, function): a registered name, or a function with the algorithm modules' signature."""
    if collective not in REGISTRY:
        raise ValueError(f"unknown collective {collective!r}; known: {', '.join(REGISTRY)}")
    if callable(algorithm):
        return getattr(algorithm, "__name__", "function"), algorithm
    fn = REGISTRY[collective].get(algorithm)
    if fn is None:
        raise ValueError(f"unknown algorithm {algorithm!r} for {collective}; known: "
                         f"{', '.join(REGISTRY[collective])}")
    return algorithm, fn


def simulate(collective, algorithm, world_size, nbytes, topology="ethernet-100g", root=0,
             device="meta", dtype=torch.float32, op=ReduceOp.SUM, check=None, calls=1):
    """Simulate one call of ``algorithm`` (a registered name or a function with the algorithm
    modules' signature) of ``collective`` on ``world_size`` virtual ranks.

    Args:
        nbytes: size of the call as nccl-tests counts it (``SIZE_OF_CALL``); rounded down to
            whole elements (per rank's piece, for the N-piece collectives).
        topology: a preset name, ``"local"``, a JSON file, or a topology dict.
        root: the root of broadcast, reduce, gather and scatter.
        device: ``"meta"`` (sizes only: time and traffic) or ``"cpu"`` (real data, exact results).
        check: compare every rank's output with the closed form (default: when ``device="cpu"``).
        calls: how many calls each rank makes back to back, as a benchmark that times a batch
            of calls does (the next call's messages meet the slower ranks' last ones); each
            starts from fresh inputs, and ``time`` is per call (the whole / ``calls``).

    Returns:
        :class:`Result`. Raises :class:`~collectives.sim.deadlock.Deadlock` if the ranks wait
        for each other forever, :class:`~collectives.sim.world.SimulationError` if a rank raised.

    Example::

        >>> r = simulate("all_reduce", "ring", 1024, 1 << 30, "h100-cluster")
        >>> round(r.busbw / 1e9)      # GB/s
    """
    name, fn = resolve_algorithm(collective, algorithm)
    n = world_size
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"world_size must be a whole number >= 1, got {n!r}")
    if collective in ROOTED and not 0 <= root < n:
        raise ValueError(f"root={root} is out of range for {n} ranks")
    if isinstance(calls, bool) or not isinstance(calls, int) or calls < 1:
        raise ValueError(f"calls must be a whole number >= 1, got {calls!r}")
    spec = topologies.load(topology)
    fabric = topologies.build(spec, n)
    item = torch.empty(0, dtype=dtype).element_size()
    e = elements(collective, int(nbytes), n, item)
    size = call_bytes(collective, e, n, item)
    red = reduce_ops.reduction(op, dtype, f"collectives.sim {collective}") if collective in REDUCING else None
    check = device != "meta" if check is None else check
    world = World(fabric, real_data=device != "meta")
    outputs = [None] * n

    def body(r):
        for _ in range(calls):
            with world.aside(world.ranks[r]):   # the inputs exist before the call: not its work
                args, outs = setup(collective, r, n, e, root, dtype, device)
            outputs[r] = outs
            if n == 1:
                local(collective, args)
                continue
            if fabric.call:
                world.busy(r, fabric.call)
            door = SimDoor(world, r, collective, name)
            if red is not None:
                args.append(ChargedOp(red, world, r))
            fn(door, *args)
        if red is not None and red.average and (collective != "reduce" or r == root) and device != "meta":
            outs[0].div_(n)

    time = world.run(body) / calls
    ranks = [{"sent_messages": x.sent_messages, "sent_bytes": x.sent_bytes, "recv_messages": x.recv_messages,
              "recv_bytes": x.recv_bytes, "reduced_bytes": x.reduced_bytes, "steps": len(x.steps),
              "time": x.end_time} for x in world.ranks]
    if observers.watched():
        for x in world.ranks:
            observers.report_call(CallRecord(collective, name, 0, tuple(range(n)), x.id, size, 0.0, x.end_time))
    result = Result(collective, name, n, size, time, spec.get("name", spec["kind"]), ranks,
                    outputs if device != "meta" else [],
                    link_bytes={cls: b // calls for cls, b in world.link_bytes.items()})
    if check and device != "meta":
        result.wrong = first_wrong(collective, outputs, n, e, root, dtype, red)
    return result


def first_wrong(collective, outputs, n, e, root, dtype, red=None):
    """(rank, output index, element, got, want) of the first element off the closed form, or None.
    (The closed form is for SUM, and AVG after the division.)"""
    for r in range(n):
        want = expected(collective, r, n, e, root, dtype)
        got = outputs[r]
        for i, w in enumerate(want):
            if w is None:
                continue
            if red is not None and red.average:
                w = w / n
            g = got[i]
            if g.shape != w.shape or not torch.equal(g, w):
                if g.shape != w.shape:
                    return r, i, None, list(g.shape), list(w.shape)
                j = int((g != w).nonzero()[0, 0])
                return r, i, j, g[j].item(), w[j].item()
    return None
