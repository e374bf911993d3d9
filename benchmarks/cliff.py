"""The mid-size cliff: gloo's socket threads with and without wake-up preemption, side by side.

Usage::

    python -m benchmarks.cliff                           # N=2, 64K..4M
    python -m benchmarks.cliff -b 256K -e 256K --world-size 2,4 -n 40 --rounds 4

On a machine where the ranks share CPUs, a rank posting a message holds its
gloo pair's lock while it writes to the socket; the write wakes a socket
thread (``gloo_tcp_loop``) which, by default, may preempt the poster on the
spot. A socket thread that then finds the lock taken retries at once (a
level-triggered epoll and ``try_lock``): it spins until the scheduler's next
tick while the lock's holder waits for that very CPU. The door now runs the
socket threads as ``SCHED_BATCH``, which never preempts on wake-up
(``collectives.p2p_communications.calm_transport_threads``).

This benchmark sets the socket threads' policy itself, round by round, in the
same processes: ``as torch made them`` (``SCHED_OTHER``), ``batch``
(``SCHED_BATCH``, what the door sets) and ``nice 19`` (``SCHED_OTHER`` at the
lowest priority), in rotating order, so all see the same load from the rest of
the machine. Per size, policy and candidate it prints the median time per call,
the share of calls slower than 2 ms (a stall: the tick here is 4 ms), and the
CPU per call of the socket threads and of the calling thread, from each
thread's CPU-time clock (nanoseconds on the CPU; a spinning socket thread shows
up there, whatever the wall clock says). Candidates:

* ``1 exchange, torch``: ``dist.irecv`` + ``dist.isend`` of S with the
  neighbours, no collectives code at all;
* ``2 exchanges, torch``: the same with S/2, twice in a row (what a ring
  all_reduce does at N=2);
* ``built-in``: ``torch.distributed.all_reduce`` of S;
* ``ring``: ``collectives.all_reduce(algorithm="ring")`` of S.

Numbers are the slowest rank's (median and stall share) and the mean over
ranks (CPU). Rows go to ``--out`` (default ``bench_out/cliff``).
"""
import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

from benchmarks import common
from collectives import api
from collectives.p2p_communications import GLOO_IO_THREAD

# name -> (scheduling policy, nice value) of the socket threads
POLICIES = {"as torch made them": (getattr(os, "SCHED_OTHER", 0), 0),
            "batch": (getattr(os, "SCHED_BATCH", 3), 0),
            "nice 19": (getattr(os, "SCHED_OTHER", 0), 19)}
STALL = 2e-3


def _threads():
    """{tid: name} of this process's threads."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                out[int(tid)] = f.read().strip()
        except OSError:
            continue
    return out


def _thread_clock(tid):
    """Linux's CPU-time clock of thread ``tid`` of this process (what
    ``pthread_getcpuclockid`` returns: CPUCLOCK_SCHED with the per-thread bit)."""
    return ((~tid) << 3) | 6


def _on_cpu_ns(tids):
    """Nanoseconds the threads ``tids`` have run, summed. Read from each
    thread's CPU clock, which counts the slice it is running now; schedstat's
    first field moves only at a tick or a switch, so a caller spinning through a
    short run read 0 there."""
    total = 0
    for tid in tids:
        try:
            total += time.clock_gettime_ns(_thread_clock(tid))
        except OSError:         # the thread has ended
            continue
    return total


def _set_policy(tids, policy):
    kind, nice = policy
    for tid in tids:
        try:
            os.sched_setscheduler(tid, kind, os.sched_param(0))
            os.setpriority(os.PRIO_PROCESS, tid, nice)
        except OSError:
            pass


def _candidates(size, rank, n):
    x = torch.zeros(max(1, size // 4))
    a, b = torch.zeros_like(x), torch.zeros_like(x)
    half = x.numel() // 2
    right, left = (rank + 1) % n, (rank - 1) % n

    def exchange(tag, part):
        works = [dist.irecv(b[part], left, tag=tag), dist.isend(a[part], right, tag=tag)]
        for w in works:
            w.wait()

    def two_exchanges():
        exchange(1, slice(0, half))
        exchange(2, slice(half, None))

    return {"1 exchange, torch": lambda: exchange(3, slice(None)),
            "2 exchanges, torch": two_exchanges,
            "built-in": lambda: dist.all_reduce(x),
            "ring": lambda: api.all_reduce(x, algorithm="ring")}


def _worker(args, rank, n, device):
    api.all_reduce(torch.zeros(1))          # the door meets the group (and calms its threads)
    names = _threads()
    io = [t for t, name in names.items() if name.startswith(GLOO_IO_THREAD)]
    me = [os.getpid()] if os.getpid() in names else []
    rows = []
    for size in args.sizes:
        cands = _candidates(size, rank, n)
        for fn in cands.values():
            for _ in range(args.warmup_iters):
                fn()
        calls = {(p, c): [] for p in POLICIES for c in cands}
        io_ns = {key: 0 for key in calls}
        me_ns = {key: 0 for key in calls}
        for r in range(args.rounds):
            order = list(POLICIES)[r % len(POLICIES):] + list(POLICIES)[:r % len(POLICIES)]
            for policy in order:
                _set_policy(io, POLICIES[policy])
                for name, fn in cands.items():
                    dist.barrier()
                    io0, me0 = _on_cpu_ns(io), _on_cpu_ns(me)
                    for _ in range(args.iters):
                        t0 = time.perf_counter()
                        fn()
                        calls[policy, name].append(time.perf_counter() - t0)
                    io_ns[policy, name] += _on_cpu_ns(io) - io0
                    me_ns[policy, name] += _on_cpu_ns(me) - me0
        _set_policy(io, POLICIES["batch"])
        keys = list(calls)
        # slowest rank per call, then mean CPU over ranks
        times = torch.tensor([calls[k] for k in keys], dtype=torch.float64)
        dist.all_reduce(times, op=dist.ReduceOp.MAX)
        cpu = torch.tensor([[io_ns[k], me_ns[k]] for k in keys], dtype=torch.float64)
        dist.all_reduce(cpu)
        per_call = args.rounds * args.iters
        for k, t, (io_sum, me_sum) in zip(keys, times.tolist(), cpu.tolist()):
            rows.append({"world_size": n, "size": size, "policy": k[0], "candidate": k[1],
                         "median_us": statistics.median(t) * 1e6,
                         "stalled": sum(x > STALL for x in t) / len(t),
                         "io_cpu_us": io_sum / n / per_call / 1e3, "caller_cpu_us": me_sum / n / per_call / 1e3})
        if rank == 0:
            _print(rows[-len(keys):], n, size, args)
    return rows


def _print(rows, n, size, args):
    print(f"N={n}, {common.human(size)}: {args.rounds} rounds x {args.iters} calls per policy and candidate")
    print(f"  {'socket threads':20s} {'candidate':20s} {'median(us)':>10s} {'calls >2ms':>10s} "
          f"{'socket thr CPU/call':>20s} {'caller CPU/call':>16s}")
    for r in rows:
        print(f"  {r['policy']:20s} {r['candidate']:20s} {r['median_us']:10.0f} {r['stalled']:10.0%} "
              f"{r['io_cpu_us']:17.0f} us {r['caller_cpu_us']:13.0f} us", flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.cliff", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    common.add_size_flags(p, b="64K", e="4M", f=4)
    p.add_argument("-n", "--iters", type=int, default=20, help="calls per round, policy and candidate")
    p.add_argument("-w", "--warmup-iters", type=int, default=3, help="untimed calls per candidate first")
    p.add_argument("--rounds", type=int, default=4, help="rounds; the policies alternate within each")
    common.add_world_flags(p, default="2", backend=False)
    p.add_argument("--out", default=os.path.join(common.OUT_DIR, "cliff"))
    args = p.parse_args(argv)
    if not (hasattr(os, "SCHED_BATCH") and os.path.isdir("/proc/self/task")):
        p.error("SCHED_BATCH, /proc/self/task and per-thread CPU clocks are Linux's")
    common.finish_parsing(p, args)
    meta = common.machine_info("python -m benchmarks.cliff", args)
    results = common.run_worlds(_worker, args)
    if results is not None:
        common.write_rows(args.out, "results", [r for _, rows in results for r in rows], meta)
        print(f"# wrote {args.out}/ (results.csv, results.json)")


if __name__ == "__main__":
    main()
