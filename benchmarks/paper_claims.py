"""The papers' claims, shown by the simulator (issue 34, item 6): Swing, Bine, PAT.

Swing (De Sensi et al., NSDI'24, arXiv 2401.09356) claims up to 3x over existing
all_reduces on tori. Here: simulated all_reduce time on a 2-D torus (the ``torus``
preset, dimension-ordered routes) of Swing (the bandwidth variant: reduce-scatter +
all-gather over Swing's peers) against recursive doubling (whole tensor every step),
Rabenseifner (Swing's bytes and steps, recursive halving's long hops) and the ring
(fewest bytes, 2(N-1) steps), with ratios measured in the same run. The issue's
goals: >= 1.5x over recursive doubling at 1-16 MiB, never slower than the ring at
<= 64 KiB.

Bine (De Sensi et al., SC'25, arXiv 2508.17311) claims up to 33% fewer bytes on a
Dragonfly's global links. Here: the bytes the ``dragonfly`` preset's global links
carry (``Result.link_bytes``) for broadcast, reduce, gather and scatter, Bine tree
against the binomial tree, for every root (the issue's goal: >= 25% fewer for broadcast
and reduce); and both trees walked near hops first (the binomial's near-first walk is not a registered
algorithm: a function here), the order in which a public Bine schedule generator walks them.

PAT (Jeaugey 2025, arXiv 2506.20252) is made for one rank per node at scale, where the
ring's N-1 steps cost most. Here: all_gather time, PAT against the ring, one rank per
node (the ``ethernet-100g`` switch and the 4:1 oversubscribed ``fat-tree``), and the
first size at which the ring is at least as fast (the crossover), as the simulator finds it.

    python -m benchmarks.paper_claims [--claim swing,bine,pat] [--dims 8x8] [-s 4K,64K,1M,4M,16M]
        [--bine-routers 8] [--bine-collectives broadcast,gather] [--pat-ranks 128] [--pat-sizes 1K,4M]
"""
import argparse

from collectives.algorithms import broadcast_bine
from collectives.algorithms._util import ceil_log2
from collectives.sim import simulate
from collectives.sim.topology import dragonfly, torus
from collectives.tools.sizes import parse_size


SWING_RIVALS = ("recursive_doubling", "rabenseifner", "ring")
SHORT = {"recursive_doubling": ("rec_doubl", "rd"), "rabenseifner": ("rabenseif", "rab"), "ring": ("ring", "ring")}


def swing_on_torus(dims, sizes, rivals=SWING_RIVALS):
    topo = torus(dims)
    n = 1
    for d in dims:
        n *= d
    print(f"all_reduce on torus {'x'.join(map(str, dims))} ({n} ranks), simulated time in us")
    print(f"{'size':>8} {'swing':>10} " + " ".join(f"{SHORT[a][0]:>10}" for a in rivals) + " "
          + " ".join(f"{SHORT[a][1] + '/swing':>10}" for a in rivals))
    for s in sizes:
        t = {a: simulate("all_reduce", a, n, s, topo).time * 1e6 for a in ("swing",) + tuple(rivals)}
        # a 0-byte call moves nothing and takes no time: no ratio to show
        ratios = ((f"{t[a] / t['swing']:.2f}" if t["swing"] else "-") for a in rivals)
        print(f"{s:>8} {t['swing']:>10.1f} " + " ".join(f"{t[a]:>10.1f}" for a in rivals) + " "
              + " ".join(f"{r:>10}" for r in ratios))


def binomial_near_first(comm, tensor, root):
    """A binomial broadcast walked near hops first (1, 2, 4, ...): the baseline the Bine
    paper compares with; ours (``binomial_tree``) goes far first."""
    n, v = comm.size, (comm.rank - root) % comm.size
    for k in range(ceil_log2(n)):
        d = 1 << k
        if v < d and v + d < n:
            comm.send(tensor, (v + d + root) % n, k)
        elif d <= v < 2 * d:
            comm.recv(tensor, (v - d + root) % n, k)


def bine_near_first(comm, tensor, root):
    """The Bine broadcast walked near hops first, as the schedule generator ``broadcast_bine`` cites does."""
    broadcast_bine.broadcast(comm, tensor, root, far_first=False)


BINE_CASES = {   # name for --bine-collectives: (label, collective, binomial, bine)
    "broadcast": ("broadcast", "broadcast", "binomial_tree", "bine"),
    "reduce": ("reduce", "reduce", "binomial_tree", "bine"),
    "gather": ("gather", "gather", "binomial_tree", "bine"),
    "scatter": ("scatter", "scatter", "binomial_tree", "bine"),
    "near_first": ("broadcast, near first", "broadcast", binomial_near_first, bine_near_first),
}


def bine_on_dragonfly(n, nbytes, roots, routers=8, cases=tuple(BINE_CASES)):
    """Global-link bytes of the rooted collectives, Bine against binomial, over ``roots``,
    on a dragonfly of 4 groups of ``routers`` routers of 4 ranks."""
    topo = dragonfly(routers_per_group=routers)
    print(f"rooted collectives on dragonfly ({topo['groups']} groups of {routers * 4} ranks, {n} ranks), "
          f"{nbytes} bytes, bytes on global links summed over {len(roots)} roots")
    print(f"{'collective':>22} {'binomial':>14} {'bine':>14} {'bine less':>10} {'best root':>10} "
          f"{'worst root':>10}")
    for case in cases:
        label, collective, binomial, bine = BINE_CASES[case]
        per = {a: [simulate(collective, f, n, nbytes, topo, root=r).link_bytes.get("global", 0) for r in roots]
               for a, f in (("binomial_tree", binomial), ("bine", bine))}
        saved = [1 - b / t if t else 0.0 for b, t in zip(per["bine"], per["binomial_tree"])]
        total = {a: sum(v) for a, v in per.items()}
        less = 1 - total["bine"] / total["binomial_tree"] if total["binomial_tree"] else 0.0
        print(f"{label:>22} {total['binomial_tree']:>14} {total['bine']:>14} {less:>9.1%} "
              f"{max(saved):>9.1%} {min(saved):>10.1%}")


def pat_vs_ring(n, sizes, topologies):
    """all_gather time, PAT against the ring, one rank per node; the crossover."""
    for name in topologies:
        print(f"all_gather on {name}, {n} ranks (one per node), simulated time in us")
        print(f"{'size':>10} {'pat':>10} {'ring':>10} {'ring/pat':>9}")
        crossover = None
        for s in sizes:
            t = {a: simulate("all_gather", a, n, s, name).time * 1e6 for a in ("pat", "ring")}
            ratio = t["ring"] / t["pat"] if t["pat"] else float("nan")
            if crossover is None and t["pat"] and ratio <= 1:
                crossover = s
            print(f"{s:>10} {t['pat']:>10.1f} {t['ring']:>10.1f} {ratio:>9.2f}")
        print(f"crossover on {name}: " + (f"the ring is as fast from {crossover} bytes" if crossover
                                           else f"none up to {sizes[-1]} bytes: PAT is faster throughout"))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--claim", default="swing,bine,pat", help="which claims to show (default: all three)")
    p.add_argument("--dims", default="8x8", help="Swing's torus (default 8x8)")
    p.add_argument("-s", "--sizes", default="1K,4K,64K,1M,4M,16M", help="Swing's sizes")
    p.add_argument("--bine-ranks", type=int, default=0,
                   help="Bine's ranks on the dragonfly (default 0: all, 4 groups x 4 x --bine-routers)")
    p.add_argument("--bine-routers", type=int, default=8,
                   help="routers per dragonfly group, 4 ranks each (default 8: 4 groups of 32 ranks)")
    p.add_argument("--bine-collectives", default=",".join(BINE_CASES),
                   help=f"which rooted collectives (default all: {', '.join(BINE_CASES)})")
    p.add_argument("--bine-bytes", default="1M", help="Bine's message size (default 1M)")
    p.add_argument("--bine-roots", type=int, default=0,
                   help="how many roots, spread evenly (default 0: every rank)")
    p.add_argument("--pat-ranks", type=int, default=128, help="PAT's ranks (default 128)")
    p.add_argument("--pat-sizes", default="1K,8K,64K,512K,4M,32M,256M", help="PAT's all_gather sizes")
    p.add_argument("--pat-topologies", default="ethernet-100g,fat-tree", help="PAT's networks")
    a = p.parse_args(argv)
    claims = a.claim.split(",")
    for c in claims:
        if c not in ("swing", "bine", "pat"):
            p.error(f"unknown claim {c!r}; known: swing, bine, pat")
    if "swing" in claims:
        swing_on_torus([int(d) for d in a.dims.split("x")], [parse_size(x) for x in a.sizes.split(",")])
    if "bine" in claims:
        n = a.bine_ranks or 4 * 4 * a.bine_routers
        k = a.bine_roots or n
        cases = a.bine_collectives.split(",")
        for c in cases:
            if c not in BINE_CASES:
                p.error(f"unknown --bine-collectives {c!r}; known: {', '.join(BINE_CASES)}")
        bine_on_dragonfly(n, parse_size(a.bine_bytes), sorted({i * n // k for i in range(k)}),
                          a.bine_routers, cases)
    if "pat" in claims:
        pat_vs_ring(a.pat_ranks, [parse_size(x) for x in a.pat_sizes.split(",")], a.pat_topologies.split(","))


if __name__ == "__main__":
    main()
