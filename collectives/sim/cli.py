"""``python -m collectives.sim``: predicted times of every algorithm, nccl-tests style, at any N.

Usage::

    python -m collectives.sim --collective all_reduce --algorithm ring,tree \\
        --world-size 8,64,1024 -b 4K -e 1G -f 4 --topology h100-cluster
    python -m collectives.sim --collective all_reduce --function mine.py:all_reduce --check --world-size 1024 -e 1M
    python -m collectives.sim --collective broadcast --world-size 33 --check --root 7
    python -m collectives.sim --topology my_cluster.json --json rows.json --trace ring.json

Flags as in ``benchmarks.sweep`` (nccl-tests'): ``-b``/``-e`` smallest/largest size, ``-f``
step factor (``-i`` step increment when ``-f 1``), ``-c 1`` (or ``--check``) to run on real
tensors and check each rank's result against the closed form; ``-n``/``-w`` are accepted and
ignored (a simulation gives the same time every time). Ours: ``--collective``,
``--algorithm`` (names or ``all``), ``--world-size``, ``--topology`` (a preset, ``local``, or a
JSON file; see ``collectives/sim/topology.py``), ``--model`` (``loggp``, the default, or
``alpha-beta``: no gap, no overhead) and ``--gap SECONDS`` (LogGP's g), ``--root``, ``--function FILE.py:NAME`` (your
own algorithm, with the signature of the algorithm modules), ``--json FILE`` (one object per
row), ``--trace FILE`` (a Perfetto trace, in simulated time, of the first algorithm at the
first world size and size).

Stragglers and noise (:mod:`collectives.sim.world` defines them): ``--straggler RANK:FACTOR``
makes that rank a host FACTOR times slower (its CPU work, and the latency and gap of every
message it sends or receives; not the links' bandwidth), ``--straggler RANK:+SECONDS`` makes
it enter every call SECONDS late; both repeatable. ``--slow-link RANK:FACTOR`` (repeatable) is
a slow NIC instead: that rank's links, both directions, carry 1/FACTOR of their bandwidth
(FACTOR >= 1), their latency unchanged, so it slows bytes and not messages: a large call
of a ring that crosses it at every step, a small one hardly. ``--jitter SECONDS`` adds to every
message's latency an extra drawn from the exponential distribution of that mean, from
``--seed N`` (default 0): the same seed gives the same times.

Progress: a run longer than about 2 s says on stderr how far it is (point k of n, the
collective, algorithm, world size and size, messages done of how many the point sends, ranks
finished; the total is the algorithm's ``cost()``'s ``total_messages``, every rank's messages
together, exact for every registered algorithm; a ``--function``, which has no ``cost()``,
gets the count alone): one line
rewritten in place at most 4 times a second when stderr is a terminal, else a line every 5 s.
A shorter run prints nothing there; ``--quiet`` turns it off.

Exit status: 0; 1 when ``--check`` finds a wrong element (the rank and the element are
named); 2 for bad flags (before anything runs); 3 when a schedule deadlocks (with the cycle).
"""
import argparse
import importlib.util
import inspect
import json
import math
import os
import sys
import time

import torch

from .. import observers
from ..algorithms import REGISTRY
from ..tools.sizes import human, parse_size, sizes
from . import topology as topologies
from .collective import COLLECTIVES, ROOTED, busbw_factor, call_bytes, elements, simulate
from .deadlock import Deadlock
from .world import SimulationError

DTYPES = {"float": torch.float32, "double": torch.float64, "half": torch.float16, "bfloat16": torch.bfloat16,
          "int32": torch.int32, "int64": torch.int64}
CHECK_LIMIT = 2 << 30     # real tensors of every rank together, for --check


def world_sizes(text):
    try:
        values = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--world-size takes numbers, e.g. 8 or 8,64,1024; got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"--world-size must be 1 or more, got {text!r}")
    return values


def straggler(text):
    """``RANK:FACTOR`` (a rank FACTOR times slower) or ``RANK:+SECONDS`` (a rank that enters
    every call SECONDS late): (rank, "factor" or "delay", value)."""
    rank, sep, value = str(text).partition(":")
    try:
        rank = int(rank)
        late = value.strip().startswith("+")
        x = float(value.strip().lstrip("+"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--straggler takes RANK:FACTOR (3:2, rank 3 twice as slow) or "
                                         f"RANK:+SECONDS (3:+0.001, rank 3 one ms late); got {text!r}") from None
    if not sep or rank < 0 or not math.isfinite(x) or (x < 0 if late else x <= 0):
        raise argparse.ArgumentTypeError(f"--straggler {text}: the rank must be >= 0 and "
                                         + ("the delay >= 0 seconds" if late else "the factor > 0"))
    return rank, "delay" if late else "factor", x


def slow_link(text):
    """``RANK:FACTOR``: that rank's links carry 1/FACTOR of their bandwidth: (rank, factor)."""
    rank, sep, value = str(text).partition(":")
    try:
        rank, x = int(rank), float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--slow-link takes RANK:FACTOR (3:4, rank 3's links at a quarter "
                                         f"of their bandwidth); got {text!r}") from None
    if not sep or rank < 0 or not math.isfinite(x) or x < 1:
        raise argparse.ArgumentTypeError(f"--slow-link {text}: the rank must be >= 0 and the factor a "
                                         f"finite number >= 1 (it divides the bandwidth)")
    return rank, x


def seconds(text):
    try:
        x = float(text)
    except ValueError:
        x = -1.0
    if not math.isfinite(x) or x < 0:
        raise argparse.ArgumentTypeError(f"--jitter takes seconds >= 0 (the mean extra latency of a message), "
                                         f"got {text!r}")
    return x


class Progress:
    """How far a long run is, on ``stream`` (stderr): nothing for the first ``after`` seconds,
    then, at most every ``every`` seconds, one line rewritten in place on a terminal, or a
    plain line otherwise. ``point`` names the point being run and, where it can, how many
    messages it sends; ``tick`` is the world's ``progress`` callback."""

    def __init__(self, stream, total, after=2.0, every=None):
        self.stream, self.total = stream, total
        self.tty = hasattr(stream, "isatty") and stream.isatty()
        self.every = every if every is not None else (0.25 if self.tty else 5.0)
        self.begun = time.monotonic()
        self.next = self.begun + after
        self.k, self.what, self.since = 0, "", self.begun
        self.shown = False
        self.total_messages = None

    def point(self, what, n, total_messages=None):
        """A new point: ``what`` names it; ``total_messages()``, if given, is how many messages
        it sends, asked for only when a line is about to say it (``cost()`` tallies the
        schedule: at 4,096 ranks up to half a second; a point over before its first line
        never pays it)."""
        self.k += 1
        self.what, self.since = what, time.monotonic()
        self.total_messages = total_messages
        self.tick(0, 0, n)

    def tick(self, messages, finished, n):
        now = time.monotonic()
        if now < self.next:
            return
        self.next = now + self.every
        if callable(self.total_messages):
            self.total_messages = self.total_messages()
        done = f"messages {messages:,} of {self.total_messages:,}" if self.total_messages is not None else \
            f"{messages:,} messages done"
        line = (f"collectives.sim: point {self.k} of {self.total}, {self.what}: {done}, "
                f"{finished}/{n} ranks finished ({now - self.since:.0f} s on it, {now - self.begun:.0f} s in all)")
        if self.tty:
            self.stream.write("\r" + line + "\x1b[K")
            self.shown = True
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def clear(self):
        """Before a line goes to stdout: on a terminal, the progress line goes."""
        if self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.shown = False


def messages_total(collective, algorithm, n, size, item):
    """How many messages one call of a registered ``algorithm`` sends, all ranks together,
    exactly: its ``cost()``'s ``total_messages`` (every rank's count summed, not N x the
    busiest rank's, which overstates a tree: its root sends log N, its leaves 1; checked
    against the simulator by tests/test_sim_total_messages.py); None where there is no
    ``cost()`` to ask (a learner's ``--function``). ``cost()`` tallies the schedule, so at N
    ranks it takes about as long as the messages it counts take to add up, a small part of
    the time they take to simulate."""
    if algorithm not in REGISTRY[collective]:
        return None
    from ..algorithms import cost
    e = elements(collective, size, n, item)
    return cost(collective, algorithm, n, call_bytes(collective, e, n, item), item).total_messages


def load_function(spec, collective, api="door"):
    """The learner's function from ``FILE.py:NAME`` (NAME defaults to the collective), checked
    against the signature of the registered algorithms of ``collective`` (``api="torch"``: of
    torch's collective instead, the algorithms' arguments without ``comm`` and ``op``)."""
    path, _, name = spec.partition(":")
    name = name or collective
    if not os.path.isfile(path):
        raise ValueError(f"--function {spec}: no file {path!r}")
    try:
        module_spec = importlib.util.spec_from_file_location(f"_sim_user_{abs(hash(path))}", path)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    except Exception as exc:
        raise ValueError(f"--function {spec}: {path} does not import: {type(exc).__name__}: {exc}") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"--function {spec}: {path} defines no function {name!r}")
    reference = next(iter(REGISTRY[collective].values()))
    want = [p.name for p in inspect.signature(reference).parameters.values() if p.default is p.empty]
    if api == "torch":
        want = [w for w in want if w not in ("comm", "op")]
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = None
    required = [p for p in params or () if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY,
                                                                                  p.POSITIONAL_OR_KEYWORD)]
    takes_rest = any(p.kind == p.VAR_POSITIONAL for p in params or ())
    positional = [p for p in params or () if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if params is None or len(required) > len(want) or (len(positional) < len(want) and not takes_rest):
        raise ValueError(f"--function {spec}: {name}{inspect.signature(fn) if params is not None else '(?)'} "
                         f"does not take the arguments of the {collective} "
                         f"{'of torch.distributed' if api == 'torch' else 'algorithms'}: {collective}({', '.join(want)})")
    return fn


def parser():
    p = argparse.ArgumentParser(prog="python -m collectives.sim", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--collective", default="all_reduce",
                   help=f"one or more of {', '.join(COLLECTIVES)} (default all_reduce)")
    p.add_argument("--algorithm", default="all", help="names, comma-separated, or 'all' (default)")
    p.add_argument("--function", default=None, metavar="FILE.py:NAME",
                   help="simulate your own algorithm (the signature of the algorithm modules)")
    p.add_argument("--world-size", type=world_sizes, default=[8, 64, 1024], help="default 8,64,1024")
    p.add_argument("-b", "--minbytes", type=parse_size, default=parse_size("4K"))
    p.add_argument("-e", "--maxbytes", type=parse_size, default=parse_size("1G"))
    p.add_argument("-f", "--stepfactor", type=int, default=4)
    p.add_argument("-i", "--stepbytes", type=parse_size, default=parse_size("1M"))
    p.add_argument("-n", "--iters", type=int, default=1, help="accepted, ignored: simulations do not vary")
    p.add_argument("-w", "--warmup-iters", type=int, default=0, help="accepted, ignored")
    p.add_argument("-c", "--check", type=int, default=0, choices=(0, 1), nargs="?", const=1,
                   help="real tensors, each rank's result checked against the closed form")
    p.add_argument("-d", "--datatype", default="float", choices=sorted(DTYPES))
    p.add_argument("--root", type=int, default=0, help="root of broadcast, reduce, gather, scatter")
    p.add_argument("--topology", default="ethernet-100g",
                   help=f"{', '.join(topologies.names())}, or a JSON file (default ethernet-100g)")
    p.add_argument("--model", default=None, choices=topologies.MODELS,
                   help="the network model: loggp (the topology's gap and overhead; the default) or "
                        "alpha-beta (no gap, no overhead: concurrent messages overlap their alphas)")
    p.add_argument("--gap", default=None, type=float, metavar="SECONDS",
                   help="LogGP's g: least time between two message starts out of (or into) one rank "
                        "(default: the topology's gap, else its alpha)")
    p.add_argument("--straggler", type=straggler, action="append", default=[], metavar="RANK:FACTOR",
                   help="that rank is a host FACTOR times slower: its CPU work and the latency and gap of "
                        "its messages (not the links' bandwidth); RANK:+SECONDS: it enters every call "
                        "SECONDS late. Repeatable")
    p.add_argument("--slow-link", type=slow_link, action="append", default=[], metavar="RANK:FACTOR",
                   help="that rank's links (its NIC, both directions) carry 1/FACTOR of their bandwidth; "
                        "latency, gap and CPU unchanged: a slow cable slows bytes, not messages. Repeatable")
    p.add_argument("--jitter", type=seconds, default=0.0, metavar="SECONDS",
                   help="every message's latency gets an extra drawn from the exponential distribution "
                        "of this mean (default 0)")
    p.add_argument("--seed", type=int, default=0, help="the jitter's random seed (default 0)")
    p.add_argument("--quiet", action="store_true",
                   help="no progress on stderr (shown for runs longer than about 2 s)")
    p.add_argument("--json", default=None, metavar="FILE", help="write the rows as a JSON list")
    p.add_argument("--trace", default=None, metavar="FILE", help="Perfetto trace of the first point")
    p.add_argument("--html", default=None, metavar="FILE",
                   help="the browser lab's page (collectives.viz) of the first algorithm at the first world size")
    return p


def plan(args):
    """Everything checked, nothing run: [(collective, [(name, fn)])], sizes, topology spec."""
    collectives_ = [c.strip() for c in args.collective.split(",") if c.strip()]
    for c in collectives_:
        if c not in REGISTRY:
            raise ValueError(f"unknown collective {c!r}; known: {', '.join(REGISTRY)}")
    todo = []
    for c in collectives_:
        if args.function:
            fn = load_function(args.function, c)
            todo.append((c, [(args.function.partition(":")[2] or c, fn)]))
            continue
        names = list(REGISTRY[c]) if args.algorithm == "all" else \
            [a.strip() for a in args.algorithm.split(",") if a.strip()]
        for a in names:
            if a not in REGISTRY[c]:
                raise ValueError(f"unknown algorithm {a!r} for {c}; known: {', '.join(REGISTRY[c])}")
        todo.append((c, [(a, a) for a in names]))
    points = sizes(args.minbytes, args.maxbytes, args.stepfactor, args.stepbytes)
    spec = topologies.load(args.topology)
    if args.model is not None or args.gap is not None:
        spec = dict(spec, **({"model": args.model} if args.model else {}),
                    **({"gap": args.gap} if args.gap is not None else {}))
        spec = topologies.validate(spec)
    for n in args.world_size:
        if any(c in ROOTED for c in collectives_) and not 0 <= args.root < n:
            raise ValueError(f"--root {args.root} is out of range for --world-size {n}")
        check_named_ranks(args, n)
        if args.check and n * max(points) * (n if any(c in ("all_to_all", "all_gather", "gather")
                                                        for c in collectives_) else 1) > CHECK_LIMIT:
            raise ValueError(f"--check keeps every rank's real tensors: {n} ranks x {human(max(points))} is "
                             f"more than {human(CHECK_LIMIT)}; check at a smaller -e or --world-size")
    return todo, points, spec


def check_named_ranks(args, n):
    """ValueError unless every rank ``--straggler`` and ``--slow-link`` name is one of ``n``."""
    for flag, rank in [("--straggler", r) for r, _, _ in args.straggler] + \
            [("--slow-link", r) for r, _ in args.slow_link]:
        if rank >= n:
            raise ValueError(f"{flag} names rank {rank}, but --world-size {n} has ranks 0..{n - 1}")


def perturbations(args):
    """simulate()'s ``stragglers``, ``delays`` and ``slow_links`` from ``--straggler`` and ``--slow-link``."""
    return dict(stragglers={r: x for r, how, x in args.straggler if how == "factor"} or None,
                delays={r: x for r, how, x in args.straggler if how == "delay"} or None,
                slow_links=dict(args.slow_link) or None)


def noise(args):
    """simulate()'s keyword arguments for ``--straggler``, ``--slow-link``, ``--jitter`` and ``--seed``."""
    return dict(perturbations(args), jitter=args.jitter, seed=args.seed)


def main(argv=None, progress_after=2.0, progress_every=None):
    """The command; ``progress_after`` and ``progress_every`` (seconds) set when progress
    starts and how often it is said (the tests make them small)."""
    args = parser().parse_args(argv)
    try:
        todo, points, spec = plan(args)
    except ValueError as exc:
        print(f"collectives.sim: {exc}", file=sys.stderr)
        return 2
    extra = noise(args)
    total = sum(len(a) for _, a in todo) * len(args.world_size) * len(points)
    progress = None if args.quiet else Progress(sys.stderr, total, progress_after, progress_every)
    if progress is not None:
        extra["progress"] = progress.tick
    say = print if progress is None else (lambda *a, **k: (progress.clear(), print(*a, **k)))
    dtype = DTYPES[args.datatype]
    item = torch.empty(0, dtype=dtype).element_size()
    device = "cpu" if args.check else "meta"
    say(f"# collectives.sim: {topologies.describe(spec)}")
    say(f"#   source: {spec.get('source', 'a topology file')}")
    rows, traced = [], args.trace is None
    for collective, algorithms in todo:
        for n in args.world_size:
            say(f"\n# {collective} on {n} ranks" + (f", root {args.root}" if collective in ROOTED else "")
                  + f" (busbw = algbw x {busbw_factor(collective, n):.3g})")
            say(f"{'size':>10} {'count':>12} {'type':>8}  {'algorithm':<22} {'time(us)':>12} {'algbw(GB/s)':>12} "
                  f"{'busbw(GB/s)':>12} {'msgs/rank':>10} {'bytes/rank':>12}")
            for size in points:
                results = []
                for name, fn in algorithms:
                    if progress is not None:
                        progress.point(f"{collective}/{name}, {n} ranks, {human(size)}", n,
                                       (lambda c=collective, a=fn, n=n, s=size:
                                        messages_total(c, a, n, s, item)) if isinstance(fn, str) else None)
                    try:
                        if not traced:
                            with observers.trace() as records:
                                r = simulate(collective, fn, n, size, spec, args.root, device, dtype, **extra)
                            from ..tools import perfetto
                            perfetto.export_chrome_trace(records, args.trace)
                            traced = True
                        else:
                            r = simulate(collective, fn, n, size, spec, args.root, device, dtype, **extra)
                    except Deadlock as exc:
                        say(f"collectives.sim: {collective}/{name} on {n} ranks, {human(size)}: {exc}",
                              file=sys.stderr)
                        return 3
                    except SimulationError as exc:
                        say(f"collectives.sim: {collective}/{name} on {n} ranks, {human(size)}: {exc}",
                              file=sys.stderr)
                        return 1
                    r.algorithm = name
                    results.append(r)
                    rows.append(r.row())
                    say(f"{human(r.bytes):>10} {elements(collective, size, n, item):>12} {args.datatype:>8}  "
                          f"{name:<22} {r.time * 1e6:>12.2f} {r.algbw / 1e9:>12.3f} {r.busbw / 1e9:>12.3f} "
                          f"{r.max_messages_sent:>10} {r.max_bytes_sent:>12}")
                    if r.wrong is not None:
                        rank, out, j, got, want = r.wrong
                        what = f"element {j} is {got}, expected {want}" if j is not None else \
                            f"shape {got}, expected {want}"
                        say(f"collectives.sim: WRONG RESULT: {collective}/{name} on {n} ranks, {human(size)}: "
                              f"rank {rank}, output {out}: {what}", file=sys.stderr)
                        return 1
                if len(results) > 1:
                    best = min(results, key=lambda x: x.time)
                    say(f"{'':>10} {'':>12} {'':>8}  fastest: {best.algorithm}")
    if progress is not None:
        progress.clear()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
        say(f"\n# wrote {len(rows)} rows to {args.json}")
    if args.trace:
        say(f"# wrote a Perfetto trace of {todo[0][0]}/{todo[0][1][0][0]} on {args.world_size[0]} ranks, "
              f"{human(points[0])} to {args.trace} (simulated time; open it in ui.perfetto.dev)")
    if args.check:
        say("# every rank's result equals the closed form")
    if args.html:   # --html: collectives.viz draws the first point (sizes aside: it picks its own)
        from .. import viz
        c, (name, fn) = todo[0][0], todo[0][1][0]
        viz.page(c, fn, args.world_size[0], path=args.html, topology=spec, root=args.root)
        say(f"# wrote {args.html}: {c}/{name} on {args.world_size[0]} ranks, drawn by collectives.viz")
    return 0
