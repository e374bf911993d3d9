"""One slow rank, one late rank, noisy messages: what each does to ring, tree and recursive
doubling all_reduce, simulated.

Usage::

    python -m benchmarks.sim_stragglers                      # 16 and 64 ranks, 4 KiB and 16 MiB
    python -m benchmarks.sim_stragglers --world-size 8,256 --topology h100-cluster

Three tables, each against the same call without the disturbance, in the same run:

1. a slow rank (``stragglers={rank: 2}``: a host twice as slow at its CPU work and at the
   latency and gap of its messages; :mod:`collectives.sim.world`), first rank 1, then
   rank 0 (the trees' root);
2. a late rank (``delays={1: 100 us}``): it enters the call 100 us after the others;
3. jitter (``jitter``: each message's latency gets an exponential extra, mean 10% of the
   topology's alpha), over 5 seeds: the mean and the range of the time;
4. a slow NIC (``slow_links={1: 4}``: rank 1's links carry a quarter of their bandwidth,
   their latency unchanged) beside a slow host of the same factor (``stragglers={1: 4}``):
   the NIC slows bytes, the host messages, so which one hurts depends on the size.

Every figure is simulated time; nothing here depends on this machine's load.
"""
import argparse
import statistics

from collectives.sim import simulate, topology
from collectives.sim.cli import world_sizes
from collectives.tools.sizes import human, parse_size

ALGORITHMS = ("ring", "tree", "recursive_doubling")
FACTOR = 2.0
LATE = 100e-6
SEEDS = range(5)
NIC = 4.0


def time_of(algorithm, n, size, spec, **noise):
    return simulate("all_reduce", algorithm, n, size, spec, **noise).time


def us(seconds):
    return f"{seconds * 1e6:,.1f}"


def slow_rank(ranks, sizes, spec):
    print(f"1. One rank {FACTOR:g}x slower (its CPU, and the latency and gap of its messages), "
          f"simulated time in us")
    print(f"{'ranks':>6} {'size':>6} {'algorithm':<19} {'none':>10} {'rank 1':>10} {'x':>6} {'+us':>9} "
          f"{'rank 0':>10} {'x':>6} {'+us':>9}")
    for n in ranks:
        for size in sizes:
            for a in ALGORITHMS:
                base = time_of(a, n, size, spec)
                cells = ""
                for rank in (1, 0):
                    t = time_of(a, n, size, spec, stragglers={rank: FACTOR})
                    cells += f" {us(t):>10} {t / base:>6.2f} {us(t - base):>9}"
                print(f"{n:>6} {human(size):>6} {a:<19} {us(base):>10}{cells}")


def late_rank(ranks, sizes, spec):
    print(f"\n2. Rank 1 enters the call {LATE * 1e6:g} us late, simulated time in us")
    print(f"{'ranks':>6} {'size':>6} {'algorithm':<19} {'none':>10} {'late':>10} {'+us':>9}")
    for n in ranks:
        for size in sizes:
            for a in ALGORITHMS:
                base = time_of(a, n, size, spec)
                t = time_of(a, n, size, spec, delays={1: LATE})
                print(f"{n:>6} {human(size):>6} {a:<19} {us(base):>10} {us(t):>10} {us(t - base):>9}")


def jitter(ranks, sizes, spec, mean):
    print(f"\n3. Every message's latency + an exponential extra of mean {mean * 1e6:g} us, "
          f"{len(SEEDS)} seeds, simulated time in us")
    print(f"{'ranks':>6} {'size':>6} {'algorithm':<19} {'none':>10} {'mean':>10} {'x':>6} {'least':>10} {'most':>10}")
    for n in ranks:
        for size in sizes:
            for a in ALGORITHMS:
                base = time_of(a, n, size, spec)
                ts = [time_of(a, n, size, spec, jitter=mean, seed=s) for s in SEEDS]
                m = statistics.mean(ts)
                print(f"{n:>6} {human(size):>6} {a:<19} {us(base):>10} {us(m):>10} {m / base:>6.2f} "
                      f"{us(min(ts)):>10} {us(max(ts)):>10}")


def slow_nic(ranks, sizes, spec):
    print(f"\n4. Rank 1's NIC {NIC:g}x slower (bandwidth / {NIC:g}, latency unchanged) beside rank 1 a "
          f"{NIC:g}x slower host, simulated time in us")
    print(f"{'ranks':>6} {'size':>6} {'algorithm':<19} {'none':>10} {'slow NIC':>10} {'x':>6} "
          f"{'slow host':>10} {'x':>6}")
    for n in ranks:
        for size in sizes:
            for a in ALGORITHMS:
                base = time_of(a, n, size, spec)
                nic = time_of(a, n, size, spec, slow_links={1: NIC})
                host = time_of(a, n, size, spec, stragglers={1: NIC})
                print(f"{n:>6} {human(size):>6} {a:<19} {us(base):>10} {us(nic):>10} {nic / base:>6.2f} "
                      f"{us(host):>10} {host / base:>6.2f}")


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.sim_stragglers", description=__doc__.split("\n\n")[0])
    p.add_argument("--world-size", type=world_sizes, default=[16, 64], help="default 16,64")
    p.add_argument("--sizes", default="4K,16M", help="comma-separated (default 4K,16M)")
    p.add_argument("--topology", default="ethernet-100g", help="a preset or a JSON file (default ethernet-100g)")
    args = p.parse_args(argv)
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    spec = topology.load(args.topology)
    if any(n < 2 for n in args.world_size):
        p.error("--world-size: a straggler needs 2 ranks or more")
    print(f"all_reduce on {topology.describe(spec)}\n")
    slow_rank(args.world_size, sizes, spec)
    late_rank(args.world_size, sizes, spec)
    jitter(args.world_size, sizes, spec, 0.1 * spec["alpha"])
    slow_nic(args.world_size, sizes, spec)


if __name__ == "__main__":
    main()
