"""Chapter 19: expert parallelism, a mixture of experts with one expert per rank.

    python -m tutorials.demos.ch19_expert             # the demo
    python -m tutorials.demos.ch19_expert --figure    # also draws tutorials/figures/moe_load.png

1. Three SGD steps of a top-2 MoE layer, 4 experts on 4 ranks, each rank its own tokens
   (a different number on each): the same parameters as one process holding every expert.
2. Where the first step's tokens went: the uneven split sizes of the all_to_all.
3. The bytes each rank sends for one step, counted, against the formula.
4. The same step as a network's first layer (tokens without a gradient): what it saves.
"""
import copy
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

import collectives
from collectives.parallel.moe import MoE, dense_moe, expert_mlp, reduce_router_grads
from tutorials.demos.common import run

WORLD_SIZE = 4
H, FFN, TOP_K, LR, E = 16, 32, 2, 0.5, 8
TOKENS = [64, 48, 80, 32]                     # tokens on each rank: not the same everywhere
FIGURE = Path(__file__).resolve().parent.parent / "figures" / "moe_load.png"


def whole_layer(n):
    torch.manual_seed(0)                      # the same router and experts on every rank
    return nn.Linear(H, n, bias=False, dtype=torch.float64), nn.ModuleList(
        expert_mlp(H, FFN, torch.float64) for _ in range(n))


def tokens(rank, step):
    g = torch.Generator().manual_seed(100 * step + rank)
    shift = torch.linspace(-1, 1, H, dtype=torch.float64)   # a direction all tokens share, as real ones do
    x = torch.randn(TOKENS[rank], H, generator=g, dtype=torch.float64) + shift
    return x, torch.randn(TOKENS[rank], H, generator=g, dtype=torch.float64)


def loss_of(y, target):
    return ((y - target) ** 2).sum() / sum(TOKENS)


def one_process(n, steps):
    router, experts = whole_layer(n)
    opt = torch.optim.SGD([*router.parameters(), *experts.parameters()], lr=LR)
    for step in range(steps):
        x, t = (torch.cat(parts) for parts in zip(*[tokens(r, step) for r in range(n)]))
        opt.zero_grad()
        loss_of(dense_moe(x, router, experts, TOP_K), t).backward()
        opt.step()
    return router, experts


def expert_parallel_step(moe, opt, rank, step, inside=True):
    x, t = tokens(rank, step)
    if inside:
        x.requires_grad_()                    # as inside a network: the tokens' gradient goes home too
    opt.zero_grad()
    loss_of(moe(x), t).backward()
    reduce_router_grads(moe)
    opt.step()


def demo(rank, world_size):
    moe = MoE.from_experts(*whole_layer(world_size), top_k=TOP_K)
    opt = torch.optim.SGD(moe.parameters(), lr=LR)
    sent = []
    for step in range(3):
        expert_parallel_step(moe, opt, rank, step)
        sent.append(moe.last_counts[0])
    expected = MoE.from_experts(*one_process(world_size, 3), top_k=TOP_K).state_dict()
    diff = max((a - expected[k]).abs().max().item() for k, a in moe.state_dict().items())
    diffs = [None] * world_size
    dist.all_gather_object(diffs, diff < 1e-10)
    if rank == 0:
        print(f"1. 3 SGD steps, top-{TOP_K} MoE, {world_size} experts on {world_size} ranks, "
              f"tokens per rank {TOKENS}, float64")
        print(f"   same parameters as one process (within 1e-10) on ranks 0-{world_size - 1}: {diffs}")

    table = [None] * world_size
    dist.all_gather_object(table, sent[0])
    if rank == 0:
        print(f"2. token copies sent in step 1 (top-{TOP_K}: {TOP_K} per token), row = from rank, "
              f"column = to expert")
        for r, row in enumerate(table):
            print(f"   rank {r}: {row}   total {sum(row)}")
        load = [sum(row[e] for row in table) for e in range(world_size)]
        mean = sum(load) / world_size
        print(f"   load per expert: {load}; the busiest has {max(load) / mean:.2f} x the mean")

    x_step = 3
    before = copy.deepcopy(moe.state_dict())   # step 4 repeats this step from the same weights
    with collectives.count_traffic() as traffic:
        expert_parallel_step(moe, opt, rank, x_step)
    send, recv = moe.last_counts
    out = sum(c for j, c in enumerate(send) if j != rank)
    into = sum(c for j, c in enumerate(recv) if j != rank)
    n = world_size
    formula = 8 * (n - 1) + 2 * H * E * (out + into) + 2 * (n - 1) * H * E
    rows = [None] * world_size
    dist.all_gather_object(rows, (traffic.sent_bytes, formula, out, into))
    if rank == 0:
        print("3. bytes each rank sends in one step: 8(N-1) counts + 2 H e (rows out + rows in) "
              "+ the router's all_reduce 2(N-1) H e")
        for r, (counted, f, o, i) in enumerate(rows):
            print(f"   rank {r}: counted {counted:6d}, formula {f:6d} (rows out {o:3d}, rows in {i:3d})")

    # 4. the first layer of a network: the tokens are data, no gradient goes back through the
    # dispatch, so its backward sends nothing (SGD keeps no state: reloading the weights repeats step 3)
    moe.load_state_dict(before)
    with collectives.count_traffic() as first:
        expert_parallel_step(moe, opt, rank, x_step, inside=False)
    formula = 8 * (n - 1) + H * E * (2 * out + into) + 2 * (n - 1) * H * E
    firsts = [None] * world_size
    dist.all_gather_object(firsts, (first.sent_bytes, formula, traffic.sent_bytes))
    if rank == 0:
        print("4. the same step as a first layer (tokens without a gradient): 8(N-1) + H e (2 rows out "
              "+ rows in) + 2(N-1) H e")
        for r, (counted, f, full) in enumerate(firsts):
            print(f"   rank {r}: counted {counted:6d}, formula {f:6d}, {100 * counted / full:.0f}% of step 3's")


def figure(rank, world_size):
    """Token copies each expert receives from each rank over the demo's steps: the load picture."""
    moe = MoE.from_experts(*whole_layer(world_size), top_k=TOP_K)
    opt = torch.optim.SGD(moe.parameters(), lr=LR)
    counts = []
    for step in range(3):
        expert_parallel_step(moe, opt, rank, step)
        counts.append(moe.last_counts[0])
    table = [None] * world_size
    dist.all_gather_object(table, counts)
    if rank != 0:
        return
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(10, 3.2), sharey=True)
    for step, ax in enumerate(axes):
        bottom = [0] * world_size
        for src in range(world_size):
            row = table[src][step]
            ax.bar(range(world_size), row, bottom=bottom, label=f"from rank {src}")
            bottom = [b + c for b, c in zip(bottom, row)]
        mean = sum(bottom) / world_size
        ax.axhline(mean, color="black", linestyle="--", linewidth=1)
        ax.text(world_size - 0.5, mean, " mean", va="bottom", ha="right", fontsize=8)
        ax.set_title(f"step {step + 1}: busiest expert {max(bottom) / mean:.2f} x mean", fontsize=9)
        ax.set_xticks(range(world_size), [f"expert {e}\n(rank {e})" for e in range(world_size)], fontsize=8)
    axes[0].set_ylabel("token copies received")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"Top-{TOP_K} MoE, {world_size} experts, no balancing loss: the load follows the router",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(FIGURE, dpi=90)
    print(f"wrote {FIGURE}")


if __name__ == "__main__":
    run(demo, WORLD_SIZE)
    if "--figure" in sys.argv:
        run(figure, WORLD_SIZE)
