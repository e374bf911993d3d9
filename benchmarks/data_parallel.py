"""Per-step time of our data parallelism against torch's DistributedDataParallel.

Same model (the MNIST net), same per-rank batch, same world size, same
processes: every variant runs in each worker, in interleaved rounds so that
load from elsewhere on the machine hits all of them alike, and rank 0 prints
the median milliseconds per training step and the ratio to DDP::

    python -m benchmarks.data_parallel --world-size 2,4

With ``--trace FILE`` it instead runs one ``DataParallel`` training step of
the MNIST net (after one untraced warm-up step) on every rank, traced, and
rank 0 writes the Chrome/Perfetto trace JSON (open it in ui.perfetto.dev) and
a timeline picture drawn from the same file beside it::

    python -m benchmarks.data_parallel --world-size 4 --trace bench_out/mnist_step.json \
        --data-dir ../shared/data

Variants: ``DataParallel`` (bucketed, async, overlapped), the same over the gloo door
(``COLLECTIVES_TRANSPORT=gloo`` while it steps: README's main job with ``--transport
gloo``), ``NaiveDataParallel`` (one all_reduce per parameter after backward, the
tutorial), torch ``DDP`` on gloo, ``DDP`` with :func:`collectives.ddp_comm_hook`, and
the net alone, each rank on its own, no gradient averaged: the floor, what a step costs
with communication free. A step is zero_grad, forward, backward (with gradient averaging)
and ``optimizer.step()``. The last line puts the transports side by side: our
DataParallel's step over the gloo door divided by its step with the default transport
(how much faster the shared-memory door makes training), and the same over the floor's
step (the most any transport could make it: a door that took no time at all).
"""
import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F

from benchmarks import common
from collectives import api
from collectives.parallel.data_parallel import DataParallel
from collectives.parallel.data_parallel_naive import NaiveDataParallel
from collectives.parallel.ddp_hook import ddp_comm_hook
from collectives.train.models import Net

OURS, OURS_GLOO = "DataParallel (ours, bucketed)", "DataParallel (ours) on gloo door"
FLOOR = "no averaging (the floor)"
# COLLECTIVES_TRANSPORT as the ranks were started with it (the default transport's variants use it)
STARTED_WITH = os.environ.get("COLLECTIVES_TRANSPORT", "auto")


def _variants(args):
    def ddp_hooked():
        model = torch.nn.parallel.DistributedDataParallel(Net(), bucket_cap_mb=args.bucket_cap_mb)
        model.register_comm_hook(state=None, hook=ddp_comm_hook(args.algorithm))
        return model
    ours = lambda: DataParallel(Net(), bucket_cap_mb=args.bucket_cap_mb, algorithm=args.algorithm)  # noqa: E731
    # name: (make the model, COLLECTIVES_TRANSPORT while it steps; None: as this process was started)
    return {
        "DDP (torch, gloo)": (lambda: torch.nn.parallel.DistributedDataParallel(
            Net(), bucket_cap_mb=args.bucket_cap_mb), None),
        OURS: (ours, None),
        OURS_GLOO: (ours, "gloo"),
        "NaiveDataParallel (ours)": (lambda: NaiveDataParallel(Net(), algorithm=args.algorithm), None),
        "DDP + ddp_comm_hook (ours)": (ddp_hooked, None),
        FLOOR: (Net, None),
    }


def _time_steps(model, opt, x, y, steps, transport=None):
    # the door reads the setting at every message, the lane thread's included; the barriers
    # below run with it too, and every message of a step is done when the step returns
    os.environ["COLLECTIVES_TRANSPORT"] = transport or STARTED_WITH
    api.barrier()
    t0 = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()
    api.barrier()
    return (time.perf_counter() - t0) / steps


def _worker(args, rank, world, device):
    torch.manual_seed(rank)
    x, y = torch.randn(args.batch_size, 1, 28, 28), torch.randint(0, 10, (args.batch_size,))
    runs = {}
    for name, (make, transport) in _variants(args).items():
        torch.manual_seed(0)
        model = make()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        _time_steps(model, opt, x, y, args.warmup_iters, transport)
        runs[name] = (model, opt, [], transport)
    names = list(runs)
    for r in range(args.rounds):
        # Rotate who goes first, so no variant always runs right after another.
        for name in names[r % len(names):] + names[:r % len(names)]:
            model, opt, times, transport = runs[name]
            times.append(_time_steps(model, opt, x, y, args.iters, transport))
    os.environ["COLLECTIVES_TRANSPORT"] = STARTED_WITH
    # Each round times every variant back to back; the ratio is taken within a
    # round (so a burst of load from elsewhere hits both sides), then the median.
    base = runs["DDP (torch, gloo)"][2]
    rows = [{"world_size": world, "variant": name, "ms_per_step": 1e3 * statistics.median(times),
             "best_ms_per_step": 1e3 * min(times), "vs_ddp": common.paired_ratio(times, base)}
            for name, (_, _, times, _) in runs.items()]
    # how much faster than over the gloo door, the same way
    on_gloo = runs[OURS_GLOO][2]
    speedup = common.paired_ratio(on_gloo, runs[OURS][2])
    ceiling = common.paired_ratio(on_gloo, runs[FLOOR][2])
    rows.append({"world_size": world, "variant": "speedup over the gloo door", "ms_per_step": None,
                 "best_ms_per_step": None, "vs_ddp": None, "default": speedup, "no_communication": ceiling})
    if rank == 0:
        print(f"world size {world}, {args.batch_size} examples per rank, {args.rounds} rounds "
              f"of {args.iters} steps; ms/step median (best), ratio to DDP median of rounds:")
        for row in rows[:-1]:
            print(f"  {row['variant']:32s} {row['ms_per_step']:8.2f} ({row['best_ms_per_step']:6.2f}) "
                  f"ms/step   {row['vs_ddp']:5.2f}x DDP", flush=True)
        print(f"  our DataParallel's step on the gloo door over its step with the default transport "
              f"({STARTED_WITH}): {speedup:.2f}x; over the floor's (communication free): {ceiling:.2f}x",
              flush=True)
    return rows


def _trace_worker(args, rank, world, device):
    """One traced DataParallel step; rank 0 writes the trace and its picture."""
    from collectives import trace
    from collectives.tools import perfetto
    torch.manual_seed(0)
    model = DataParallel(Net(), bucket_cap_mb=args.bucket_cap_mb, algorithm=args.algorithm)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = _batch(args, rank, world)
    spans = []

    def step(record):
        t = time.time()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        t_fwd = time.time()
        loss.backward()
        t_bwd = time.time()
        opt.step()
        if record:
            spans.extend([(rank, "forward", t, t_fwd), (rank, "backward (gradients averaged)", t_fwd, t_bwd),
                          (rank, "optimizer step", t_bwd, time.time())])
    step(False)                      # warm-up: first-call costs stay out of the picture
    api.barrier()
    with trace() as records:
        step(True)
    everyone = perfetto.gather_records(records)
    all_spans = [None] * world if rank == 0 else None
    torch.distributed.gather_object(spans, all_spans, dst=0)
    if rank != 0:
        return None
    all_spans = [s for per_rank in all_spans for s in per_rank]
    os.makedirs(os.path.dirname(os.path.abspath(args.trace)), exist_ok=True)
    perfetto.export_chrome_trace(everyone, args.trace, spans=all_spans)
    summary = perfetto.check_trace(args.trace)
    import matplotlib
    matplotlib.use("Agg")
    from collectives.tools import plot
    ax = plot.timeline(args.trace, color_by="collective",
                       title=f"one DataParallel step of the MNIST net, {world} ranks, "
                             f"{args.batch_size} examples per rank, bucket_cap_mb={args.bucket_cap_mb}")
    png = os.path.splitext(args.trace)[0] + ".png"
    ax.figure.savefig(png, dpi=90)
    print(f"wrote {args.trace} ({summary['slices']} slices on {summary['tracks']} tracks, "
          f"{summary['flows']} message arrows) and {png}", flush=True)
    return summary


def _batch(args, rank, world):
    """This rank's examples: the first global batch of MNIST with --data-dir, else random ones."""
    if not args.data_dir:
        g = torch.Generator().manual_seed(rank)
        return (torch.randn(args.batch_size, 1, 28, 28, generator=g),
                torch.randint(0, 10, (args.batch_size,), generator=g))
    from collectives.train.data import load_mnist, prepare_mnist
    if rank == 0:
        prepare_mnist(args.data_dir)                      # unpack once ...
    api.barrier()                                          # ... while the others wait
    data = load_mnist(prepare_mnist(args.data_dir, download=False), subset=args.batch_size * world)
    x, y = data.tensors
    mine = slice(rank * args.batch_size, (rank + 1) * args.batch_size)
    return x[mine], y[mine]


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.data_parallel", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("-n", "--iters", type=common.whole(1), default=10, help="training steps per timed round")
    p.add_argument("-w", "--warmup-iters", type=common.whole(0), default=5, help="untimed steps per variant first")
    p.add_argument("--rounds", type=common.whole(1), default=15)
    p.add_argument("--algorithm", default=None, help="all_reduce algorithm (default: by size)")
    common.add_world_flags(p, default="2,4", backend=False)
    p.add_argument("--batch-size", type=common.whole(1), default=32, help="examples per rank per step")
    p.add_argument("--bucket-cap-mb", type=common.positive("MiB"), default=25)
    p.add_argument("--out", default=os.path.join(common.OUT_DIR, "data_parallel"))
    p.add_argument("--trace", default=None, metavar="FILE",
                   help="instead of timing: trace one DataParallel step, write FILE (Perfetto JSON) and a PNG")
    p.add_argument("--data-dir", default=None, help="with --trace: a folder holding MNIST/raw (else random data)")
    args = common.finish_parsing(p, p.parse_args(argv))
    if args.trace:
        common.run_worlds(_trace_worker, args)
        return
    return common.run_and_write("python -m benchmarks.data_parallel", _worker, args)


if __name__ == "__main__":
    main()
