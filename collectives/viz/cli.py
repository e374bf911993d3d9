"""``python -m collectives.viz``: write the page of one run (or every page of the course).

Usage::

    python -m collectives.viz all_reduce ring -n 8 -o ring8.html
    python -m collectives.viz all_reduce --function mine.py:all_reduce -n 4 -o mine.html
    python -m collectives.viz pipeline 1f1b -n 4 --micro-batches 8 -o 1f1b.html
    python -m collectives.viz fsdp -n 4 -o fsdp.html       # also moe, ring_attention
    python -m collectives.viz --all -n 2,5,8 -o pages/      # every algorithm at each N, written
    python -m collectives.viz --all -n 2-64                 # every page drawn and checked, none written
    python -m collectives.viz --all all_reduce ring -n 2-64 # one algorithm's pages, checked
    python -m collectives.viz all_reduce --function mine.py:all_reduce --torch -n 4   # torch's API, real
    python -m collectives.viz all_reduce ring -n 4 --real  # a real run: 4 gloo processes, measured time
    python -m collectives.viz all_reduce --function mine.py:all_reduce -n 4 --real   # yours, for real

Exit status (as ``python -m collectives.sim``'s): 0; 1 for a wrong result and 3 for a deadlock,
each drawn (the page is the report; its path and the finding are printed); 2 for bad input (an
unknown algorithm, N < 1, a run too large to draw), said in one line and nothing written. A
``--real`` run whose ranks wait at the door for ``--hang-seconds`` is drawn as a deadlock (3: the
wait-for cycle of the messages each rank waited for); one whose rank fails otherwise, or whose
world is killed at its timeout, exits 1 with the launcher's verdict, nothing written.
"""
import argparse
import sys
from pathlib import Path

from ..algorithms import REGISTRY
from . import check, model, record, render, schedules


def parser():
    p = argparse.ArgumentParser(prog="python -m collectives.viz", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", nargs="?", help="a collective, or pipeline, fsdp, moe, ring_attention")
    p.add_argument("algorithm", nargs="?", default=None,
                   help="the algorithm (default: the collective's first); for pipeline: gpipe or 1f1b")
    p.add_argument("-n", "--world-size", default="4",
                   help="ranks (stages for pipeline); with --all a list of sizes and ranges: 2,5,8 or 2-64")
    p.add_argument("-o", "--output", default=None,
                   help="the HTML file (with --all a folder; without it --all writes nothing, only checks)")
    p.add_argument("--function", default=None, metavar="FILE.py:NAME", help="draw your own algorithm")
    p.add_argument("--topology", default="ethernet-100g", help="ethernet-100g, h100-cluster, fat-tree or a JSON file")
    p.add_argument("--root", type=int, default=0)
    p.add_argument("--micro-batches", type=int, default=8, help="pipeline: micro-batches (default 8)")
    p.add_argument("--real", action="store_true",
                   help="run the algorithm (registered, or yours with --function) in real processes (gloo, one "
                        "host, N <= 15) instead of the simulator: the page's messages and times are measured")
    p.add_argument("--torch", action="store_true",
                   help="with --function: your function is written against torch's API (all_reduce(tensor, "
                        "group=None) with torch.distributed's isend, irecv, ...), as the course's exercises are; it runs in "
                        "real processes, its point-to-point calls through our door (implies --real)")
    p.add_argument("--hang-seconds", type=float, default=record.REAL_HANG,
                   help=f"--real: seconds a rank waits for one message before the run is drawn as hung "
                        f"(default {record.REAL_HANG:g})")
    p.add_argument("--all", action="store_true",
                   help="every algorithm of every collective and every parallelism's schedule (or those of the one "
                        "named; a pipeline of N stages runs max(4, N) micro-batches) at each --world-size, each page "
                        "checked (at most 2 MB, ended right, its counters equal to count_traffic's); prints the "
                        "count, the slowest and the largest page and the total time; exit 1 if a page fails")
    return p


def build(args, n):
    if args.torch and not args.function:
        raise ValueError("--torch says how your --function is written; give --function FILE.py:NAME too")
    args.real = args.real or args.torch
    if args.real and args.what not in REGISTRY:
        raise ValueError(f"--real draws one collective call ({', '.join(REGISTRY)}), not {args.what!r}")
    if args.what == "pipeline":
        return schedules.pipeline(n, args.micro_batches, args.algorithm or "1f1b")
    if args.what in schedules.PARALLELISMS:
        return schedules.PARALLELISMS[args.what](n, topology=args.topology)
    if args.what not in REGISTRY:
        raise ValueError(f"unknown collective {args.what!r}; known: {', '.join(REGISTRY)}, pipeline, "
                         f"{', '.join(schedules.PARALLELISMS)}")
    algorithm = args.algorithm or next(iter(REGISTRY[args.what]))
    if args.function:
        from ..sim.cli import load_function
        algorithm = load_function(args.function, args.what, api="torch" if args.torch else "door")
    if args.real:
        return model.build(record.record_real(args.what, algorithm, n, args.root, hang=args.hang_seconds,
                                              calls="torch" if args.torch else "door"))
    return model.build(record.record(args.what, algorithm, n, args.topology, args.root))


def report(d, path):
    line = f"wrote {path} ({Path(path).stat().st_size} bytes): {d['title']}"
    if d.get("failure"):
        line += "\n  " + d["failure"]["report"].replace("\n", "\n  ")
    if d.get("wrong"):
        line += f"\n  WRONG RESULT: {d['wrong']['text']}"
    print(line)


def sizes_of(text):
    """The world sizes of ``-n``: ``4``, ``2,5,8``, ``2-64`` or a mix (``2-8,16``)."""
    sizes = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        lo, dash, hi = part.partition("-")
        if dash and lo.strip():
            lo, hi = int(lo), int(hi)
            if hi < lo:
                raise ValueError(f"the range {part!r} runs backwards")
            sizes += range(lo, hi + 1)
        else:
            sizes.append(int(part))
    return sizes


def main(argv=None):
    args = parser().parse_args(argv)
    try:
        sizes = sizes_of(args.world_size)
    except ValueError as exc:
        print(f"collectives.viz: -n takes whole numbers and ranges (2,5,8 or 2-64), got {args.world_size!r} "
              f"({exc})", file=sys.stderr)
        return 2
    if not sizes or any(n < 1 for n in sizes):
        print(f"collectives.viz: -n must be 1 or more, got {args.world_size!r}", file=sys.stderr)
        return 2
    try:
        if args.all and args.real:
            raise ValueError("--real draws one run; --all draws every algorithm on the simulator")
        if args.all:
            kinds = {**REGISTRY, **check.PARALLEL}
            if args.what is not None and args.what not in kinds:
                raise ValueError(f"--all draws collectives and parallelisms ({', '.join(kinds)}), not {args.what!r}")
            if args.algorithm is not None and args.algorithm not in kinds[args.what]:
                raise ValueError(f"unknown algorithm {args.algorithm!r} for {args.what}; known: "
                                 f"{', '.join(kinds[args.what])}")
            for n in sizes:     # a page too large to draw is refused before any page is drawn
                record._checked_world(n, "all_reduce", 0, record.MAX_RANKS, "too many boxes to draw")
            rows, summary = check.run(sizes, args.what, args.algorithm, args.topology, args.output)
            print(summary)
            return 1 if any(r["problems"] for r in rows) else 0
        if not args.what:
            print("collectives.viz: name a collective (or pipeline, fsdp, moe, ring_attention), or --all",
                  file=sys.stderr)
            return 2
        if len(sizes) != 1:
            print("collectives.viz: one -n for one page (a list only with --all)", file=sys.stderr)
            return 2
        d = build(args, sizes[0])
    except (ValueError, record.TooLarge) as exc:
        print(f"collectives.viz: {exc}", file=sys.stderr)
        return 2
    except (TimeoutError, RuntimeError) as exc:     # a real run killed at its timeout, or whose rank failed
        print(f"collectives.viz: the real run failed, nothing written: {exc}", file=sys.stderr)
        return 1
    path = args.output or f"{args.what}_{d.get('algorithm') or args.algorithm or 'page'}_{sizes[0]}.html"
    render.write(d, path)
    report(d, path)
    return 3 if d.get("failure") and d["failure"]["kind"] == "deadlock" else 1 if d.get("failure") or d.get("wrong") else 0
