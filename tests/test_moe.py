"""Expert parallelism (collectives/parallel/moe.py): the parameters of one process holding every
expert, and the bytes chapter 19 derives, uneven splits and ranks without tokens included.

One world of 4 ranks, on groups of 1, 2, 3 and 4 of them, top-1 and top-2. float64: every
token meets the same weights as in one process, but the router's gradient is summed over the
ranks in another order, so the parameters agree to rounding, not bitwise: 1e-10 after three
steps (a missing token or gradient moves them by ~1e-3).
"""
import torch
import torch.distributed as dist
import torch.nn as nn

import collectives
from collectives.parallel.moe import MoE, dense_moe, expert_mlp, reduce_router_grads
from tests.worlds import run_world

H, FFN, STEPS, LR, E = 8, 16, 3, 0.5, 8
TOKENS = [6, 0, 9, 4]     # rank 1 has no tokens at all


def layer(n):
    torch.manual_seed(n)
    router = nn.Linear(H, n, bias=False, dtype=torch.float64)
    return router, nn.ModuleList(expert_mlp(H, FFN, torch.float64) for _ in range(n))


def tokens(rank, step):
    g = torch.Generator().manual_seed(100 * step + rank)
    return (torch.randn(TOKENS[rank], H, generator=g, dtype=torch.float64),
            torch.randn(TOKENS[rank], H, generator=g, dtype=torch.float64))


def loss_of(y, target, n):
    return ((y - target) ** 2).sum() / sum(TOKENS[:n])


def train_one_process(n, top_k):
    router, experts = layer(n)
    opt = torch.optim.SGD([*router.parameters(), *experts.parameters()], lr=LR)
    for step in range(STEPS):
        x, t = (torch.cat(parts) for parts in zip(*[tokens(r, step) for r in range(n)]))
        opt.zero_grad()
        loss_of(dense_moe(x, router, experts, top_k), t, n).backward()
        opt.step()
    return router, experts


def step(moe, opt, rank, n, group, s):
    x, t = tokens(rank, s)
    x.requires_grad_()    # as for a layer inside a network: the tokens' gradient travels back too
    opt.zero_grad()
    loss_of(moe(x), t, n).backward()
    reduce_router_grads(moe, group)
    opt.step()


def same_as_one_process(rank, world_size):
    results = {}
    groups = {n: dist.new_group(list(range(n))) for n in range(1, world_size + 1)}
    for n, group in groups.items():
        for top_k in (1, 2):
            if rank >= n or top_k > n:
                continue
            moe = MoE.from_experts(*layer(n), top_k=top_k, group=group)
            opt = torch.optim.SGD(moe.parameters(), lr=LR)
            for s in range(STEPS):
                step(moe, opt, rank, n, group, s)
            router, experts = train_one_process(n, top_k)
            expected = MoE.from_experts(router, experts, top_k, group).state_dict()
            start = MoE.from_experts(*layer(n), top_k=top_k, group=group).state_dict()
            got = moe.state_dict()
            diff = max((got[k] - expected[k]).abs().max().item() for k in got)
            moved = max((got[k] - start[k]).abs().max().item() for k in got)
            with collectives.count_traffic() as traffic:
                step(moe, opt, rank, n, group, STEPS)
            results[(n, top_k)] = (diff, moved, moe.last_counts, traffic.sent_bytes, traffic.sent_messages)
    return results


def expected_traffic(rank, n, send, recv):
    """Chapter 19: the counts (N-1 messages of 8 bytes), the tokens out and back, forward and
    backward (2 H e bytes per row that leaves or enters this rank; a message per non-empty
    piece), and the ring all_reduce of the N x H router: 2(N-1)/N x N H e."""
    if n == 1:
        return 0, 0
    out = sum(c for j, c in enumerate(send) if j != rank)
    into = sum(c for j, c in enumerate(recv) if j != rank)
    pieces = sum(1 for j in range(n) if j != rank and send[j]) + sum(1 for j in range(n) if j != rank and recv[j])
    return (8 * (n - 1) + 2 * H * E * (out + into) + 2 * (n - 1) * H * E,
            (n - 1) + 2 * pieces + 2 * (n - 1))


def test_expert_parallel_trains_like_one_process_with_the_derived_traffic():
    per_rank = run_world(same_as_one_process, 4)
    uneven = False
    for rank, results in enumerate(per_rank):
        for (n, top_k), (diff, moved, (send, recv), sent, messages) in results.items():
            what = f"rank {rank}, {n} experts, top-{top_k}"
            assert moved > 1e-4, f"{what}: the parameters did not move"
            assert diff < 1e-10, f"{what}: differs from one process by {diff}"
            assert sum(send) == TOKENS[rank] * top_k, what
            assert (sent, messages) == expected_traffic(rank, n, send, recv), (
                f"{what}: sent {sent} B in {messages} messages, send={send}, recv={recv}")
            uneven |= n > 2 and len(set(send)) > 1
    assert uneven, "no case had uneven split sizes"


def check_errors(rank, world_size):
    errors = []
    for bad in (lambda: MoE(H, FFN, top_k=3), lambda: MoE(H, FFN)(torch.zeros(2, 3, H))):
        try:
            bad()
        except ValueError as exc:
            errors.append(str(exc))
    return errors


def test_bad_arguments_are_refused_before_any_message():
    for errors in run_world(check_errors, 2):
        assert "top_k must be 1 or 2, got 3" in errors[0]
        assert "x must be this rank's tokens, (T, hidden), got shape [2, 3, 8]" in errors[1]
