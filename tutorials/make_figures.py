"""Regenerate every picture the chapters show, from real traces.

    python -m tutorials.make_figures            # all figures into tutorials/figures/

One world of 4 gloo ranks runs each traced collective; rank 0 gets every
rank's trace and ``collectives.plot`` draws it. Timelines show this machine's
timing on the day they were made; grids and byte counts are exact.
"""
import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from collectives import cost_model, plot  # noqa: E402
from tutorials.demos.common import run  # noqa: E402
from tutorials.demos.traces import all_reduce_trace, all_reduce_traces, training_step_trace  # noqa: E402

FIGURES = Path(__file__).resolve().parent / "figures"
WORLD_SIZE = 4
ALGORITHMS = ["naive_ring", "ring", "recursive_doubling", "rabenseifner", "tree"]


def collect(rank, world_size):
    traces = {"ring_timeline": all_reduce_trace(rank, world_size, "ring", 1 << 20),
              "naive_timeline": all_reduce_trace(rank, world_size, "naive_ring", 1 << 20),
              "tree_timeline": all_reduce_trace(rank, world_size, "tree", 1 << 10),
              "doubling_timeline": all_reduce_trace(rank, world_size, "recursive_doubling", 1 << 10),
              "bytes": all_reduce_traces(rank, world_size, ALGORITHMS, 4096),
              "training_step": training_step_trace(rank, world_size)}
    return traces if rank == 0 else None


def save(fig, name):
    path = FIGURES / name
    fig.savefig(path, dpi=90)
    plt.close(fig)
    print(f"wrote {path.relative_to(FIGURES.parent.parent)} ({path.stat().st_size // 1024} KB)")


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
    FIGURES.mkdir(exist_ok=True)
    traces = run(collect, WORLD_SIZE)[0]
    ring = traces["ring_timeline"]
    save(plot.ring_ownership(ring)[0], "ring_ownership.png")
    fig, axes = plt.subplots(2, 1, figsize=(9, 5.5), constrained_layout=True)
    plot.timeline(traces["naive_timeline"], ax=axes[0], title="naive (whole-tensor) ring, 4 MiB")
    plot.timeline(ring, ax=axes[1], title="chunked ring, 4 MiB")
    save(fig, "ring_timeline.png")
    fig, axes = plt.subplots(2, 1, figsize=(9, 5.5), constrained_layout=True)
    plot.timeline(traces["tree_timeline"], ax=axes[0], title="tree (reduce + broadcast), 4 KiB")
    plot.timeline(traces["doubling_timeline"], ax=axes[1], title="recursive doubling, 4 KiB")
    save(fig, "tree_vs_doubling_timeline.png")
    save(plot.bytes_per_rank(traces["bytes"], title="all_reduce of 16 KiB on 4 ranks: bytes each rank "
                                                    "sends").figure, "bytes_per_rank.png")
    save(cost_model_figure(), "cost_model.png")
    messages, events = traces["training_step"]
    ax = plot.timeline(messages, title="one DataParallel step of the MNIST net, 4 buckets, 4 ranks",
                       events=events)
    save(ax.figure, "training_step_timeline.png")


if __name__ == "__main__":
    main()
