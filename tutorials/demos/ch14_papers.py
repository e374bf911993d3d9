"""Chapter 14: the newest algorithms on the networks they were made for, simulated.

    python -m tutorials.demos.ch14_papers

No processes: the simulator runs each algorithm, unchanged, on the network its paper
was written for, with the functions of ``benchmarks/paper_claims.py`` and fewer
sizes, ranks and roots, so that it ends in seconds. ``python -m
benchmarks.paper_claims --claim swing`` (``pat``, ``bine``) gives each full sweep.
"""
from benchmarks import paper_claims


def main():
    print("1. Swing (NSDI'24) on a 2-D torus: all_reduce, Swing against recursive doubling and the ring\n")
    paper_claims.swing_on_torus([8, 8], [64 << 10, 1 << 20, 16 << 20], ("recursive_doubling", "ring"))

    print("\n2. PAT (2025) at one rank per node: all_gather, PAT against the ring\n")
    paper_claims.pat_vs_ring(32, [1 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20], ["ethernet-100g"])

    print("\n3. Bine trees (SC'25) on a Dragonfly: bytes over the links between groups, every root\n")
    paper_claims.bine_on_dragonfly(32, 1 << 20, range(32), routers=2, cases=("broadcast", "gather"))


if __name__ == "__main__":
    main()
