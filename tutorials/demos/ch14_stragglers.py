"""Chapter 14: one slow rank, one late rank, noisy messages, simulated on 32 ranks.

    python -m tutorials.demos.ch14_stragglers

The functions of ``benchmarks/sim_stragglers.py`` at one size (4 KiB) and one scale (32
ranks) on the flat 100 GbE switch, so that it ends in seconds; ``python -m
benchmarks.sim_stragglers`` adds 16 ranks and 16 MiB.
"""
from benchmarks import sim_stragglers
from collectives.sim import topology


def main():
    spec = topology.load("ethernet-100g")
    sim_stragglers.slow_rank([32], [4 << 10], spec)
    sim_stragglers.late_rank([32], [4 << 10], spec)
    sim_stragglers.jitter([32], [4 << 10], spec, 0.1 * spec["alpha"])


if __name__ == "__main__":
    main()
