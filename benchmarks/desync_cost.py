"""What the always-on mismatch detection costs: all_reduce with the call tags and without.

Usage::

    python -m benchmarks.desync_cost                      # 4K, N=2 and 4, algorithm=None
    python -m benchmarks.desync_cost -b 4K -e 64K --world-size 2,4 --algorithm ring,tree -n 200
    python -m benchmarks.desync_cost --debug              # also COLLECTIVES_DEBUG=1 (fingerprint round)

Every message of a collective carries a tag made of the call's number on its
group, a hash of the call (collective, algorithm, op, shape, dtype) and the
step, so two ranks in different calls never pair silently: that is what
raises ``DesyncError`` instead of returning garbage. ``tags off`` patches the door
in this benchmark's own processes to tag by step only, as before the call hash
existed; the library has no switch for it.
The goal (issue 14): at 4 KiB, N = 2 and 4, the time with detection stays
within 5% of the time without it.

For each (size, algorithm) three candidates run interleaved in the same
processes (see :func:`benchmarks.common.time_candidates`): ``tags on``,
``tags off`` (the door's ``Comm.tag`` patched around each call) and the built-in for scale. The row shows the median of the
slowest rank's time per call and the ratio on/off: the median over rounds of
each round's on/off (the two ran side by side; see :func:`benchmarks.common.paired_ratio`).
On a shared machine the ratio needs many iterations (``-n``) to settle; report figures
from a quiet one.

``--debug`` adds a fourth candidate, ``debug on``: ``COLLECTIVES_DEBUG=1``,
which exchanges a fingerprint of every call among all ranks before any data
moves (one more round of N(N-1) small messages), and its time over ``tags on``.
"""
import argparse
import contextlib
import os

import torch
import torch.distributed as dist

import collectives
from benchmarks import common
from collectives import p2p_communications

@contextlib.contextmanager
def env(variable, enabled):
    """Set ``variable`` to 1 or 0 for the calls inside; restore it after."""
    old = os.environ.get(variable)
    os.environ[variable] = "1" if enabled else "0"
    try:
        yield
    finally:
        if old is None:
            del os.environ[variable]
        else:
            os.environ[variable] = old


def _step_only(self, step, nbytes):
    return step


@contextlib.contextmanager
def call_tags(enabled):
    """Tag by the call's hash (the library's behaviour) or, off, by step only, for the calls inside."""
    original = p2p_communications.Comm.tag
    if not enabled:
        p2p_communications.Comm.tag = _step_only
    try:
        yield
    finally:
        p2p_communications.Comm.tag = original


def _worker(args, rank, n, device):
    rows = []
    for size in args.sizes:
        x = torch.zeros(max(1, size // 4))      # zeros stay zeros: only the bytes matter
        for algorithm in args.algorithm:
            algo = None if algorithm == "default" else algorithm

            def ours(tags, debug=False):
                def call():
                    with call_tags(tags), env("COLLECTIVES_DEBUG", debug):
                        collectives.all_reduce(x, algorithm=algo)
                return call
            cands = {"tags on": ours(True), "tags off": ours(False), "built-in": lambda: dist.all_reduce(x)}
            if args.debug:
                cands["debug on"] = ours(True, debug=True)
            samples, _ = common.time_samples(cands, args.iters, args.warmup_iters,
                                             common.batch_for(size, args.batch), device)
            t = common.medians(samples)
            r = {"world_size": n, "size": x.numel() * 4, "algorithm": algorithm,
                 "tags_on_us": 1e6 * t["tags on"], "tags_off_us": 1e6 * t["tags off"],
                 "builtin_us": 1e6 * t["built-in"],
                 "on_over_off": common.paired_ratio(samples["tags on"], samples["tags off"])}
            if args.debug:
                r.update(debug_on_us=1e6 * t["debug on"],
                         debug_over_on=common.paired_ratio(samples["debug on"], samples["tags on"]))
            rows.append(r)
            if rank == 0:
                debug = f" {r['debug_on_us']:>10.1f} {r['debug_over_on']:>9.3f}" if args.debug else ""
                print(f" {n:>3} {r['size']:>9} {algorithm:>20} {r['tags_on_us']:>10.1f} {r['tags_off_us']:>10.1f} "
                      f"{r['builtin_us']:>10.1f} {r['on_over_off']:>7.3f}{debug}", flush=True)
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.desync_cost", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    common.add_size_flags(p, b="4K", e=None, f=4)
    common.add_timing_flags(p, n=100, w=5)
    p.add_argument("--algorithm", default="default",
                   help="comma-separated all_reduce algorithms; 'default' is algorithm=None")
    common.add_world_flags(p, default="2,4", backend=False)
    p.add_argument("--batch", type=common.whole(0), default=0, help="calls per iteration (0: up to 32 for small sizes)")
    p.add_argument("--debug", action="store_true", help="also time COLLECTIVES_DEBUG=1 (the fingerprint round)")
    p.add_argument("--out", default=os.path.join(common.OUT_DIR, "desync_cost"))
    args = p.parse_args(argv)
    args.algorithm = args.algorithm.split(",")
    common.check_algorithms(p, "all_reduce", args.algorithm, extra=("default",))
    common.finish_parsing(p, args)
    if common.is_rank0():
        print(f"# all_reduce float32, -n {args.iters} -w {args.warmup_iters}; time per call (us), median of the "
              f"slowest rank; on/off = time with the call tags over time without, median of per-round ratios", flush=True)
        debug = f" {'debug on':>10} {'debug/on':>9}" if args.debug else ""
        print(f"#{'N':>3} {'size(B)':>9} {'algorithm':>20} {'tags on':>10} {'tags off':>10} {'built-in':>10} "
              f"{'on/off':>7}{debug}", flush=True)
    rows = common.run_and_write("python -m benchmarks.desync_cost", _worker, args)
    if rows is not None:
        worst = max(rows, key=lambda r: r["on_over_off"])
        print(f"# worst on/off {worst['on_over_off']:.3f} (N={worst['world_size']}, {worst['size']} B, "
              f"{worst['algorithm']}); goal: at most 1.05 at 4 KiB, N=2 and 4")


if __name__ == "__main__":
    main()
