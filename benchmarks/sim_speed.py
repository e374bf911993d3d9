"""How fast the simulator runs: a thousand ranks and a gigabyte on this machine.

Usage::

    python -m benchmarks.sim_speed                 # the two cases below
    python -m benchmarks.sim_speed --costs         # and every algorithm's cost() at N = 4,096
    python -m benchmarks.sim_speed --world-size 256 -b 64M --algorithm ring

Goals (issue 34, item 7): ring all_reduce of 1 GiB on 1,024 ranks (meta tensors) in at most
15 s of CPU and at most 400 MB of memory (the process's peak RSS); tree all_reduce on 4,096
ranks in at most 60 s (issue 24); ``cost()`` of every registered algorithm at N = 4,096 in
under 1 s each (``--costs``). For each case the line gives the wall time, the CPU time of this
process (the machine may be shared: CPU time is what the simulator itself spent), the messages
simulated and the CPU time per message, the simulated time of the call, and the peak RSS with
what the process held before the run (importing torch alone takes about 520 MB here). Run the
ring first in its process (the default order): the peak RSS is the process's.
"""
import argparse
import resource
import time

from collectives.algorithms import REGISTRY, cost
from collectives.sim import simulate
from collectives.sim.cli import parse_size

# (algorithm, ranks, bytes, CPU seconds at most, peak RSS at most in MB)
CASES = [("ring", 1024, 1 << 30, 15.0, 400), ("tree", 4096, 1 << 30, 60.0, None)]
COST_RANKS, COST_SECONDS = 4096, 1.0


def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 1e6


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6     # KiB on Linux


def run(algorithm, n, size, topology):
    wall, cpu = time.perf_counter(), time.process_time()
    r = simulate("all_reduce", algorithm, n, size, topology=topology, device="meta")
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    messages = sum(x["sent_messages"] for x in r.ranks)
    return r, wall, cpu, messages


def costs(n=COST_RANKS, size=1 << 30):
    """(CPU seconds, collective, algorithm) of each registered algorithm's cost() at ``n``."""
    rows = []
    for collective, algorithms in REGISTRY.items():
        for algorithm in algorithms:
            cpu = time.process_time()
            cost(collective, algorithm, n, size, 4)
            rows.append((time.process_time() - cpu, collective, algorithm))
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.sim_speed", description=__doc__.split("\n\n")[0])
    p.add_argument("--algorithm", default=None, help="one algorithm instead of the two cases")
    p.add_argument("--world-size", type=int, default=None)
    p.add_argument("-b", "--bytes", type=parse_size, default=parse_size("1G"))
    p.add_argument("--topology", default="h100-cluster")
    p.add_argument("--costs", action="store_true",
                   help=f"also time every algorithm's cost() at N = {COST_RANKS} (minutes: some tally every message)")
    args = p.parse_args(argv)
    cases = CASES if args.algorithm is None else [(args.algorithm, args.world_size or 1024, args.bytes, None, None)]
    for algorithm, n, size, goal, memory in cases:
        before = rss_mb()
        r, wall, cpu, messages = run(algorithm, n, size, args.topology)
        peak = peak_rss_mb()
        verdict = "" if goal is None else f"  goal <= {goal:g} s CPU: {'met' if cpu <= goal else 'MISSED'}"
        if memory is not None:
            verdict += f"; <= {memory} MB: {'met' if peak <= memory else 'MISSED'}"
        print(f"sim_speed: all_reduce/{algorithm} on {n} ranks, {size} B ({args.topology}): "
              f"{wall:.1f} s wall, {cpu:.1f} s CPU, {messages} messages "
              f"({cpu / max(messages, 1) * 1e6:.1f} us CPU each); simulated time {r.time * 1e3:.3f} ms, "
              f"busbw {r.busbw / 1e9:.1f} GB/s; peak RSS {peak:.0f} MB ({before:.0f} MB before the run)"
              f"{verdict}", flush=True)
    if args.costs:
        rows = costs()
        slow = [row for row in rows if row[0] >= COST_SECONDS]
        for seconds, collective, algorithm in sorted(rows, reverse=True):
            print(f"sim_speed: cost() of {collective}/{algorithm} at N = {COST_RANKS}: {seconds:.3f} s CPU"
                  f"{'  goal < 1 s: MISSED' if seconds >= COST_SECONDS else ''}")
        print(f"sim_speed: cost() at N = {COST_RANKS}: {len(rows) - len(slow)} of {len(rows)} algorithms "
              f"under {COST_SECONDS:g} s")


if __name__ == "__main__":
    main()
