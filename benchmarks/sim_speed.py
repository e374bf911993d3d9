"""How fast the simulator runs: a thousand ranks and a gigabyte on this machine.

Usage::

    python -m benchmarks.sim_speed                 # both goals below
    python -m benchmarks.sim_speed --world-size 256 -b 64M --algorithm ring

Goals (issue 24): ring all_reduce of 1 GiB on 1,024 ranks (meta tensors) in at most
30 s; tree all_reduce on 4,096 ranks in at most 60 s. For each case the line gives
the wall time, the CPU time of this process (the machine may be shared: CPU time is
what the simulator itself spent), the messages simulated and the time per message,
and the simulated time of the call.
"""
import argparse
import time

from collectives.sim import simulate
from collectives.sim.cli import parse_size

CASES = [("ring", 1024, 1 << 30, 30.0), ("tree", 4096, 1 << 30, 60.0)]


def run(algorithm, n, size, topology):
    wall, cpu = time.perf_counter(), time.process_time()
    r = simulate("all_reduce", algorithm, n, size, topology=topology, device="meta")
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    messages = sum(x["sent_messages"] for x in r.ranks)
    return r, wall, cpu, messages


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.sim_speed", description=__doc__.split("\n\n")[0])
    p.add_argument("--algorithm", default=None, help="one algorithm instead of the two goals")
    p.add_argument("--world-size", type=int, default=None)
    p.add_argument("-b", "--bytes", type=parse_size, default=parse_size("1G"))
    p.add_argument("--topology", default="h100-cluster")
    args = p.parse_args(argv)
    cases = CASES if args.algorithm is None else [(args.algorithm, args.world_size or 1024, args.bytes, None)]
    for algorithm, n, size, goal in cases:
        r, wall, cpu, messages = run(algorithm, n, size, args.topology)
        verdict = "" if goal is None else f"  goal <= {goal:g} s: {'met' if wall <= goal else 'MISSED'}"
        print(f"sim_speed: all_reduce/{algorithm} on {n} ranks, {size} B ({args.topology}): "
              f"{wall:.1f} s wall, {cpu:.1f} s CPU, {messages} messages "
              f"({cpu / max(messages, 1) * 1e6:.1f} us CPU each); simulated time {r.time * 1e3:.3f} ms, "
              f"busbw {r.busbw / 1e9:.1f} GB/s{verdict}")


if __name__ == "__main__":
    main()
