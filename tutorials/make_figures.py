"""Regenerate every picture the chapters show, from real traces.

    python -m tutorials.make_figures            # all figures into tutorials/figures/

One world of 4 gloo ranks runs each traced collective; rank 0 gets every
rank's trace and ``collectives.tools.plot`` (or a drawing function here) draws it.
Timelines show this machine's timing on the day they were made; step
diagrams, grids and byte counts are exact. The drawing functions are public:
the notebooks draw the same pictures live.
"""
import argparse
import statistics
from pathlib import Path

import matplotlib.pyplot as plt
from collectives.tools import plot
from collectives.tuning import cost_model
from tutorials.demos.common import run
from tutorials.demos.traces import (all_reduce_traces, repeated_all_reduce_traces,
                                    training_step_trace)

FIGURES = Path(__file__).resolve().parent / "figures"
WORLD_SIZE = 4
ALGORITHMS = ["naive_ring", "ring", "recursive_doubling", "rabenseifner", "tree"]
REPEATS = 15          # traced calls per algorithm for the tree/doubling comparison
RING_REPEATS = 7      # traced 4 MiB calls per ring


def collect(rank, world_size):
    traces = {"rings": repeated_all_reduce_traces(rank, world_size, ["naive_ring", "ring"], 1 << 20,
                                                  RING_REPEATS),
              "small": repeated_all_reduce_traces(rank, world_size, ["tree", "recursive_doubling"],
                                                  1 << 10, REPEATS),
              "bytes": all_reduce_traces(rank, world_size, ALGORITHMS, 4096),
              "training_step": {cap: training_step_trace(rank, world_size, cap) for cap in (0.05, 25)}}
    return traces if rank == 0 else None


def save(fig, name):
    path = FIGURES / name
    fig.savefig(path, dpi=90)
    plt.close(fig)
    print(f"wrote {path.relative_to(FIGURES.parent.parent)} ({path.stat().st_size // 1024} KB)")


def duration(messages):
    """Seconds from the first message posted to the last one arriving, over all ranks."""
    return max(m.end for m in messages) - min(m.start for m in messages)


def median_call(calls):
    """The traced call of median duration (the picture of a typical call, not the luckiest)."""
    return sorted(calls, key=duration)[len(calls) // 2]


def step_diagram(messages, ax=None, title=None):
    """Who sends to whom in each step of an algorithm, time left out: one column per step.

    A step is chapter 5's: each rank sends at most one message in it. Where an
    algorithm posts several messages from one rank at once (the linear root posts
    N-1), they leave one after another over that rank's link, so they take one
    column each, as the cost model charges them (alpha x max(steps, messages)).
    Ranks that neither send nor receive in a step are marked idle. Exact: it
    shows the algorithm's schedule, not this machine's timing.

    Args:
        messages (list[Message]): Trace records from all ranks of one collective call.
        ax (matplotlib Axes, optional): Where to draw.
        title (str, optional): Axes title.

    Returns:
        The Axes.
    """
    ax = ax or plt.subplots(figsize=(6, 3), constrained_layout=True)[1]
    sends = [m for m in messages if m.kind == "send"]
    ranks = plot.ranks_of(messages)
    columns = []   # one list of messages per step, at most one sent by each rank
    for step in sorted({m.step for m in sends}):
        queued = {}
        for m in sorted((m for m in sends if m.step == step), key=lambda m: (m.src, m.dst)):
            queued.setdefault(m.src, []).append(m)
        for k in range(max(len(q) for q in queued.values())):
            columns.append([q[k] for q in queued.values() if k < len(q)])
    steps = range(len(columns))
    cmap = plt.get_cmap("tab10")
    for i, column in enumerate(columns):
        busy = set()
        for m in column:
            busy |= {m.src, m.dst}
            # Curved so that an exchange (a -> b and b -> a in one step) shows as two arrows.
            ax.annotate("", xy=(i + 0.85, m.dst), xytext=(i + 0.15, m.src),
                        arrowprops=dict(arrowstyle="->", color=cmap(i % 10), lw=1.6,
                                        connectionstyle="arc3,rad=0.12"))
        for r in ranks:
            if r not in busy:
                ax.text(i + 0.5, r, "idle", ha="center", va="center", color="0.55", fontsize=9)
    for i in range(len(steps) + 1):
        ax.axvline(i, color="0.85", lw=0.8)
    ax.set_xlim(0, len(steps))
    ax.set_xticks([i + 0.5 for i in range(len(steps))], [f"step {s}" for s in steps])
    ax.set_yticks(ranks, [f"rank {r}" for r in ranks])
    ax.set_ylim(max(ranks) + 0.5, min(ranks) - 0.5)
    ax.set_title(title or "messages per step")
    return ax


def tree_vs_doubling_figure(calls):
    """Top: both algorithms' schedules, step by step. Bottom: the median traced call of each, one time axis."""
    fig = plt.figure(figsize=(10, 6.4), constrained_layout=True)
    top = fig.subfigures(2, 1, height_ratios=[1, 1.15])
    axes = top[0].subplots(1, 2, gridspec_kw={"width_ratios": [4, 2]})
    step_diagram(calls["tree"][0], ax=axes[0], title="tree: reduce to rank 0, then broadcast (4 steps)")
    step_diagram(calls["recursive_doubling"][0], ax=axes[1], title="recursive doubling (2 steps)")
    timelines = top[1].subplots(1, 2, sharex=True)
    for ax, name in zip(timelines, ("tree", "recursive_doubling")):
        times = [duration(c) * 1e3 for c in calls[name]]
        plot.timeline(median_call(calls[name]), ax=ax,
                      title=f"{name}: median of {len(times)} calls, {statistics.median(times):.2f} ms")
        ax.get_legend().remove()
    top[1].suptitle("measured here: 4 processes on a shared 2-core CPU, gloo, 4 KiB all_reduce",
                    fontsize=10)
    return fig


def ring_timeline_figure(calls):
    """The median traced call of the whole-tensor and the chunked ring, on one time axis."""
    fig, axes = plt.subplots(2, 1, figsize=(9, 5.5), constrained_layout=True, sharex=True)
    for ax, (name, label) in zip(axes, (("naive_ring", "whole-tensor ring"), ("ring", "chunked ring"))):
        times = [duration(c) * 1e3 for c in calls[name]]
        plot.timeline(median_call(calls[name]), ax=ax,
                      title=f"{label}, 4 MiB: median of {len(times)} calls, {statistics.median(times):.1f} ms")
    axes[0].set_xlabel("")
    return fig


def report(calls, size):
    for name, traced in calls.items():
        times = sorted(duration(c) * 1e3 for c in traced)
        print(f"{name}: {len(times)} calls of {size}, ms: min {times[0]:.2f}, "
              f"median {statistics.median(times):.2f}, max {times[-1]:.2f}")


def bucket_calls(calls, rank):
    """(start, end) of ``rank``'s all_reduce calls, in call order: one per bucket."""
    return [(start, end) for r, _, start, end in sorted(calls, key=lambda c: c[1]) if r == rank]


def training_step_chart(messages, events, buckets, calls, ax=None, title=None):
    """One training step per rank: forward, backward and waiting as grey bars, each bucket's all_reduce in colour.

    Time 0 is when the first rank started forward; all ranks share the axis.

    Args:
        messages, events, buckets, calls: What ``tutorials.demos.traces.training_step_trace`` returns.
        ax (matplotlib Axes, optional): Where to draw.
        title (str, optional): Axes title.

    Returns:
        The Axes.
    """
    ax = ax or plt.subplots(figsize=(10, 3.2), constrained_layout=True)[1]
    t0 = min(t for _, t, label in events if label == "forward starts")
    ranks = sorted({r for r, _, _ in events})
    at = {(r, label): (t - t0) * 1e3 for r, t, label in events}
    colours = plt.get_cmap("tab10")
    handles = {}
    for r in ranks:
        phases = [("forward", "forward starts", "backward starts", "0.82", None),
                  ("backward: computing gradients", "backward starts", "last gradient computed",
                   "0.45", None),
                  ("backward: waiting for the reductions", "last gradient computed",
                   "backward returns", "white", "0.45")]
        for label, start, end, colour, edge in phases:
            handles[label] = ax.barh(r - 0.19, at[r, end] - at[r, start], left=at[r, start],
                                     height=0.32, color=colour, edgecolor=edge, hatch="///" if edge else None)
        for k, (start, end) in enumerate(bucket_calls(calls, r)):
            handles[f"bucket {k}: all_reduce of {sum(buckets[k]):,} floats"] = ax.barh(
                r + 0.19, (end - start) * 1e3, left=(start - t0) * 1e3, height=0.32,
                color=colours(k % 10), edgecolor="white", linewidth=0.5)
    ax.legend(handles.values(), handles.keys(), loc="upper left", bbox_to_anchor=(1.0, 1.0),
              fontsize="small", frameon=False)
    ax.set_yticks(ranks, [f"rank {r}" for r in ranks])
    ax.set_ylim(max(ranks) + 0.6, min(ranks) - 0.6)
    ax.set_xlabel("time since the first rank started forward (ms)")
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(title or "one training step")
    return ax


def training_step_figure(steps):
    """Panels of ``training_step_chart``, one per bucket cap, on one time scale (each from its own start)."""
    fig, axes = plt.subplots(len(steps), 1, figsize=(10.5, 2.6 * len(steps) + 0.4), sharex=True,
                             constrained_layout=True, squeeze=False)
    for ax, (cap, (messages, events, buckets, calls)) in zip(axes[:, 0], steps.items()):
        training_step_chart(messages, events, buckets, calls, ax=ax,
                            title=f"bucket_cap_mb={cap}: {len(buckets)} bucket(s)")
    for ax in axes[:-1, 0]:
        ax.set_xlabel("")
    return fig


def cost_model_figure():
    params = {"alpha": 5e-6, "beta": 1 / 12.5e9, "gamma": 0.0}
    sizes = [2 ** k for k in range(3, 31)]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), constrained_layout=True, sharey=True)
    for ax, n in zip(axes, (4, 64)):
        for a in ALGORITHMS:
            ax.loglog(sizes, [cost_model.predict("all_reduce", a, n, s, params) * 1e6 for s in sizes],
                      label=a)
        ax.set_title(f"N = {n} ranks")
        ax.set_xlabel("tensor size (bytes)")
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel("predicted time (us)")
    axes[1].legend(fontsize="small", frameon=False)
    fig.suptitle("alpha-beta model, alpha = 5 us, beta = 1 / 12.5 GB/s", fontsize=10)
    return fig


def main():
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    plt.switch_backend("Agg")
    FIGURES.mkdir(exist_ok=True)
    traces = run(collect, WORLD_SIZE)[0]
    rings = traces["rings"]
    save(plot.ring_ownership(rings["ring"][0])[0], "ring_ownership.png")
    report(rings, "4 MiB")
    save(ring_timeline_figure(rings), "ring_timeline.png")
    small = traces["small"]
    report(small, "4 KiB")
    save(tree_vs_doubling_figure(small), "tree_vs_doubling_timeline.png")
    save(plot.bytes_per_rank(traces["bytes"], title="all_reduce of 16 KiB on 4 ranks: bytes each rank "
                                                    "sends").figure, "bytes_per_rank.png")
    save(cost_model_figure(), "cost_model.png")
    for cap, (messages, events, buckets, calls) in traces["training_step"].items():
        last = {r: t for r, t, label in events if label == "last gradient computed"}
        back = {r: t for r, t, label in events if label == "backward returns"}
        spans = {r: bucket_calls(calls, r) for r in last}
        print(f"bucket_cap_mb={cap}: buckets {buckets}; per rank, buckets started before the last "
              f"gradient: {[sum(s < last[r] for s, _ in spans[r]) for r in sorted(spans)]}, "
              f"backward ms: {[round((back[r] - min(t for q, t, lab in events if q == r and lab == 'backward starts')) * 1e3, 1) for r in sorted(back)]}")
    save(training_step_figure(traces["training_step"]), "training_step_timeline.png")
    other_programs()


def other_programs():
    """The pictures of chapters 16 and 19 come from their own programs: drawn here as they draw them."""
    from benchmarks import pipeline_bubble
    from tutorials.demos import ch19_expert
    pipeline_bubble.main(["--forward-ms", "400", "-m", "4", "-n", "1",
                          "--plot", str(FIGURES / "ch16_pipeline_timeline.png")])
    assert ch19_expert.FIGURE == FIGURES / "moe_load.png"
    run(ch19_expert.figure, ch19_expert.WORLD_SIZE)
    # Stills of the browser pages (chapters 4, 5, 14, 16): recorded pages (the simulator's, and one
    # real run of chapter 4's exercise), photographed by the system's headless Chromium.
    from collectives.viz import shots
    assert set(shots.PAGES) == {name.removesuffix(".png") for name in VIZ_STILLS}
    if shots.main([str(FIGURES)]) != 0:
        print("make_figures: the viz stills were not redrawn (no chromium on PATH)")


VIZ_STILLS = ("viz_ring_allreduce_8.png", "viz_recursive_doubling_8.png", "viz_ring_64_h100.png",
              "viz_pipeline_1f1b.png", "viz_pipeline_gpipe.png", "viz_grade_all_reduce_deadlock.png",
              "viz_ring_64_torus.png")


if __name__ == "__main__":
    main()
