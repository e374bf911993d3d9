"""Where an all_reduce's CPU goes, thread by thread: the built-in against ours.

With more ranks than cores (4 ranks on 2 cores) a collective can only be as
fast as the CPU it burns allows, so the question is not how long it waits
but who burns what. Each rank reads its threads' user and system time from
``/proc/self/task`` (Linux) around ``-n`` back-to-back calls of every
candidate, in ``--rounds`` alternating rounds::

    python -m benchmarks.cpu --world-size 4 -b 16M --algorithm ring,ring_pipelined

prints, per candidate, the wall time per call and the CPU per call per rank
(mean over ranks, user+system) of each kind of thread:

* ``calling``: the thread that called the collective. Our algorithms run
  here, and so does the copy of every send that gloo can write at once.
* ``gloo worker``: gloo's worker threads (``pt_gloo_runloop``), where the
  built-in runs its whole algorithm, reductions and sends included.
* ``gloo I/O``: gloo's transport thread (``gloo_tcp_loop``): socket reads,
  deferred writes and the ready-to-receive handshakes.

The kernel counts CPU in ticks (10 ms on most systems), so keep
``-n`` x time per call well above that. ``docs/benchmarks.md`` uses
this table, and ``perf`` on top of it, to explain the 16 MiB N=4 target.
"""
import argparse
import functools
import os
import time

import torch
import torch.distributed as dist

from benchmarks import common
from collectives import api

ROLES = ("calling", "gloo worker", "gloo I/O", "other")


def _role(tid, name):
    if tid == os.getpid():
        return "calling"
    if name.startswith("pt_gloo"):
        return "gloo worker"
    if name.startswith("gloo"):
        return "gloo I/O"
    return "other"


def thread_cpu():
    """{role: [user seconds, system seconds]} summed over this process's threads."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {role: [0.0, 0.0] for role in ROLES}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # the thread has exited since the listing
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()   # fields[11], [12]: utime, stime (proc(5))
        acc = out[_role(int(tid), name)]
        acc[0] += int(fields[11]) / tick
        acc[1] += int(fields[12]) / tick
    return out


def _worker(args, rank, world, device):
    out = []
    for size in args.sizes:
        out += _one_size(args, size, rank, world)
    return out


def _one_size(args, size, rank, world):
    # Zeros stay zeros however often they are summed: only the bytes matter here.
    x = torch.zeros(max(1, size // 4))
    cands = {"built-in": functools.partial(dist.all_reduce, x)}
    for a in args.algorithm:
        cands[a] = functools.partial(api.all_reduce, x, algorithm=a)
    # per candidate: wall, then user and system time of every role, summed over rounds
    totals = {name: [0.0] * (1 + 2 * len(ROLES)) for name in cands}
    for _ in range(args.rounds):
        for name, fn in cands.items():
            for _ in range(args.warmup_iters):
                fn()
            dist.barrier()
            before, t0 = thread_cpu(), time.perf_counter()
            for _ in range(args.iters):
                fn()
            wall = time.perf_counter() - t0
            after = thread_cpu()
            dist.barrier()
            row = totals[name]
            row[0] += wall
            for i, role in enumerate(ROLES):
                row[1 + 2 * i] += after[role][0] - before[role][0]
                row[2 + 2 * i] += after[role][1] - before[role][1]
    summed = torch.tensor([totals[name] for name in cands], dtype=torch.float64)
    dist.all_reduce(summed)
    table = (summed / (world * args.rounds * args.iters) * 1e3).tolist()
    if rank == 0:
        _print(args, size, world, list(cands), table)
    return [dict({"world_size": world, "size": size, "candidate": name, "wall_ms": row[0]},
                 **{f"{role} {part} ms": row[1 + 2 * i + k] for i, role in enumerate(ROLES)
                    for k, part in enumerate(("user", "system"))})
            for name, row in zip(cands, table)]


def _print(args, size, world, names, rows):
    print(f"all_reduce {size} B float32, N={world}, gloo, {args.rounds} rounds x {args.iters} calls; "
          f"ms per call, CPU per rank (user+system):")
    print(f"  {'':16s} {'wall':>7s}" + "".join(f" {role:>14s}" for role in ROLES) + f" {'total CPU':>10s}  vs built-in")
    base = sum(rows[0][1:])
    for name, row in zip(names, rows):
        cells = "".join(f" {f'{row[1 + 2 * i]:.2f}+{row[2 + 2 * i]:.2f}':>14s}" for i in range(len(ROLES)))
        total = sum(row[1:])
        ratio = f"{total / base:5.2f}x" if base > 0 else "    -"
        print(f"  {name:16s} {row[0]:7.2f}{cells} {total:10.2f}  {ratio}", flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.cpu", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    common.add_size_flags(p, b="16M", e=None, f=4)
    p.add_argument("-n", "--iters", type=common.whole(1), default=10, help="calls back to back per round and candidate")
    p.add_argument("-w", "--warmup-iters", type=common.whole(0), default=2, help="untimed calls before each round")
    p.add_argument("--algorithm", default="ring,ring_pipelined",
                   help="comma-separated all_reduce algorithms to set beside the built-in")
    common.add_world_flags(p, default="4", backend=False)
    p.add_argument("--rounds", type=common.whole(1), default=3)
    p.add_argument("--out", default=os.path.join(common.OUT_DIR, "cpu"))
    args = p.parse_args(argv)
    args.algorithm = [a for a in args.algorithm.split(",") if a]
    common.check_algorithms(p, "all_reduce", args.algorithm)
    if not os.path.isdir("/proc/self/task"):
        p.error("per-thread CPU times come from /proc/self/task, which this system lacks (Linux only)")
    common.finish_parsing(p, args)
    common.run_and_write("python -m benchmarks.cpu", _worker, args)


if __name__ == "__main__":
    main()
