"""The pipeline's bubble, measured, against its formula, for GPipe, 1F1B, interleaved 1F1B and ZB-H1.

Usage::

    python -m benchmarks.pipeline_bubble                            # 4 stages, m = 1, 2, 4, 8, 16
    python -m benchmarks.pipeline_bubble --world-size 2,4 -m 1,4,16 --forward-ms 40
    python -m benchmarks.pipeline_bubble -m 4 --plot tutorials/figures/ch16_pipeline_timeline.png
    python -m benchmarks.pipeline_bubble -m 4,8 --schedule 1f1b,interleaved,zb-h1 --chunks 2

Each rank is one stage (``collectives.parallel.pipeline.PipelineStage``) of one
Linear layer whose forward also *sleeps* ``forward-ms / m`` and whose backward sleeps
twice that: a batch costs the same compute whatever m, and the stages really run at
the same time even where the machine has fewer free cores than stages (a sleeping
process takes no core). What is measured is the schedule and the messages, not the
arithmetic. For each step every stage records when it computed (its F and B spans);
the step's time T runs from the first stage's start to the last stage's end, and a
stage's bubble is 1 - (its compute time) / T. The table shows the mean over stages
(median over ``-n`` steps after ``-w`` warm-up steps) beside the model, which assumes
free messages and equal stages: (p-1)/(m+p-1) for GPipe and 1F1B; (p-1)/(vm+p-1) for
interleaved 1F1B with ``--chunks`` v (each chunk sleeps 1/v of the stage's time; m must
be a multiple of p); for ZB-H1 the idle fraction of its order played with free messages
(``pipeline_zero_bubble.makespan``), (p-1)/(3m+p-1) once m >= p. The backward's sleep is
split in two halves, one on the input's gradient path and one on the weight's, so
ZB-H1's B and W each take half of it (the first stage's input requires a gradient too,
so every stage does the same work).

``--plot PATH`` runs one traced step of each schedule with the first m of ``-m`` and
draws both, one above the other (``collectives.tools.plot.timeline``: each stage's
F/B spans as boxes on its lane, each message as an arrow).
"""
import argparse
import contextlib
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn

import collectives
from benchmarks import common
from collectives.parallel import pipeline_interleaved as interleaved
from collectives.parallel import pipeline_zero_bubble as zero_bubble
from collectives.parallel.pipeline import PipelineStage, bubble_fraction
from collectives.parallel.pipeline_interleaved import InterleavedStage
from collectives.parallel.pipeline_zero_bubble import ZeroBubbleStage

WIDTH, ROWS = 64, 64


class _Sleep(torch.autograd.Function):
    """Identity that takes ``forward_s`` forward and ``backward_s`` backward."""

    @staticmethod
    def forward(ctx, x, forward_s, backward_s):
        time.sleep(forward_s)
        ctx.backward_s = backward_s
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.backward_s)
        return grad, None, None


class SleepyLayer(nn.Module):
    """A Linear that takes ``seconds`` forward and 2 ``seconds`` backward: half of it on the
    input's gradient (ZB-H1's B), half on the weight's (its W)."""

    def __init__(self, seconds):
        super().__init__()
        self.linear, self.seconds = nn.Linear(WIDTH, WIDTH), seconds

    def forward(self, x):
        x = _Sleep.apply(x, self.seconds, self.seconds)
        weight = _Sleep.apply(self.linear.weight, 0.0, self.seconds)
        return nn.functional.linear(x, weight, self.linear.bias)


def make_stage(schedule, seconds, m, p, chunks):
    if schedule == "interleaved":
        return InterleavedStage([SleepyLayer(seconds / chunks) for _ in range(chunks)], recv_shape=(ROWS // m, WIDTH))
    if schedule == "zb-h1":
        return ZeroBubbleStage(SleepyLayer(seconds), recv_shape=(ROWS // m, WIDTH))
    return PipelineStage(SleepyLayer(seconds), recv_shape=(ROWS // m, WIDTH))


def model_bubble(schedule, p, m, chunks):
    if schedule == "interleaved":
        return interleaved.bubble_fraction(p, m, chunks)
    if schedule == "zb-h1":
        _, idle = zero_bubble.makespan([zero_bubble.zb_h1(p, m, s) for s in range(p)])
        return statistics.mean(idle)
    return bubble_fraction(p, m)


def one_step(stage, m, schedule, rank, p, records=None):
    x, t = torch.randn(ROWS, WIDTH, requires_grad=True), torch.randn(ROWS, WIDTH)
    collectives.barrier()
    start = time.time()
    args = (m, list(x.chunk(m)) if rank == 0 else None, list(t.chunk(m)) if rank == p - 1 else None,
            nn.functional.mse_loss)
    with collectives.trace() if records is not None else contextlib.nullcontext() as traced:
        # GPipe and 1F1B are one stage class that takes the schedule; the others are their own
        stage.step(*args) if isinstance(stage, (InterleavedStage, ZeroBubbleStage)) else stage.step(*args, schedule)
    end = time.time()
    if records is not None:
        records += traced.messages     # the calls' boxes would hide the waiting
    busy = sum(e - s for _, _, s, e in stage.spans)
    mine = torch.tensor([start, end, busy], dtype=torch.float64)
    everyone = [torch.empty(3, dtype=torch.float64) for _ in range(p)]
    collectives.all_gather(everyone, mine)
    total = max(e[1].item() for e in everyone) - min(e[0].item() for e in everyone)
    return total, statistics.mean(1 - e[2].item() / total for e in everyone)


def worker(args, rank, p, device):
    rows = []
    for m in args.micro_batches:
        for schedule in args.schedule:
            if schedule == "interleaved" and args.chunks > 1 and m % p:
                continue            # interleaving needs m a multiple of p
            torch.manual_seed(rank)
            stage = make_stage(schedule, args.forward_ms / 1e3 / m, m, p, args.chunks)
            steps = [one_step(stage, m, schedule, rank, p) for _ in range(args.warmup_iters + args.iters)]
            samples = steps[args.warmup_iters:]
            rows.append(dict(p=p, m=m, schedule=schedule, step_ms=statistics.median(s[0] for s in samples) * 1e3,
                             bubble=statistics.median(s[1] for s in samples),
                             model=model_bubble(schedule, p, m, args.chunks), held=stage.peak_held))
    if args.plot:
        traces = {}
        for schedule in args.schedule:
            m = args.micro_batches[0]
            stage = make_stage(schedule, args.forward_ms / 1e3 / m, m, p, args.chunks)
            one_step(stage, m, schedule, rank, p)     # warm: connections made
            mine = []
            one_step(stage, m, schedule, rank, p, records=mine)
            everyone = [None] * p
            dist.all_gather_object(everyone, (mine, stage.spans))   # a picture's data, not a lesson
            traces[schedule] = everyone
        if rank == 0:
            draw(traces, p, args.micro_batches[0], args.plot)
    return rows


def draw(traces, p, m, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from collectives.tools import perfetto, plot
    fig, axes = plt.subplots(len(traces), 1, figsize=(12, 1.1 * p * len(traces) + 1), constrained_layout=True)
    fig.suptitle("boxes: stage computing F i / B i; arrows: messages (step 0: activations forward, "
                 "step 1: gradients back); bars: waiting to receive", fontsize=9)
    for ax, (schedule, everyone) in zip(list(axes) if len(traces) > 1 else [axes], traces.items()):
        records = [r for mine, _ in everyone for r in mine]
        spans = [s for _, spans in everyone for s in spans]
        plot.timeline(perfetto.to_chrome_trace(records, spans), ax=ax, color_by="step",
                      title=f"{schedule}: p = {p} stages, m = {m} micro-batches")
    fig.savefig(path, dpi=80)
    print(f"wrote {path}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common.add_world_flags(parser, default="4")
    common.add_timing_flags(parser, n=5, w=1)
    parser.add_argument("-m", "--micro-batches", type=lambda s: [int(x) for x in s.split(",")],
                        default=[1, 2, 4, 8, 16])
    parser.add_argument("--schedule", type=lambda s: s.split(","), default=["gpipe", "1f1b"],
                        help="comma-separated: gpipe, 1f1b, interleaved, zb-h1")
    parser.add_argument("--chunks", type=int, default=2, help="v, the chunks per rank of interleaved 1F1B")
    parser.add_argument("--forward-ms", type=float, default=40.0,
                        help="sleep per stage per batch in forward (backward: twice)")
    parser.add_argument("--plot", help="PNG to draw both schedules' timelines into")
    args = common.finish_parsing(parser, parser.parse_args(argv))
    print(f"# pipeline bubble: each stage sleeps {args.forward_ms:g} ms forward and {2 * args.forward_ms:g} ms "
          f"backward per batch, split over m micro-batches; median of {args.iters} steps")
    print(f"{'p':>3} {'m':>4} {'schedule':>11} {'step ms':>9} {'ideal ms':>9} {'bubble':>8} "
          f"{'formula':>8} {'held':>5}")
    for p, rows in common.run_worlds(worker, args):
        for r in rows:
            ideal = 3 * args.forward_ms / (1 - r["model"])      # the compute, stretched by the model's bubble
            print(f"{p:3d} {r['m']:4d} {r['schedule']:>11} {r['step_ms']:9.1f} {ideal:9.1f} {r['bubble']:8.3f} "
                  f"{r['model']:8.3f} {r['held']:5d}")


if __name__ == "__main__":
    main()
