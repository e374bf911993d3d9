"""Zig-zag ring attention (collectives/parallel/ring_attention_zigzag.py) against one process.

One world of 4 ranks, on groups of 1, 2, 3 and 4: forward and backward (dQ, dK, dV) equal
``F.scaled_dot_product_attention`` on the whole sequence within 1e-12 in float64, causal
and not, and with packed documents (a mask per document) whose positions restart at each
document (positions computed on the whole sequence, cut with the zig-zag layout like the
tokens). Bad input on one rank is refused on every rank, at once, before any key moves.
"""
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from collectives.parallel.ring_attention_zigzag import work, zigzag_merge, zigzag_ring_attention, zigzag_split
from tests.worlds import assert_refused_alike, attempt, run_world

B, HEADS, S, D = 2, 2, 24, 4          # S divisible by 2N for N = 1..4
DOCS = [[5, 9, 3, 7], [12, 1, 11]]     # packed documents per batch row (lengths sum to S)


def whole(seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, HEADS, S, D, generator=g, dtype=torch.float64) for _ in range(4)]   # q, k, v, dO


def documents():
    ids = torch.tensor([[d for d, n in enumerate(row) for _ in range(n)] for row in DOCS])
    positions = torch.stack([torch.cat([torch.arange(n) for n in row]) for row in DOCS])   # restart per document
    return ids, positions


def reference(q, k, v, grad_out, causal, docs):
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    if docs:
        ids, positions = documents()
        q_in = q * (1 + 0.1 * positions[:, None, :, None])        # a position-dependent projection
        allowed = (ids[:, :, None] == ids[:, None, :]) & torch.ones(S, S, dtype=torch.bool).tril()
        out = F.scaled_dot_product_attention(q_in, k, v, attn_mask=allowed[:, None])
    else:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    out.backward(grad_out)
    return out.detach(), q.grad, k.grad, v.grad


def distributed(group, n, r, q, k, v, grad_out, causal, docs):
    mine = [zigzag_split(t, n, r, dim=2).clone().requires_grad_() for t in (q, k, v)]
    doc_ids = None
    q_in = mine[0]
    if docs:
        ids, positions = documents()
        doc_ids = zigzag_split(ids, n, r, dim=1)
        q_in = mine[0] * (1 + 0.1 * zigzag_split(positions, n, r, dim=1)[:, None, :, None])
    out = zigzag_ring_attention(q_in, mine[1], mine[2], group=group, causal=causal or docs, doc_ids=doc_ids)
    out.backward(zigzag_split(grad_out, n, r, dim=2))
    return out.detach(), mine[0].grad, mine[1].grad, mine[2].grad


def same_as_one_process(rank, world_size):
    torch.set_num_threads(1)
    results = {}
    groups = {n: dist.new_group(list(range(n))) for n in range(1, world_size + 1)}
    for seed, (causal, docs) in enumerate([(True, False), (False, False), (True, True)]):
        q, k, v, grad_out = whole(seed)
        expected = reference(q, k, v, grad_out, causal, docs)
        for n, group in groups.items():
            if rank < n:
                got = distributed(group, n, rank, q, k, v, grad_out, causal, docs)
                results[n, causal, docs] = max((a - zigzag_split(b, n, rank, dim=2)).abs().max().item()
                                               for a, b in zip(got, expected))
    return results


def test_zigzag_equals_one_process_forward_and_backward_with_packed_documents():
    checked = 0
    for rank, results in enumerate(run_world(same_as_one_process, 4)):
        assert len(results) == 3 * (4 - rank)
        for (n, causal, docs), diff in results.items():
            assert diff < 1e-12, f"rank {rank}, N={n}, causal={causal}, documents={docs}: differs by {diff}"
            checked += 1
    assert checked == 30


def test_layout_and_work():
    x = torch.arange(16)
    parts = [zigzag_split(x, 4, r, dim=0) for r in range(4)]
    assert parts[0].tolist() == [0, 1, 14, 15] and parts[3].tolist() == [6, 7, 8, 9]
    assert torch.equal(zigzag_merge(parts, dim=0), x)
    assert work(4) == [9] * 4 and work(4, zigzag=False) == [4, 8, 12, 16]     # busiest / mean: 1.6


def bad_inputs(rank, world_size):
    """Each case wrong on rank 1 only; every rank catches what it gets. Then a good call."""
    ok = torch.zeros(1, 1, 4, 4)
    bad = {"odd": (torch.zeros(1, 1, 3, 4), None), "doc_ids": (ok, torch.zeros(1, 3, dtype=torch.long)),
           "length": (torch.zeros(1, 1, 6, 4), None), "no doc_ids": (ok, None)}
    out = {}
    for case, (q, ids) in bad.items():
        if rank != 1:
            q, ids = ok, (torch.zeros(1, 4, dtype=torch.long) if case == "no doc_ids" else None)
        out[case] = attempt(lambda: zigzag_ring_attention(q, q, q, doc_ids=ids))
    out["after"] = zigzag_ring_attention(ok, ok, ok).sum().item()
    return out


def test_bad_input_is_refused_on_every_rank_at_once():
    with pytest.raises(ValueError, match="must be divisible by 2N = 6"):
        zigzag_split(torch.zeros(1, 8), 3, 0)
    results = run_world(bad_inputs, 3, env={"COLLECTIVES_TIMEOUT": "60"})
    words = {"odd": "zigzag_ring_attention: rank 1: this rank's sequence length 3 must be even",
             "doc_ids": "zigzag_ring_attention: rank 1: doc_ids must have shape (B, S/N) = [1, 4], got [1, 3]",
             "length": "ranks 0, 2: q, k, v [1, 1, 4, 4] float32, causal; rank 1: q, k, v [1, 1, 6, 4] float32, causal",
             "no doc_ids": "ranks 0, 2: q, k, v [1, 1, 4, 4] float32, causal, doc_ids; rank 1: q, k, v [1, 1, 4, 4] "
                           "float32, causal;"}
    assert_refused_alike(results, words)
    assert all(r["after"] == 0.0 for r in results)
