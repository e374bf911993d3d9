"""Tune ``algorithm=None`` to this machine: measure, fit the model, time the likely winners.

Usage::

    python -m benchmarks.tune                         # N=2, 4K..64M, about 2 minutes
    python -m benchmarks.tune --world-size 2,4,8      # one table per world size
    collectives-tune --world-size 4 -e 16M            # the same, as a console script
    torchrun --nproc-per-node 8 -m benchmarks.tune    # the world torchrun started

In each world it

1. times point to point through the door (``benchmarks.pingpong``: ping-pong,
   ring exchange, a local reduction) at a few sizes and fits alpha, beta and
   gamma (``collectives.tuning.cost_model.fit``);
2. at every size from ``-b`` to ``-e`` and for every collective, ranks the
   algorithms ``algorithm=None`` may pick there (within its memory bound,
   ``collectives.tuning.allowed``) by the fitted model and times them all up to
   ``--all-below`` (1M), the ``--top`` most promising above it
   (``benchmarks.sweep.measure_point``, interleaved, so they see the same
   noise): where the model is unsure, near its crossovers, the measurement
   decides;
3. at each point also times the *untuned* choice (what ``algorithm=None`` picks without
   this machine's table) twice, side by side with the others: the second copy against the
   first is the noise, and another algorithm replaces the untuned one only where it beat
   it round by round by more than that noise (``collectives.tuning.tables.decide_from_rows``);
   a table tuned on a busy machine cannot make a point slower than the untuned choice by
   more than the noise it measured; and where other processes used more than a quarter of
   the machine's CPU while a world was measured (``benchmarks.common.OtherWork``), none does
   and its fitted model is not written: beside other work the rounds say what wins beside it;
4. measures the sizes coarse to fine (both ends first, then the middles,
   :func:`coarse_to_fine`) and stops when its share of ``--budget`` seconds is
   spent (shares grow with the world size, :func:`budget_share`); a size left
   over takes the choice of the nearer measured size, on a log scale.

The chosen algorithm at each point (with its evidence: ratio and noise), the
transport the messages went through, and the fitted parameters go into this
machine's table in the per-user cache (``collectives.tuning.cache_path()``:
``$XDG_CACHE_HOME/collectives/tuning-<host>-<cores>cpu-<hash>.json``), one
entry per world size, which ``algorithm=None`` reads from then on. ``--table
FILE`` writes elsewhere instead (for ``COLLECTIVES_TUNING_TABLE``). The rows
go to ``--out`` (default ``bench_out/tune``).
"""
import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

import collectives
from benchmarks import common, pingpong, sweep
from collectives import p2p_communications, tuning
from collectives.tuning import agreed, cost_model

P2P_SIZES = (4, 4096, 65536, 1 << 20, 4 << 20)


def ranked(collective, n, size, params):
    """The algorithms ``algorithm=None`` may pick here (``tuning.allowed``: within its memory
    bound), from the fastest predicted to the slowest."""
    return sorted(tuning.allowed(collective, size, n),
                  key=lambda a: cost_model.predict(collective, a, n, size, params))


def timed(collective, n, size, params, top, all_below):
    """The algorithms to time at a point: every one ``algorithm=None`` may pick up to
    ``all_below`` bytes, where timing them all is cheap and the model is least right (with
    more ranks than cores a rank's wake-up costs more than alpha: the tree beat recursive
    doubling at N=4, 4K-1M, on 2 cores, while the model ranked it fourth); above, the
    model's ``top`` best."""
    names = ranked(collective, n, size, params)
    return names if size <= all_below else names[:top]


def coarse_to_fine(sizes):
    """``sizes`` reordered: both ends, then the middle, then the middles of the halves, ...

    Tuning stops when its budget is spent; measured in this order, the sizes left
    over lie between measured ones and the table answers them from the nearer
    (``collectives.tuning``), where in ascending order every large size was left
    to the model.
    """
    sizes = list(sizes)
    if len(sizes) <= 2:
        return sizes
    order, spans = [0, len(sizes) - 1], [(0, len(sizes) - 1)]
    for lo, hi in spans:           # breadth first: spans appended while iterating
        if hi - lo >= 2:
            mid = (lo + hi) // 2
            order.append(mid)
            spans += [(lo, mid), (mid, hi)]
    return [sizes[i] for i in order]


def untuned(collective, size, n):
    """What ``algorithm=None`` picks here without this machine's table (the shipped table,
    its model, the rules of thumb): the choice tuning must beat, by more than the noise."""
    shipped = {k: v for k, v in tuning.tables.shipped().items() if k in ("choices", "models", "model")}
    return tuning.choose(collective, size, n, agreed.Tables({}, shipped, "nobody", "-", "the shipped table"))


def budget_share(budget, n, world_sizes):
    """World size ``n``'s seconds of ``budget``, in proportion to ``n``: with more ranks than
    cores a call takes about N times longer, and equal shares left N=8 mostly to the model."""
    return budget * n / sum(world_sizes)


def _over_budget(deadline):
    """True on every rank once any rank has passed ``deadline`` (they must skip together)."""
    late = torch.tensor([float(time.monotonic() > deadline)])
    dist.all_reduce(late, op=dist.ReduceOp.MAX)
    return bool(late.item())


def torch_call(device, iters, warmup):
    """Seconds torch's own API adds to one call of ours: ``dist.all_reduce`` of 4 bytes on a
    group of backend "collectives" against ``collectives.all_reduce`` on the same group (the
    same algorithm, door and engine lane), interleaved round by round; the median over rounds
    of the difference, the slowest rank's, never below 0.

    The estimate torch asks our backend for (``collectives.backend``: ``estimate_seconds``)
    prices a call made through torch, and the calls the tune times go through our API: on 2
    shared cores the difference was 40-50 us a call at N=2 and 150-200 us at N=4, a quarter
    of a small call's time. Creating the group is a rendezvous through the store, as every
    group's creation is; the calls timed use only the group's own messages. The tensor is a
    CPU one whatever ``device`` the tune measures (``device`` only carries the rounds' times
    between ranks): what is timed is torch's dispatch and our backend's wrapping, which run
    on the CPU for every device.
    """
    group = dist.new_group(backend="collectives")
    x = torch.zeros(1)
    fns = {"torch": lambda: dist.all_reduce(x, group=group),
           "ours": lambda: collectives.all_reduce(x, group=group)}
    try:
        samples, _ = common.time_samples(fns, iters, warmup, common.batch_for(4, 0), device)
    finally:
        dist.destroy_process_group(group)
    return max(statistics.median(t - o for t, o in zip(samples["torch"], samples["ours"])), 0.0)


def _worker(args, rank, n, device):
    dist.barrier()
    watch = common.OtherWork()     # what else ran on the machine meanwhile
    start = time.monotonic()
    deadline = start + budget_share(args.budget, n, args.world_size)
    p2p = pingpong.measure(rank, n, device, P2P_SIZES, iters=args.iters, warmup=args.warmup_iters)
    params = cost_model.fit(p2p)
    extra = torch_call(device, args.iters, args.warmup_iters)
    rows, skipped = [], []
    points = [(size, c) for size in coarse_to_fine(args.sizes) for c in args.collective]
    progress = common.Progress(len(points), f"tune N={n}")
    for size, collective in points:
        if skipped or _over_budget(deadline):
            skipped.append((collective, size))
            continue
        names = timed(collective, n, size, params, args.top, args.all_below)
        base = untuned(collective, size, n)
        progress.step(f"{collective} {common.human(size)}: {', '.join(names)} (untuned: {base})")
        # the untuned choice twice: the second copy against the first is the noise, and a
        # measured algorithm must beat the untuned one by more than that to replace it
        cands = sweep.candidates_for(collective, names, builtin=False) + [
            (tuning.tables.UNTUNED, base, collectives), (tuning.tables.UNTUNED_AGAIN, base, collectives)]
        point = sweep.measure_point(collective, size, cands, rank, n, device, iters=args.iters,
                                    warmup=args.warmup_iters, check=False)
        for r in point:
            if r["algorithm"] in (tuning.tables.UNTUNED, tuning.tables.UNTUNED_AGAIN):
                r["untuned_algorithm"] = base
        rows += point
    progress.close()
    # the same model fitted to the calls just timed, for torch's time estimator
    # (collectives.backend: estimate_seconds), which ping-pong's figures under-predict
    calls = cost_model.fit_calls(rows)
    if calls is not None:
        params = dict(params, calls=calls, algorithms=cost_model.fit_algorithms(rows, calls))
    params["torch_call"] = extra
    own = torch.tensor([watch.own_seconds()], dtype=torch.float64)
    dist.all_reduce(own)           # the ranks' own CPU is not other work
    others = watch.stop(own.item())
    for r in rows:
        r["others_cpu"] = others
    return {"p2p": p2p, "model": params, "rows": rows, "skipped": skipped, "others_cpu": others,
            "seconds": time.monotonic() - start, "transport": p2p_communications.transport_in_use()}


def build_parser():
    p = argparse.ArgumentParser(prog="python -m benchmarks.tune",
                                description=__doc__.split("\n")[0].replace("``", ""),
                                formatter_class=common.HelpFormatter)
    common.add_size_flags(p, b="4K", e="64M", f=4)
    common.add_timing_flags(p, n=5, w=1)
    p.add_argument("--collective", default=",".join(sweep.DEFAULT_COLLECTIVES),
                   help=f"comma-separated: {','.join(sweep.COLLECTIVES)}")
    p.add_argument("--top", type=common.whole(1), default=3, help="algorithms timed per point above --all-below: "
                                                       "the model's best few")
    p.add_argument("--all-below", type=common.parse_size, default=common.parse_size("1M"),
                   help="up to this size, time every algorithm algorithm=None may pick")
    p.add_argument("--budget", type=common.positive("seconds"), default=120, help="seconds for the whole run (split between "
                                                             "world sizes in proportion to N); a size left over "
                                                             "takes the nearer measured size's choice")
    common.add_world_flags(p, default="2")
    p.add_argument("--table", default=None,
                   help="write the table here instead of this machine's per-user cache")
    p.add_argument("--out", default=os.path.join(common.OUT_DIR, "tune"), help="folder for the rows")
    return p


def parse_args(argv=None):
    p = build_parser()
    args = p.parse_args(argv)
    args.collective = sweep.collectives_flag(p, args.collective)
    if args.top < 1:
        p.error("--top must be 1 or more")
    args = common.finish_parsing(p, args)
    if any(n < 2 for n in args.world_size):
        p.error("tuning needs --world-size 2 or more (a group of one moves nothing)")
    return args


def _beta(beta):
    """beta as a bandwidth, or why there is none: where the fit dropped it (for all_reduce at N
    = 3 and 4 the bytes sent grow with the bytes reduced, so beta and gamma cannot be told
    apart), its floor would print as a million GB/s."""
    if beta <= tuning.cost_model.NO_BETA:
        return "beta dropped (not separable from gamma in these timings)"
    return f"beta {tuning.cost_model.rate(beta)}"


def report(results, rows, path, seconds, file=None):
    """Print the fitted parameters and the choices written, per world size and collective."""
    for n, res in results:
        m = res["model"]
        print(f"# N={n}: alpha {m['alpha'] * 1e6:.1f} us, {_beta(m['beta'])}, "
              f"gamma {tuning.cost_model.rate(m['gamma'])}; swept in {res['seconds']:.0f} s"
              + (f"; fitted to its calls: {m['calls']['call'] * 1e6:.0f} us per call, alpha "
                 f"{m['calls']['alpha'] * 1e6:.1f} us, {_beta(m['calls']['beta'])}"
                 if m.get("calls") else "")
              + (f"; torch's API adds {m['torch_call'] * 1e6:.0f} us a call" if "torch_call" in m else "")
              + (f"; {len(res['skipped'])} point(s) over budget: each takes the nearer measured size's choice"
                 if res["skipped"] else ""),
              file=file)
        if tuning.tables.busy(res["others_cpu"]):
            print(f"# N={n}: other processes used {res['others_cpu']:.0%} of this machine's CPU while it was "
                  f"measured: every point keeps its untuned choice and the fitted model is not written "
                  f"(timings beside other work say what wins beside it, not on the quiet machine); tune "
                  f"again when the machine is quiet", file=file)
    best, evidence = tuning.tables.decide_from_rows(rows)
    for collective, by_n in best.items():
        for n, points in sorted(by_n.items(), key=lambda kv: int(kv[0])):
            line = ", ".join(f"{common.human(size)} {name}" for size, name in points)
            print(f"#   {collective:>14} N={n}: {line}", file=file)
    changed = [e for e in evidence if e["chosen"] != e["untuned"]]
    print(f"# {len(changed)} of {len(evidence)} points changed from the untuned choice, each faster by more "
          f"than its self-against-self noise"
          + "".join(f"\n#   {e['collective']} N={e['world_size']} {common.human(e['size'])}: {e['untuned']} -> "
                    f"{e['chosen']} ({e['ratio']:.2f}x, noise {e['noise']:.2f})" for e in changed), file=file)
    print(f"# wrote {path} in {seconds:.0f} s", file=file)


def main(argv=None):
    args = parse_args(argv)
    started = time.monotonic()
    meta = dict(common.machine_info("python -m benchmarks.tune", args), machine=tuning.machine())
    results = common.run_worlds(_worker, args)
    if results is None:
        return
    # what the door used (shm or gloo), not the setting (auto): the table's timings hold for that
    meta["transport"] = ",".join(sorted({res["transport"] for _, res in results}))
    rows = [r for _, res in results for r in res["rows"]]
    # a model fitted beside other work would price every collective the tune did not time
    # by that work's delays (alpha of milliseconds): kept out of the table, as the choices are
    model = {n: res["model"] for n, res in results if not tuning.tables.busy(res["others_cpu"])}
    path = args.table or tuning.cache_path()
    tuning.write_table(path, rows, model, dict(meta, seconds=round(time.monotonic() - started, 1)))
    common.write_rows(args.out, "tune", rows, dict(meta, model=model, table=path))
    report(results, rows, path, time.monotonic() - started)


if __name__ == "__main__":
    main()
