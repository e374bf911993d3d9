"""Chapter 14: one slow rank, one late rank, noisy messages, a slow NIC, simulated on 32 ranks.

    python -m tutorials.demos.ch14_stragglers

The functions of ``benchmarks/sim_stragglers.py`` at one scale (32 ranks) on the flat
100 GbE switch, the first three at one size (4 KiB), the slow NIC at 4 KiB and 16 MiB (it
slows bytes, so a small call does not show it), so that it ends in seconds; ``python -m
benchmarks.sim_stragglers`` runs all four at 16 and 64 ranks, 4 KiB and 16 MiB.
"""
from benchmarks import sim_stragglers
from collectives.sim import topology


def main():
    spec = topology.load("ethernet-100g")
    sim_stragglers.slow_rank([32], [4 << 10], spec)
    sim_stragglers.late_rank([32], [4 << 10], spec)
    sim_stragglers.jitter([32], [4 << 10], spec, 0.1 * spec["alpha"])
    sim_stragglers.slow_nic([32], [4 << 10, 16 << 20], spec)


if __name__ == "__main__":
    main()
