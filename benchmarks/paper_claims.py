"""The papers' claims, shown by the simulator (issue 34, item 6): Swing so far.

Swing (De Sensi et al., NSDI'24, arXiv 2401.09356) claims up to 3x over existing
all_reduces on tori. Here: simulated all_reduce time on a 2-D torus (the ``torus``
preset, dimension-ordered routes) of Swing (the bandwidth variant: reduce-scatter +
all-gather over Swing's peers) against recursive doubling (whole tensor every step),
Rabenseifner (Swing's bytes and steps, recursive halving's long hops) and the ring
(fewest bytes, 2(N-1) steps), with ratios measured in the same run. The issue's
goals: >= 1.5x over recursive doubling at 1-16 MiB, never slower than the ring at
<= 64 KiB.

    python -m benchmarks.paper_claims [--dims 8x8] [-s 4K,64K,1M,4M,16M]
"""
import argparse

from collectives.sim import simulate
from collectives.sim.topology import torus
from collectives.tools.sizes import parse_size


def swing_on_torus(dims, sizes):
    topo = torus(dims)
    n = 1
    for d in dims:
        n *= d
    print(f"all_reduce on torus {'x'.join(map(str, dims))} ({n} ranks), simulated time in us")
    print(f"{'size':>8} {'swing':>10} {'rec_doubl':>10} {'rabenseif':>10} {'ring':>10} "
          f"{'rd/swing':>9} {'rab/swing':>9} {'ring/swing':>10}")
    for s in sizes:
        t = {a: simulate("all_reduce", a, n, s, topo).time * 1e6
             for a in ("swing", "recursive_doubling", "rabenseifner", "ring")}
        # a 0-byte call moves nothing and takes no time: no ratio to show
        rd, rab, ring = ((f"{t[a] / t['swing']:.2f}" if t["swing"] else "-")
                         for a in ("recursive_doubling", "rabenseifner", "ring"))
        print(f"{s:>8} {t['swing']:>10.1f} {t['recursive_doubling']:>10.1f} {t['rabenseifner']:>10.1f} "
              f"{t['ring']:>10.1f} {rd:>9} {rab:>9} {ring:>10}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dims", default="8x8")
    p.add_argument("-s", "--sizes", default="1K,4K,64K,1M,4M,16M")
    a = p.parse_args(argv)
    swing_on_torus([int(d) for d in a.dims.split("x")], [parse_size(x) for x in a.sizes.split(",")])


if __name__ == "__main__":
    main()
