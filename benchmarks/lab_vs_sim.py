"""The simulator checked against real links: a lab sweep's points, simulated with the lab's topology.

Usage::

    python -m benchmarks.sweep --lab hosts=4,rate=1gbit --collective all_reduce --world-size 4 \\
        -b 64K -e 64M --model --out bench_out/lab
    python -m benchmarks.lab_vs_sim bench_out/lab/results.json

It reads a sweep made with ``--lab`` (and ``--model``, so that alpha and gamma come from
point-to-point measured in the same lab run), lays the lab out as a topology for
``collectives.sim`` (one rank per host: a flat switch at the link's TCP goodput, 1448/1514 of
its rate; L ranks per host:
nodes of L ranks sharing one link, loopback inside at the measured point-to-point rate),
simulates every row of our algorithms, and prints measured against simulated time and the
median |error| over sizes of 1 MiB and more (the issue's goal: at most 10%).

Rows of the built-in and of ``algorithm=None`` (``default``, ``default_again``) are
skipped: only registered algorithms can be simulated. Interleaved placements and uneven
hosts are refused: the simulator's nodes hold consecutive ranks, equally many each.
"""
import argparse
import json
import statistics
import sys

from benchmarks import common
from collectives import sim
from collectives.algorithms import ALGORITHMS

GOODPUT = 1448 / 1514


def topology(meta, world_size):
    """The lab of ``meta`` (a sweep's metadata) as a ``collectives.sim`` topology dict for ``world_size`` ranks."""
    from collectives.tools.lab import parse_lab
    spec = parse_lab(meta["lab"])
    layout = spec.layout(world_size)
    per = layout.count(0)
    if spec.placement != "by-host" or any(layout.count(h) != per for h in range(spec.hosts)):
        raise ValueError(f"lab {spec} on {world_size} ranks: the simulator's nodes hold equally many "
                         f"consecutive ranks; simulate only by-host placements of even hosts")
    fit = (meta.get("model") or {}).get(str(world_size)) or (meta.get("model") or {}).get(world_size)
    if not fit:
        raise ValueError("the sweep has no fitted model for this world: run it with --model")
    # tbf counts whole Ethernet frames: of a 1514-byte frame, TCP carries 1448 bytes of data
    # (1500 MTU less 20 IP, 20 TCP and 12 timestamp bytes), so data moves at 95.6% of the rate.
    link = spec.rate / 8 * GOODPUT
    cores = meta.get("cores")
    common_fields = {"alpha": fit["alpha"], "bandwidth": link, "gamma": fit["gamma"],
                     "name": f"lab {spec}", "source": f"measured in the lab sweep of {meta.get('date_utc')}"}
    if cores and world_size > cores:
        common_fields["cores"] = cores     # every lab host is a namespace of the same machine
    if per == 1:
        return {"kind": "flat", **common_fields}
    # Ranks 0 and 1 share host 0 here: the fitted point-to-point figures are the loopback's.
    return {"kind": "nodes", "ranks_per_node": per, "nic": "node", "intra_alpha": fit["alpha"],
            "intra_bandwidth": 1 / fit["beta"], **common_fields}


def compare(results, min_size=1 << 20):
    """Rows of (collective, N, algorithm, size, measured us, simulated us, error) and the
    median |error| over sizes >= ``min_size``."""
    meta, rows = results["meta"], results["rows"]
    out = []
    for r in rows:
        if r["algorithm"] not in ALGORITHMS.get(r["collective"], ()):
            continue
        topo = topology(meta, r["world_size"])
        t = sim.simulate(r["collective"], r["algorithm"], r["world_size"], r["size"], topology=topo).time
        measured = r["time_us"] * 1e-6
        out.append((r["collective"], r["world_size"], r["algorithm"], r["size"], measured * 1e6,
                    t * 1e6, (t - measured) / measured))
    big = [abs(e) for *_, size, _, _, e in out if size >= min_size]
    return out, statistics.median(big) if big else None


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.lab_vs_sim", description=__doc__.split("\n")[0])
    p.add_argument("results", help="results.json of a `benchmarks.sweep --lab ... --model` run")
    args = p.parse_args(argv)
    with open(args.results) as f:
        results = json.load(f)
    if not results["meta"].get("lab"):
        p.error(f"{args.results} was not measured in a lab (run the sweep with --lab)")
    try:
        rows, median = compare(results)
    except ValueError as exc:
        p.error(str(exc))
    print(f"#{'collective':>11} {'N':>3} {'algorithm':>16} {'size':>6} {'measured(us)':>13} "
          f"{'simulated(us)':>14} {'error':>7}")
    for c, n, a, size, m, s, e in rows:
        print(f" {c:>11} {n:>3} {a:>16} {common.human(size):>6} {m:>13.1f} {s:>14.1f} {e:>+7.1%}")
    if median is not None:
        print(f"# median |error| for sizes >= 1M: {median:.1%} (goal: <= 10%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
