"""Chapter 14: a thousand ranks on a laptop. The course's all-reduce algorithms, unchanged,
on simulated networks of 8 to 4,096 ranks.

    python -m tutorials.demos.ch14_sim

1. A small all_reduce (4 KiB) at four scales, on a flat 100 GbE switch and on H100
   nodes (NVLink inside a node, a 400 Gb/s NIC per GPU between nodes): latency rules.
2. A large one (64 MiB) on the flat switch and on a two-level fat tree whose uplinks
   are oversubscribed 4:1: bandwidth rules, and where the bytes go starts to matter.
3. The crossover: from which size on the ring beats the tree, at each scale.
4. Why: the ring's 2(N-1) steps, each paying the latency alpha.

Everything runs in this one process (``collectives.sim``: a coroutine per rank,
``device="meta"`` tensors, no data). The ring's 2N(N-1) messages make it the one slow
algorithm to simulate, so beyond RING_SIMULATED ranks its time comes from its card's
alpha-beta-gamma formula over its slowest hop, which the test suite holds equal to the
simulator wherever each step waits for the one before (tests/test_sim.py).
"""
from collectives.sim import simulate, topology

ALGORITHMS = ["ring", "tree", "recursive_doubling", "rabenseifner"]
SHORT = {"ring": "ring", "tree": "tree", "recursive_doubling": "rec.doubling", "rabenseifner": "rabenseifner"}
RANKS = [8, 64, 512, 4096]
RING_SIMULATED = 64


def ring_formula(spec, n, size):
    """The ring's card: 2(N-1) steps of alpha + (S/N) beta, and (N-1) S/N bytes reduced. Every
    step waits for its slowest hop: the network, once the ring leaves a node."""
    one_node = spec["kind"] == "nodes" and n <= spec["ranks_per_node"]
    alpha = spec["intra_alpha"] if one_node else spec["alpha"]
    bandwidth = spec["intra_bandwidth"] if one_node else spec["bandwidth"]
    return 2 * (n - 1) * (alpha + size / n / bandwidth) + (n - 1) * size / n * spec["gamma"]


def time_of(algorithm, n, size, spec):
    """(seconds, mark): simulated, or (the ring at scale) by the formula, marked *."""
    if algorithm == "ring" and n > RING_SIMULATED:
        return ring_formula(spec, n, size), "*"
    return simulate("all_reduce", algorithm, n, size, topology=spec).time, " "


def us(seconds):
    return f"{seconds * 1e6:,.0f} us" if seconds < 0.1 else f"{seconds * 1e3:,.1f} ms"


def table(name, size, ranks):
    spec = topology.load(name)
    print(f"\nall_reduce of {human(size)} on {topology.describe(spec)}")
    print(f"{'ranks':>7}" + "".join(f"{SHORT[a]:>15}" for a in ALGORITHMS) + "   fastest")
    for n in ranks:
        times = {a: time_of(a, n, size, spec) for a in ALGORITHMS}
        best = min(times, key=lambda a: times[a][0])
        print(f"{n:>7}" + "".join(f"{us(t) + how:>15}" for t, how in times.values()) + f"   {best}")


def crossover(name, n):
    """The smallest size (powers of 4 from 4 KiB to 4 GiB) at which the ring beats the tree."""
    spec = topology.load(name)
    size = 4 << 10
    while size <= 4 << 30:
        if time_of("ring", n, size, spec)[0] < time_of("tree", n, size, spec)[0]:
            return size
        size *= 4
    return None


def human(nbytes):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def main():
    print("1. Small messages: latency rules (* = the ring by its formula)")
    for name in ("ethernet-100g", "h100-cluster"):
        table(name, 4 << 10, RANKS)

    print("\n2. Large messages: bandwidth rules, and the topology starts to matter")
    for name in ("ethernet-100g", "fat-tree"):
        table(name, 64 << 20, RANKS[:3])

    print("\n3. The latency/bandwidth crossover: the smallest size at which the ring beats the tree")
    for name in ("ethernet-100g", "h100-cluster"):
        print(f"  {name:>13}: " + ", ".join(f"{n} ranks {human(s) if s else 'never'}"
                                           for n in RANKS for s in [crossover(name, n)]))

    print("\n4. Why: the ring pays alpha 2(N-1) times, the tree 2 log2(N) times")
    spec = topology.load("ethernet-100g")
    for n in RANKS:
        ring, tree = 2 * (n - 1), 2 * (n.bit_length() - 1)
        print(f"  {n:>5} ranks: ring {ring:>5} steps x {spec['alpha'] * 1e6:.0f} us = {us(ring * spec['alpha']):>9}; "
              f"tree {tree:>2} steps = {us(tree * spec['alpha'])}")


if __name__ == "__main__":
    main()
