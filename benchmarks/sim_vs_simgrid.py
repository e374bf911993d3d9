"""The simulator against a peer: the same message schedules played in SimGrid, times compared.

Usage::

    python -m benchmarks.sim_vs_simgrid                       # N=4..64, flat, fat tree, torus
    python -m benchmarks.sim_vs_simgrid --world-size 8 --topology flat -b 4K -e 4K
    python -m benchmarks.sim_vs_simgrid --world-size 8,16 --topology flat -b 4K -e 16M -f 4096 \
        --case all_reduce/ring,all_reduce/recursive_doubling --straggler 3:2 --slow-link 5:4

For every point (collective/algorithm, topology, N, size) it simulates one call on
``device="meta"`` tensors with ``schedule=True`` (each rank's posts, waits and compute, in
order), hands that schedule, each directed link's capacity and each route's links and latency
to ``benchmarks/simgrid_player.py`` under ``/usr/bin/python3`` (where Debian's
``python3-simgrid``, SimGrid 3.32, imports; pip's ``simgrid`` does not build here), and prints
both completion times and their ratio (ours / SimGrid's). The table also goes to ``--out``
(default ``bench_out/sim_vs_simgrid``) as CSV and JSON. Without SimGrid it prints one line
saying so and exits 0.

Both sides play the alpha-beta model (``"model": "alpha-beta"``: LogGP with g = o = 0, as
SimGrid's network has no per-message gap or CPU overhead): a message costs its route's latency,
then its bytes flow over its links, shared max-min fairly with the other flows (SimGrid's CM02,
cross-traffic off). So the two must agree to rounding wherever ours is right; a ratio away from
1 is a difference of model (or a bug) to explain, never to tune away.

A perturbed world (``--straggler RANK:FACTOR``, ``--straggler RANK:+SECONDS``, ``--slow-link
RANK:FACTOR``, as ``python -m collectives.sim`` takes them; :mod:`collectives.sim.world` defines
them) reaches SimGrid as ours sees it: a slow host's CPU work and a late rank's delay are in
the schedule already (its ``busy`` entries), a slow host's latency factor multiplies the
latency of every route it ends (the larger of the two ends' factors, as ours does; the gap
it would also multiply is 0 in this model), and a slow NIC's links get their divided
capacity (:func:`collectives.sim.world.slowed`). So the two simulators play the same
perturbed world, and a ratio away from 1 there is again a difference of model.

Topologies (ours; SimGrid gets the same links and routes): ``flat`` (ethernet-100g: 10 us,
12.5 GB/s per direction), ``fat-tree`` (ethernet-100g's figures, 4 ranks per leaf, uplinks
oversubscribed 4:1: flows share uplinks) and ``torus`` (Tofu D's figures on a 2-D torus of N
nodes: 2x2 .. 8x8, dimension-ordered routes, 1 us + 0.1 us per hop).
"""
import argparse
import json
import math
import os
import subprocess
import sys
import time

from benchmarks import common
from collectives.sim import simulate
from collectives.sim import topology as topologies
from collectives.sim.cli import check_named_ranks, perturbations, slow_link, straggler
from collectives.sim.world import slowed
from collectives.tools.sizes import human, parse_size, sizes

PYTHON = "/usr/bin/python3"
PLAYER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "simgrid_player.py")
CASES = (("all_reduce", "ring"), ("all_reduce", "recursive_doubling"), ("broadcast", "binomial_tree"),
         ("broadcast", "linear"), ("all_to_all", "linear"))
TOPOLOGIES = ("flat", "fat-tree", "torus")


def available(python=PYTHON):
    """(True, version) where ``python`` imports SimGrid, else (False, why not)."""
    try:
        out = subprocess.run([python, "-c", "import simgrid; print(simgrid.simgrid_version)"],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"{python}: {exc}"
    if out.returncode:
        return False, f"{python} cannot import simgrid (apt-get install python3-simgrid)"
    return True, out.stdout.strip()


def torus_dims(n):
    """The squarest 2-D torus of n nodes (n = a x b, a >= b)."""
    b = max(d for d in range(1, int(math.isqrt(n)) + 1) if n % d == 0)
    return [n // b, b]


def spec_for(name, n):
    """Our topology ``name`` for n ranks, in the alpha-beta model both simulators share."""
    if name == "flat":
        spec = dict(topologies.PRESETS["ethernet-100g"], name="flat")
    elif name == "fat-tree":
        spec = dict(topologies.PRESETS["fat-tree"], ranks_per_leaf=4, name="fat-tree")
    elif name == "torus":
        spec = topologies.torus(torus_dims(n))
    else:
        raise ValueError(f"unknown topology {name!r}; known: {', '.join(TOPOLOGIES)}")
    return topologies.validate(dict(spec, model="alpha-beta"))


def job(spec, n, schedule, stragglers=None, slow_links=None):
    """What the player needs: link capacities, the routes the schedule uses, the schedule; a
    slow NIC's links divided (``slow_links``), a slow host's routes' latency multiplied by the
    larger of the two ends' factors (``stragglers``), as :meth:`World._match` does."""
    fabric = topologies.build(spec, n)
    slow = stragglers or {}
    pairs = sorted({(r, peer) for r, ops in enumerate(schedule) for op in ops if op[0] == "post"
                    for kind, peer, _, _ in op[1] if kind == "send"})
    routes = []
    for src, dst in pairs:
        links, alpha = fabric.route(src, dst)
        if slow:
            alpha *= max(float(slow.get(src, 1.0)), float(slow.get(dst, 1.0)))
        routes.append([src, dst, alpha, list(links)])
    return {"links": list(slowed(fabric, slow_links)), "routes": routes, "schedule": schedule}


def play(spec, n, schedule, python=PYTHON, timeout=600, stragglers=None, slow_links=None):
    """Each rank's end time in SimGrid for ``schedule`` on ``spec`` (perturbed as ``job`` says)."""
    out = subprocess.run([python, PLAYER], input=json.dumps(job(spec, n, schedule, stragglers, slow_links)),
                         capture_output=True, text=True, timeout=timeout)
    if out.returncode:
        raise RuntimeError(f"simgrid_player failed ({out.returncode}): {out.stderr.strip()[-2000:]}")
    return json.loads(out.stdout)["ranks"]


def compare(collective, algorithm, topology, n, nbytes, python=PYTHON, stragglers=None, delays=None,
            slow_links=None):
    """One point: a row with our time, SimGrid's and the worst per-rank ratio."""
    spec = spec_for(topology, n)
    t0 = time.process_time()
    r = simulate(collective, algorithm, n, nbytes, spec, schedule=True, stragglers=stragglers, delays=delays,
                 slow_links=slow_links)
    ours_cpu = time.process_time() - t0
    ours = [x["time"] for x in r.ranks]
    t0 = time.perf_counter()
    theirs = play(spec, n, r.schedule, python, stragglers=stragglers, slow_links=slow_links)
    theirs_wall = time.perf_counter() - t0
    worst = max(abs(a / b - 1) if b > 0 else abs(a - b) for a, b in zip(ours, theirs))
    return {"collective": collective, "algorithm": algorithm, "topology": topology, "world_size": n,
            "bytes": r.bytes, "ours_us": max(ours) * 1e6, "simgrid_us": max(theirs) * 1e6,
            "ratio": max(ours) / max(theirs) if max(theirs) > 0 else 1.0, "worst_rank_error": worst,
            "ours_cpu_s": ours_cpu, "simgrid_wall_s": theirs_wall}


def parser():
    p = argparse.ArgumentParser(prog="python -m benchmarks.sim_vs_simgrid", description=__doc__.split("\n")[0])
    p.add_argument("--world-size", type=common.whole_list(1), default=[4, 8, 16, 32, 64])
    p.add_argument("--topology", default=",".join(TOPOLOGIES), help=f"some of {', '.join(TOPOLOGIES)}")
    p.add_argument("--case", default=",".join(f"{c}/{a}" for c, a in CASES),
                   help="collective/algorithm, comma-separated")
    p.add_argument("-b", "--minbytes", type=parse_size, default=parse_size("4K"))
    p.add_argument("-e", "--maxbytes", type=parse_size, default=parse_size("4M"))
    p.add_argument("-f", "--stepfactor", type=int, default=1024)
    p.add_argument("--straggler", type=straggler, action="append", default=[], metavar="RANK:FACTOR",
                   help="that rank a host FACTOR times slower (RANK:+SECONDS: that many seconds late), "
                        "in both simulators; repeatable")
    p.add_argument("--slow-link", type=slow_link, action="append", default=[], metavar="RANK:FACTOR",
                   help="that rank's links at 1/FACTOR of their bandwidth, in both simulators; repeatable")
    p.add_argument("--python", default=PYTHON, help="the python that imports simgrid (default /usr/bin/python3)")
    p.add_argument("--out", default=os.path.join(common.OUT_DIR, "sim_vs_simgrid"))
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    tops = [t.strip() for t in args.topology.split(",") if t.strip()]
    cases = [tuple(c.strip().split("/", 1)) for c in args.case.split(",") if c.strip()]
    for t in tops:
        if t not in TOPOLOGIES:
            print(f"sim_vs_simgrid: unknown topology {t!r}; known: {', '.join(TOPOLOGIES)}", file=sys.stderr)
            return 2
    if any(len(c) != 2 for c in cases):
        print("sim_vs_simgrid: --case takes collective/algorithm, e.g. all_reduce/ring", file=sys.stderr)
        return 2
    try:
        check_named_ranks(args, min(args.world_size))
    except ValueError as exc:
        print(f"sim_vs_simgrid: {exc}", file=sys.stderr)
        return 2
    noise = perturbations(args)
    perturbed = ", ".join([f"rank {r} a {x:g}x slower host" for r, x in (noise["stragglers"] or {}).items()]
                          + [f"rank {r} {x * 1e6:g} us late" for r, x in (noise["delays"] or {}).items()]
                          + [f"rank {r}'s links at 1/{x:g} of their bandwidth"
                             for r, x in (noise["slow_links"] or {}).items()])
    ok, version = available(args.python)
    if not ok:
        print(f"sim_vs_simgrid: skipped: {version}")
        return 0
    points = sizes(args.minbytes, args.maxbytes, args.stepfactor, args.minbytes)
    print(f"# sim_vs_simgrid: collectives.sim against SimGrid {version} (CM02 max-min, no cross-traffic), "
          f"alpha-beta model on both; load average {os.getloadavg()[0]:.1f}"
          + (f"; perturbed: {perturbed}" if perturbed else ""))
    print(f"{'case':<30} {'topology':<9} {'N':>4} {'size':>7} {'ours(us)':>12} {'simgrid(us)':>12} "
          f"{'ratio':>9} {'worst rank':>11}")
    rows = []
    for collective, algorithm in cases:
        for topology in tops:
            for n in args.world_size:
                for nbytes in points:
                    row = compare(collective, algorithm, topology, n, nbytes, args.python, **noise)
                    rows.append(row)
                    print(f"{collective + '/' + algorithm:<30} {topology:<9} {n:>4} {human(row['bytes']):>7} "
                          f"{row['ours_us']:>12.3f} {row['simgrid_us']:>12.3f} {row['ratio']:>9.6f} "
                          f"{row['worst_rank_error']:>11.2e}", flush=True)
    ratios = [r["ratio"] for r in rows]
    worst = max(r["worst_rank_error"] for r in rows)
    print(f"\nsim_vs_simgrid: {len(rows)} points, ratio ours/SimGrid {min(ratios):.6f} .. {max(ratios):.6f}, "
          f"worst per-rank |error| {worst:.2e}")
    common.write_rows(args.out, "sim_vs_simgrid", rows, {"simgrid": version, "perturbed": perturbed,
                                                         **{k: {str(r): x for r, x in v.items()}
                                                            for k, v in noise.items() if v}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
