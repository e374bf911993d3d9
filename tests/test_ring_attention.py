"""Context parallelism (collectives/parallel/ring_attention.py): one attention layer trained with
the sequence split over the ranks gives the parameters of one process, and one step sends the
bytes chapter 20 derives.

One world of 4 ranks, on groups of 1, 2, 3 and 4 of them, causal and not. float64: the online
softmax adds the same terms in another order (chunk by chunk, rescaled), so the results agree to
rounding, not bitwise; 1e-10 after three steps (a missing chunk moves a parameter by ~1e-2).
"""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import collectives
from collectives.parallel.ring_attention import ring_attention
from collectives.parallel.ring_attention_zigzag import zigzag_ring_attention
from tests.worlds import assert_refused_alike, attempt, run_world

B, S, H, HEADS, STEPS, LR, E = 2, 12, 8, 2, 3, 0.5, 8     # S divisible by 1..4; 4H^2 + 4H = 288 too


class Attention(nn.Module):
    """Self-attention on (B, S, H); ``group`` set: this rank's chunk of the sequence, on the ring."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.q, self.k, self.v, self.o = (nn.Linear(H, H, dtype=torch.float64) for _ in range(4))

    def forward(self, x, group=None, causal=True, cp=False):
        heads = [p(x).view(B, -1, HEADS, H // HEADS).transpose(1, 2) for p in (self.q, self.k, self.v)]
        y = ring_attention(*heads, group=group, causal=causal) if cp else \
            F.scaled_dot_product_attention(*heads, is_causal=causal)
        return self.o(y.transpose(1, 2).reshape(B, -1, H))


def data(step):
    g = torch.Generator().manual_seed(step)
    return (torch.randn(B, S, H, generator=g, dtype=torch.float64),
            torch.randn(B, S, H, generator=g, dtype=torch.float64))


def train(model, steps, causal, group=None, first=0):
    cp = group is not None
    n, r = (dist.get_world_size(group), dist.get_rank(group)) if cp else (1, 0)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(first, first + steps):
        x, t = (d.chunk(n, dim=1)[r] for d in data(step))
        opt.zero_grad()
        (((model(x, group, causal, cp) - t) ** 2).sum() / (B * S * H)).backward()
        if cp:   # the projections are replicated: sum their gradients over the sequence chunks
            flat = torch.cat([p.grad.flatten() for p in model.parameters()])
            collectives.all_reduce(flat, group=group, algorithm="ring")
            offset = 0
            for p in model.parameters():
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
        opt.step()


def same_as_one_process(rank, world_size):
    results = {}
    groups = {n: dist.new_group(list(range(n))) for n in range(1, world_size + 1)}
    for causal in (True, False):
        reference = Attention()
        train(reference, STEPS, causal)
        for n, group in groups.items():
            if rank >= n:
                continue
            model = Attention()
            train(model, STEPS, causal, group)
            diff = max((a - b).abs().max().item() for a, b in zip(model.parameters(), reference.parameters()))
            moved = max((a - b).abs().max().item() for a, b in zip(model.parameters(), Attention().parameters()))
            with collectives.count_traffic() as traffic:
                train(model, 1, causal, group, first=STEPS)
            results[(n, causal)] = (diff, moved, traffic.sent_bytes, traffic.sent_messages)
    return results


def expected_traffic(n):
    """Chapter 20: the shape check (N-1 messages of 256 bytes), forward N-1 messages of (K, V) = 2c,
    backward N-1 of (K, V, dK, dV) = 4c and one of (dK, dV) = 2c, c = B x heads x S/N x head_dim x e
    = B S H e / N; then the ring all_reduce of
    the P = 4H^2 + 4H replicated projection parameters, 2(N-1)/N x P e in 2(N-1) messages."""
    if n == 1:
        return 0, 0
    c = B * S * H * E // n
    ring = (n - 1) * 2 * c + (n - 1) * 4 * c + 2 * c
    check = (n - 1) * 256              # first, every rank's chunk compared: N-1 lines of 256 bytes
    return ring + check + 2 * (n - 1) * (4 * H * H + 4 * H) * E // n, 2 * n - 1 + (n - 1) + 2 * (n - 1)


def test_ring_attention_trains_like_one_process_with_the_derived_traffic():
    for rank, results in enumerate(run_world(same_as_one_process, 4)):
        assert len(results) == 2 * (4 - rank)
        for (n, causal), (diff, moved, sent, messages) in results.items():
            what = f"rank {rank}, group of {n}, causal={causal}"
            assert moved > 1e-3, f"{what}: the parameters did not move"
            assert diff < 1e-10, f"{what}: differs from one process by {diff}"
            assert (sent, messages) == expected_traffic(n), f"{what}: sent {sent} B in {messages} messages"


def outsider(rank, world_size):
    only_rank_0 = dist.new_group([0])
    q = torch.zeros(1, 1, 2, 4)
    try:
        ring_attention(q, q, q, group=only_rank_0)
    except ValueError as exc:
        return str(exc)
    return None


def test_a_rank_outside_the_group_is_told_so():
    ranks = run_world(outsider, 2)
    assert ranks[0] is None
    assert "rank 1 is not a member of the group" in ranks[1]


def different_chunks(rank, world_size):
    """Each case: one rank's chunk differs (or is wrong on its own); every rank catches what it gets."""
    ok = torch.zeros(1, 2, 4, 8, dtype=torch.float64)
    odd = {"length": torch.zeros(1, 2, 5, 8, dtype=torch.float64),
           "heads": torch.zeros(1, 3, 4, 8, dtype=torch.float64),
           "head_dim": torch.zeros(1, 2, 4, 6, dtype=torch.float64), "dtype": ok.float()}
    out = {}
    for case in list(odd) + ["own"]:
        q = odd[case] if rank == 1 and case in odd else ok
        k = torch.zeros(1, 2, 3, 8, dtype=torch.float64) if rank == 1 and case == "own" else q
        out[case] = attempt(ring_attention, q, k, q)
    out["after"] = ring_attention(ok + rank, ok, ok).sum().item()       # the group is still usable
    return out


def test_chunks_that_differ_between_ranks_are_refused_on_every_rank_at_once():
    """Sequence length, heads, head dim or dtype differing on one rank of 3, or q, k, v that disagree
    on one rank only: every rank raises the same ValueError naming the ranks and what each holds,
    within seconds, not after COLLECTIVES_TIMEOUT (60 s here); the next call works."""
    results = run_world(different_chunks, 3, env={"COLLECTIVES_TIMEOUT": "60"})
    words = {"length": "ranks 0, 2: q, k, v [1, 2, 4, 8] float64, causal; rank 1: q, k, v [1, 2, 5, 8] float64, causal",
             "heads": "rank 1: q, k, v [1, 3, 4, 8] float64",
             "head_dim": "rank 1: q, k, v [1, 2, 4, 6] float64",
             "dtype": "rank 1: q, k, v [1, 2, 4, 8] float32",
             "own": "ring_attention: rank 1: q, k, v must share one shape (B, heads, S/N, head_dim), got "
                    "[1, 2, 4, 8], [1, 2, 3, 8], [1, 2, 4, 8]"}
    assert_refused_alike(results, words)
    assert all(r["after"] == 0.0 for r in results)


def mixed_calls(rank, world_size):
    q = torch.randn(1, 2, 4, 8, dtype=torch.float64)     # one shape everywhere, but another ring
    try:
        (ring_attention if rank == 0 else zigzag_ring_attention)(q, q, q)
    except collectives.DesyncError as exc:
        return str(exc)
    return None


def test_ring_passes_are_calls_through_the_door_desync_check_included():
    """Each ring pass is a call of the call machinery: with COLLECTIVES_DEBUG=1 ranks that
    call different rings are told so, on every rank, before any key moves."""
    for text in run_world(mixed_calls, 2, env={"COLLECTIVES_DEBUG": "1"}):
        assert text and "ranks disagree on call #1" in text, text
        assert "rank 1 called ring_attention_zigzag(shape=[128], dtype=float64, moves=1, algorithm=ring)" in text
