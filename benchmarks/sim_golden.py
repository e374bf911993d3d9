"""The simulator's results on a fixed set of points, to check that a change to its mechanism
(speed, memory) leaves every simulated figure exactly as it was.

Usage::

    python -m benchmarks.sim_golden record /tmp/before.json     # before the change
    python -m benchmarks.sim_golden compare /tmp/before.json    # after it: bit-equal, or a list
    python -m benchmarks.sim_golden digest --quick              # the one line tests/test_sim_golden.py keeps

Each point is simulated and its whole result kept: the time, every rank's counts and end time,
the bytes per link class, the schedule (where asked) and every traced message's start and end;
floats are kept as ``float.hex``, so that equal means bit-equal. ``--quick`` takes the subset
that ``tests/test_sim_golden.py`` runs (481 points, about 12 s of CPU; all of them, 2,109
points, take about 5 minutes). A point that raises is kept as its error.

The test keeps only the digest of the quick subset (its record is 5 MB): where it fails, record
both sides with this script (``git stash``, record, ``git stash pop``, compare) to see which
points moved. A change to an algorithm's messages moves them too; then the digest is renewed.
"""
import argparse
import hashlib
import json
import sys

from collectives import observers
from collectives.algorithms import REGISTRY
from collectives.sim import simulate

# a machine with every CPU figure the model has (python aside: it charges host time, which
# varies), so that cores, wake-ups, switches, overheads, gaps and memory work all take part
BUSY = {"kind": "flat", "name": "busy", "alpha": 3e-6, "bandwidth": 5e9, "gamma": 2e-10,
        "cores": 2, "wake": 4e-6, "switch": 2e-6, "call": 20e-6, "overhead": 1.5e-6,
        "copy": 1e-10, "alloc": 3e-10, "host_bandwidth": 8e9, "gap": 5e-6}
NOISE = {"stragglers": {1: 2.5}, "delays": {0: 7e-6}, "jitter": 2e-6, "seed": 3, "slow_links": {2: 4}}


def topology_for(name, n):
    if name == "torus":
        return f"torus-{n}x1" if n < 4 or n % 2 else f"torus-{n // 2}x2"
    return BUSY if name == "busy" else name


def points(quick=False):
    """(collective, algorithm, n, nbytes, topology name, options) of every point."""
    sizes = (0, 4096, 1 << 20)
    ns = (1, 2, 3, 5, 8, 16, 64)
    for collective, algorithms in REGISTRY.items():
        for algorithm in algorithms:
            for n in ((2, 5, 8) if quick else ns):
                for size in ((4096,) if quick else sizes):
                    yield collective, algorithm, n, size, "ethernet-100g", {}
            for topology in ("h100-cluster", "fat-tree", "torus", "busy"):
                for n in ((5, 16) if quick else (3, 8, 16, 64)):
                    for size in ((1 << 20,) if quick else (4096, 1 << 20)):
                        yield collective, algorithm, n, size, topology, {}
            for n in ((5,) if quick else (5, 16)):
                yield collective, algorithm, n, 1 << 20, "fat-tree", NOISE
                yield collective, algorithm, n, 1 << 20, "busy", dict(NOISE, calls=2, schedule=True)


def h(x):
    return float(x).hex()


def record(collective, algorithm, n, size, topology, options):
    try:
        with observers.trace() as t:
            r = simulate(collective, algorithm, n, size, topology=topology_for(topology, n), **options)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"time": h(r.time), "bytes": r.bytes,
            "ranks": [{k: (h(v) if isinstance(v, float) else v) for k, v in x.items()} for x in r.ranks],
            "link_bytes": r.link_bytes, "schedule": r.schedule,
            "messages": [(m.kind, m.src, m.dst, m.step, m.nbytes, h(m.start), h(m.end), m.link_bytes)
                         for m in t.messages],
            "calls": [(c.rank, h(c.end)) for c in t.calls]}


def key(point):
    collective, algorithm, n, size, topology, options = point
    return f"{collective}/{algorithm} n={n} {size}B {topology} {json.dumps(options, sort_keys=True)}"


def results(quick=False):
    # through JSON and back, so that a fresh run compares equal to a recorded one
    return json.loads(json.dumps({key(p): record(*p) for p in points(quick)}))


def digest(got):
    """sha256 of the results, keys sorted: equal for bit-equal results."""
    return hashlib.sha256(json.dumps(got, sort_keys=True).encode()).hexdigest()


def differences(want, got):
    """The keys whose results differ, or that one side lacks."""
    return sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.sim_golden", description=__doc__.split("\n\n")[0])
    p.add_argument("action", choices=("record", "compare", "digest"))
    p.add_argument("path", nargs="?")
    p.add_argument("--quick", action="store_true", help="the subset tests/test_sim_golden.py runs")
    args = p.parse_args(argv)
    if args.action != "digest" and not args.path:
        p.error(f"{args.action} needs a path")
    got = results(args.quick)
    if args.action == "digest":
        print(digest(got))
        return 0
    if args.action == "record":
        with open(args.path, "w") as f:
            json.dump(got, f)
        print(f"sim_golden: {len(got)} points recorded in {args.path}")
        return 0
    with open(args.path) as f:
        want = json.load(f)
    diff = differences(want, got)
    for k in diff[:20]:
        print("differs:", k)
    print(f"sim_golden: {len(got)} points, {len(diff)} differ")
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
