"""Each algorithm's extra peak memory per rank, beside the built-in's, in one run.

Usage::

    python -m benchmarks.memory                                  # all_reduce, 64M, N=2 and 4
    python -m benchmarks.memory --collective all_gather -b 16M --world-size 4 --algorithm ring,builtin

"Extra" is what a call needs on top of the tensors the caller passes: for
each candidate, every rank measures the peak of its process's resident memory
during one call minus the resident memory just before it, and the table shows
the largest over ranks (median over ``-n`` calls, after ``-w`` warm-up calls),
in MiB and in units of S (the size, as nccl-tests counts it).

How, and why this way: torch allocates CPU tensors with ``malloc``, which
``tracemalloc`` does not see, so the measure is the kernel's. Linux keeps a
high-water mark of each process's resident set (``VmHWM`` in
``/proc/self/status``); writing ``5`` to ``/proc/self/clear_refs`` resets it
to the current resident set (proc(5)). So: reset, read ``VmRSS``, call, read
``VmHWM``. The mark covers every thread of the process (the communication
thread, gloo's threads) and every allocation however short-lived, which a
sampling poll would miss. Two things would make it under-count, and are
switched off in each rank before measuring: glibc's malloc keeps freed memory
for reuse (a buffer freed by one candidate and reused by the next is not
counted again), and it raises its mmap threshold as large blocks are freed
(up to 32 MiB), so later allocations come from that kept memory.
``mallopt(M_MMAP_THRESHOLD, 64 KiB)`` fixes the threshold (every block of
64 KiB or more is its own mapping, returned to the kernel when freed) and
``malloc_trim(0)`` before each call returns what is kept. Smaller blocks and
the allocator's bookkeeping remain, within about 1 MiB. Pages count only once
written: a buffer allocated and never filled costs nothing here, as it costs
nothing on the machine. The first calls also fault in code and set up
connections, hence the warm-up calls (``-w``) before measuring. Linux and glibc only; CPU tensors only.
"""
import argparse
import ctypes
import functools
import gc
import os
import statistics

import torch
import torch.distributed as dist

from benchmarks import common, sweep

M_MMAP_THRESHOLD = -3     # mallopt's parameter number (malloc.h)


def _libc():
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def status_bytes(field):
    """A ``/proc/self/status`` field (``VmRSS``, ``VmHWM``) in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def reset_peak():
    """Set this process's resident high-water mark (VmHWM) to its current resident set."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def exact_malloc():
    """Make freed large blocks go back to the kernel at once (see the module docstring).

    Returns True if glibc took the setting.
    """
    libc = _libc()
    return bool(libc is not None and libc.mallopt(M_MMAP_THRESHOLD, 64 << 10))


def peak_extra(fn):
    """Bytes by which this process's resident set peaked above its level before ``fn()``."""
    gc.collect()
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)
    reset_peak()
    before = status_bytes("VmRSS")
    fn()
    return max(status_bytes("VmHWM") - before, 0)


def _worker(args, rank, n, device):
    if not exact_malloc() and rank == 0:
        print("# warning: mallopt failed (not glibc?): figures may under-count", flush=True)
    rows = []
    for collective in args.collective:
        for size in args.sizes:
            case = sweep.Case(collective, size, common.DTYPES[args.datatype], common.OPS[args.op],
                              device, rank, n)
            cands = sweep.candidates_for(collective, args.algorithm)
            extra = []
            for label, algo, lib in cands:
                b = case.buffers(encoded=False)
                kw = {} if lib is dist else {"algorithm": algo}
                call = functools.partial(case.call, lib, b, **kw)
                for _ in range(args.warmup_iters):
                    call()
                samples = []
                for _ in range(args.iters):
                    dist.barrier()
                    samples.append(peak_extra(call))
                dist.barrier()
                del b, call
                extra.append(statistics.median(samples))
            t = torch.tensor(extra, dtype=torch.float64)
            top, low = t.clone(), t.clone()
            dist.all_reduce(top, op=dist.ReduceOp.MAX)
            dist.all_reduce(low, op=dist.ReduceOp.MIN)
            chosen = None
            if any(label == "default" for label, _, _ in cands):
                from collectives import tuning
                chosen = tuning.choose(collective, case.size, n)
            for (label, _, _), hi, lo in zip(cands, top.tolist(), low.tolist()):
                rows.append({"collective": collective, "world_size": n, "algorithm": label,
                             "chosen": chosen if label == "default" else None, "size": case.size,
                             "type": args.datatype, "extra_peak_MiB": hi / 2**20,
                             "extra_peak_over_S": hi / case.size, "least_rank_MiB": lo / 2**20})
            if rank == 0:
                _print([r for r in rows if r["collective"] == collective and r["size"] == case.size], args)
    return rows


def _print(rows, args):
    r0 = rows[0]
    print(f"# {r0['collective']} {common.human(r0['size'])} {r0['type']}, N={r0['world_size']}: extra peak "
          f"resident memory per rank during one call (largest rank; median of {args.iters} calls)", flush=True)
    print(f"#{'algorithm':>26} {'MiB':>9} {'x S':>7} {'least rank MiB':>15}", flush=True)
    for r in rows:
        name = f"default ({r['chosen']})" if r["chosen"] else r["algorithm"]
        print(f" {name:>26} {r['extra_peak_MiB']:>9.1f} {r['extra_peak_over_S']:>7.2f} "
              f"{r['least_rank_MiB']:>15.1f}", flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.memory", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    common.add_size_flags(p, b="64M", e=None, f=4)
    p.add_argument("-n", "--iters", type=common.whole(1), default=3, help="measured calls per candidate (the median is shown)")
    p.add_argument("-w", "--warmup-iters", type=common.whole(0), default=1, help="calls before measuring (first-call setup)")
    common.add_data_flags(p, check=False)
    p.add_argument("--collective", default="all_reduce", help=f"comma-separated: {','.join(sweep.COLLECTIVES)}")
    p.add_argument("--algorithm", default="all", help="comma-separated names, builtin, default, or all")
    common.add_world_flags(p, default="2,4", backend=False)
    p.add_argument("--out", default=os.path.join(common.OUT_DIR, "memory"))
    args = p.parse_args(argv)
    args.collective = sweep.collectives_flag(p, args.collective)
    args.algorithm = args.algorithm.split(",")
    if not os.path.exists("/proc/self/clear_refs"):
        p.error("peak memory comes from /proc/self/clear_refs and VmHWM, which this system lacks (Linux only)")
    common.finish_parsing(p, args)
    common.run_and_write("python -m benchmarks.memory", _worker, args)


if __name__ == "__main__":
    main()
