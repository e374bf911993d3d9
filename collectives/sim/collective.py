"""One simulated call: the inputs each virtual rank holds, the algorithm called exactly as
``collectives.api`` calls it, the closed form its result must equal, the figures.

Inputs encode the rank, so every result has a closed form (``value``): rank r's
tensor i holds ``(r + 1) + ((7 i + j) mod 13)`` at element j. Sums stay exact in
float32 up to about 5,000 ranks, and each source of an all_to_all or gather piece is
told apart by its ``r + 1``.
"""
import os
from dataclasses import dataclass, field

import torch
from torch.distributed import ReduceOp

from .. import observers, reduce_ops
from ..algorithms import REGISTRY
from ..algorithms._cost import SIZE_OF_CALL
from ..observers import CallRecord
from . import topology as topologies
from .world import ChargedOp, SimDoor, World, check_noise

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


def combined(op, n, i, e, dtype):
    """Tensor i reduced with ``op`` over ranks 0..n-1, in closed form: element j of rank r is
    r + 1 + c with c = (7 i + j) mod 13, so SUM is n c + n(n+1)/2, AVG that over n, MAX c + n,
    MIN c + 1, PRODUCT (c+1)(c+2)...(c+n); the bitwise ops have no short form and are folded."""
    name = reduce_ops.reduction(op, dtype, "collectives.sim").name
    c = (torch.arange(e) + 7 * i) % 13
    if name in ("SUM", "AVG"):
        # AVG: the division happens after the sum, as the simulated call does it
        return (c * n + n * (n + 1) // 2).to(dtype)
    if name == "MAX":
        return (c + n).to(dtype)
    if name == "MIN":
        return (c + 1).to(dtype)
    if name == "PRODUCT":
        out = torch.ones(e, dtype=torch.float64)
        for q in range(1, n + 1):
            out *= (c + q).to(torch.float64)
        return out.to(dtype)
    fold = {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}[name]
    out = value(0, i, e, dtype, "cpu")
    for q in range(1, n):
        out = fold(out, value(q, i, e, dtype, "cpu"))
    return out


def expected(collective, r, n, e, root, dtype, op=ReduceOp.SUM):
    """What rank r must hold after the call: a list of tensors (None where nothing is promised).
    For the reducing collectives ``op``'s own closed form, and AVG before its division."""
    v = lambda q, i: value(q, i, e, dtype, "cpu")  # noqa: E731
    total = lambda i: combined(op, n, i, e, dtype)  # noqa: E731
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
    schedule: list = field(default=None, repr=False)  # per rank: its posts and waits (``schedule=True``)

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


MAX_BYTES = 1 << 50
# Bytes assumed for one meta tensor or view of it and its bookkeeping, the unit of the records
# that grow as N^2: an estimate (a Python tensor object plus its C++ TensorImpl), NOT measured.
TENSOR_RECORD = 700


def memory_estimate(collective, n, size, device):
    """Bytes a simulation holds at its peak, roughly: with ``device="cpu"`` every rank's input,
    output and closed form (3 x the call's bytes per rank, the N-piece collectives' input is N
    pieces); on meta only the tensor objects: an N-piece collective holds N input and N output
    pieces on each rank, and a chunking algorithm (ring, ...) a view per piece, N^2 in all."""
    records = n * n * TENSOR_RECORD * (3 if collective in PIECES else 1)
    data = 3 * n * size if device == "cpu" else 0
    return records + data


def memory_limit(memory=None):
    if memory is not None:
        return int(memory)
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def refuse_beyond_memory(collective, n, size, device, memory=None):
    need, limit = memory_estimate(collective, n, size, device), memory_limit(memory)
    if need <= limit:
        return
    why = (f"device='cpu' holds every rank's real tensors ({n} x {size} bytes, 3 times over)"
           if device == "cpu" and 3 * n * size > need // 2 else
           f"{collective} on {n} ranks keeps about {n}^2 tensor records")
    hint = "device='meta', " if device == "cpu" else ""
    raise ValueError(f"collectives.sim: {why}: about {need / 1e9:.1f} GB, more than the {limit / 1e9:.1f} GB "
                     f"allowed (memory=, in bytes); use "
                     f"{hint}fewer ranks or fewer bytes")


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
             device="meta", dtype=torch.float32, op=ReduceOp.SUM, check=None, calls=1, memory=None,
             schedule=False, stragglers=None, delays=None, jitter=0.0, seed=0, progress=None,
             slow_links=None):
    """Simulate one call of ``algorithm`` (a registered name or a function with the algorithm
    modules' signature) of ``collective`` on ``world_size`` virtual ranks.

    Args:
        nbytes: size of the call as nccl-tests counts it (``SIZE_OF_CALL``); rounded down to
            whole elements (per rank's piece, for the N-piece collectives).
        topology: a preset name, ``"local"``, a JSON file, or a topology dict.
        root: the root of broadcast, reduce, gather and scatter.
        device: ``"meta"`` (sizes only: time and traffic) or ``"cpu"`` (real data, exact results).
        check: compare every rank's output with the closed form (default: when ``device="cpu"``).
        memory: bytes the simulation may take (default half this machine's memory); a call whose estimate is larger is refused before any rank
            runs, with the estimate (see :func:`memory_estimate`).
        calls: how many calls each rank makes back to back, as a benchmark that times a batch
            of calls does (the next call's messages meet the slower ranks' last ones); each
            starts from fresh inputs, and ``time`` is per call (the whole / ``calls``).
        schedule: keep each rank's posts, waits and CPU time in ``Result.schedule`` (see
            :class:`~collectives.sim.world.World`), for another simulator to play the same
            messages (``python -m benchmarks.sim_vs_simgrid``).
        stragglers: ``{rank: factor}``: each such rank is ``factor`` times slower at its own CPU
            work and at the latency and gap of its messages (:mod:`~collectives.sim.world`).
        delays: ``{rank: seconds}``: each such rank enters every call ``seconds`` late.
        slow_links: ``{rank: factor}``: each such rank's links (both directions) carry
            ``1 / factor`` of their bandwidth; latency unchanged (a slow NIC, not a slow host).
        jitter: seconds, the mean of an exponentially distributed extra latency of every
            message, drawn from ``random.Random(seed)``: the same seed, the same times.
        progress: called as ``progress(messages done, ranks finished, world_size)`` every few
            thousand events and once at the end, for a long simulation to say how far it is
            (``--quiet`` aside, the command line's does).

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
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise ValueError(f"nbytes must be a whole number >= 0, got {nbytes!r}")
    if nbytes > MAX_BYTES:
        raise ValueError(f"nbytes={nbytes} is more than {MAX_BYTES} (2**50, 1 PiB), the most one "
                         f"simulated call takes (a tensor's element count must fit in 64 bits)")
    if str(device) not in ("meta", "cpu"):
        raise ValueError(f"device must be 'meta' or 'cpu' (the ranks are virtual and run in this "
                         f"process: 'meta' for time and traffic, 'cpu' for real data), got {str(device)!r}")
    device = str(device)
    check_noise(n, stragglers, delays, jitter, seed, slow_links)
    spec = topologies.load(topology)
    fabric = topologies.build(spec, n)
    item = torch.empty(0, dtype=dtype).element_size()
    e = elements(collective, int(nbytes), n, item)
    size = call_bytes(collective, e, n, item)
    red = reduce_ops.reduction(op, dtype, f"collectives.sim {collective}") if collective in REDUCING else None
    refuse_beyond_memory(collective, n, size, device, memory)
    check = device != "meta" if check is None else check
    world = World(fabric, real_data=device != "meta", schedule=schedule, stragglers=stragglers,
                  delays=delays, jitter=jitter, seed=seed, progress=progress, slow_links=slow_links)
    outputs = [None] * n

    def body(r):
        for _ in range(calls):
            world.arrive(r)
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
              "recv_bytes": x.recv_bytes, "reduced_bytes": x.reduced_bytes, "steps": x.nsteps,
              "time": x.end_time} for x in world.ranks]
    if observers.watched():
        for x in world.ranks:
            observers.report_call(CallRecord(collective, name, 0, tuple(range(n)), x.id, size, 0.0, x.end_time))
    result = Result(collective, name, n, size, time, spec.get("name", spec["kind"]), ranks,
                    outputs if device != "meta" else [],
                    link_bytes={cls: b // calls for cls, b in world.link_bytes.items()},
                    schedule=world.schedule)
    if check and device != "meta":
        result.wrong = first_wrong(collective, outputs, n, e, root, dtype, red)
    return result


def first_wrong(collective, outputs, n, e, root, dtype, red=None):
    """(rank, output index, element, got, want) of the first element off ``red``'s closed form
    (SUM's where there is no reduction), or None."""
    for r in range(n):
        want = expected(collective, r, n, e, root, dtype, red.op if red is not None else ReduceOp.SUM)
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
