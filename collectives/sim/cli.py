"""``python -m collectives.sim``: predicted times of every algorithm, nccl-tests style, at any N.

Usage::

    python -m collectives.sim --collective all_reduce --algorithm ring,tree \\
        --world-size 8,64,1024 -b 4K -e 1G -f 4 --topology h100-cluster
    python -m collectives.sim --collective all_reduce --function mine.py:all_reduce --check --world-size 1024
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

Exit status: 0; 1 when ``--check`` finds a wrong element (the rank and the element are
named); 2 for bad flags (before anything runs); 3 when a schedule deadlocks (with the cycle).
"""
import argparse
import importlib.util
import inspect
import json
import os
import sys

import torch

from .. import observers
from ..algorithms import REGISTRY
from ..tools.sizes import human, parse_size, sizes
from . import topology as topologies
from .collective import COLLECTIVES, ROOTED, busbw_factor, elements, simulate
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


def load_function(spec, collective):
    """The learner's function from ``FILE.py:NAME`` (NAME defaults to the collective), checked
    against the signature of the registered algorithms of ``collective``."""
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
                         f"does not take the arguments of the {collective} algorithms: "
                         f"{collective}({', '.join(want)})")
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
        if args.check and n * max(points) * (n if any(c in ("all_to_all", "all_gather", "gather")
                                                        for c in collectives_) else 1) > CHECK_LIMIT:
            raise ValueError(f"--check keeps every rank's real tensors: {n} ranks x {human(max(points))} is "
                             f"more than {human(CHECK_LIMIT)}; check at a smaller -e or --world-size")
    return todo, points, spec


def main(argv=None):
    args = parser().parse_args(argv)
    try:
        todo, points, spec = plan(args)
    except ValueError as exc:
        print(f"collectives.sim: {exc}", file=sys.stderr)
        return 2
    dtype = DTYPES[args.datatype]
    item = torch.empty(0, dtype=dtype).element_size()
    device = "cpu" if args.check else "meta"
    print(f"# collectives.sim: {topologies.describe(spec)}")
    print(f"#   source: {spec.get('source', 'a topology file')}")
    rows, traced = [], args.trace is None
    for collective, algorithms in todo:
        for n in args.world_size:
            print(f"\n# {collective} on {n} ranks" + (f", root {args.root}" if collective in ROOTED else "")
                  + f" (busbw = algbw x {busbw_factor(collective, n):.3g})")
            print(f"{'size':>10} {'count':>12} {'type':>8}  {'algorithm':<22} {'time(us)':>12} {'algbw(GB/s)':>12} "
                  f"{'busbw(GB/s)':>12} {'msgs/rank':>10} {'bytes/rank':>12}")
            for size in points:
                results = []
                for name, fn in algorithms:
                    try:
                        if not traced:
                            with observers.trace() as records:
                                r = simulate(collective, fn, n, size, spec, args.root, device, dtype)
                            from ..tools import perfetto
                            perfetto.export_chrome_trace(records, args.trace)
                            traced = True
                        else:
                            r = simulate(collective, fn, n, size, spec, args.root, device, dtype)
                    except Deadlock as exc:
                        print(f"collectives.sim: {collective}/{name} on {n} ranks, {human(size)}: {exc}",
                              file=sys.stderr)
                        return 3
                    except SimulationError as exc:
                        print(f"collectives.sim: {collective}/{name} on {n} ranks, {human(size)}: {exc}",
                              file=sys.stderr)
                        return 1
                    r.algorithm = name
                    results.append(r)
                    rows.append(r.row())
                    print(f"{human(r.bytes):>10} {elements(collective, size, n, item):>12} {args.datatype:>8}  "
                          f"{name:<22} {r.time * 1e6:>12.2f} {r.algbw / 1e9:>12.3f} {r.busbw / 1e9:>12.3f} "
                          f"{r.max_messages_sent:>10} {r.max_bytes_sent:>12}")
                    if r.wrong is not None:
                        rank, out, j, got, want = r.wrong
                        what = f"element {j} is {got}, expected {want}" if j is not None else \
                            f"shape {got}, expected {want}"
                        print(f"collectives.sim: WRONG RESULT: {collective}/{name} on {n} ranks, {human(size)}: "
                              f"rank {rank}, output {out}: {what}", file=sys.stderr)
                        return 1
                if len(results) > 1:
                    best = min(results, key=lambda x: x.time)
                    print(f"{'':>10} {'':>12} {'':>8}  fastest: {best.algorithm}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
        print(f"\n# wrote {len(rows)} rows to {args.json}")
    if args.trace:
        print(f"# wrote a Perfetto trace of {todo[0][0]}/{todo[0][1][0][0]} on {args.world_size[0]} ranks, "
              f"{human(points[0])} to {args.trace} (simulated time; open it in ui.perfetto.dev)")
    if args.check:
        print("# every rank's result equals the closed form")
    if args.html:   # --html: collectives.viz draws the first point (sizes aside: it picks its own)
        from .. import viz
        c, (name, fn) = todo[0][0], todo[0][1][0]
        viz.page(c, fn, args.world_size[0], path=args.html, topology=spec, root=args.root)
        print(f"# wrote {args.html}: {c}/{name} on {args.world_size[0]} ranks, drawn by collectives.viz")
    return 0
