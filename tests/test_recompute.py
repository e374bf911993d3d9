"""Activation memory and recomputation (collectives/parallel/recompute.py).

One world of 4 ranks, tensor-parallel groups of 1, 2, 3 and 4, one transformer block
(``ParallelBlock``) in float64, with and without sequence parallelism and checkpointing:

* the bytes autograd keeps (activations only: parameters excluded) equal
  ``block_activation_elements`` x 8, to the byte;
* the checkpointed block's gradients are bitwise those of the plain block, and its step
  sends the plain step's bytes plus one more forward's (the recomputed collectives).
"""
import pytest
import torch
import torch.distributed as dist

import collectives
from collectives.parallel.recompute import block_activation_elements, checkpoint, saved_activation_bytes
from collectives.parallel.tensor_parallel import Block, ParallelBlock, reduce_replicated_grads
from tests.worlds import run_world

S, B, H, A, F = 12, 2, 24, 12, 48       # divisible by t = 1..4


def inputs():
    g = torch.Generator().manual_seed(1)
    return torch.randn(S, B, H, generator=g, dtype=torch.float64), torch.randn(S, B, H, generator=g, dtype=torch.float64)


def one_case(group, t, r, sp, recompute):
    torch.manual_seed(0)
    block = ParallelBlock(Block(H, A, F, dtype=torch.float64), group, "regather" if sp else False)
    x, grad = inputs()
    if sp:
        x, grad = x.chunk(t)[r], grad.chunk(t)[r]
    x = x.clone().requires_grad_()
    run = (lambda x: checkpoint(block, x)) if recompute else block
    with collectives.count_traffic() as forward:
        y, kept = saved_activation_bytes(run, x, exclude=block.parameters())
    with collectives.count_traffic() as backward:
        y.backward(grad)
        if sp:
            reduce_replicated_grads(block, group)
    grads = [p.grad.clone() for p in block.parameters()] + [x.grad.clone()]
    return kept, grads, forward.sent_bytes, backward.sent_bytes


def cases(rank, world_size):
    torch.set_num_threads(1)
    out = {}
    for t in (1, 2, 3, 4):
        group = dist.new_group(list(range(t)))
        if rank < t:
            for sp in (False, True):
                plain = one_case(group, t, rank, sp, False)
                again = one_case(group, t, rank, sp, True)
                out[t, sp] = dict(plain=plain[0], recomputed=again[0],
                                  same_grads=all(torch.equal(a, b) for a, b in zip(plain[1], again[1])),
                                  forward=plain[2], backward=(plain[3], again[3]))
        collectives.barrier()
    return out


def test_saved_bytes_match_the_formula_and_recomputation_changes_nothing_but_memory():
    checked = 0
    for rank, out in enumerate(run_world(cases, 4)):
        for (t, sp), r in out.items():
            where = f"rank {rank}, t={t}, sequence_parallel={sp}"
            assert r["plain"] == 8 * block_activation_elements(S, B, H, A, F, t, sp), where
            assert r["recomputed"] == 8 * block_activation_elements(S, B, H, A, F, t, sp, recompute=True), where
            assert r["same_grads"], where
            plain_backward, recomputed_backward = r["backward"]
            assert recomputed_backward == plain_backward + r["forward"], where     # the forward's collectives again
            assert (r["forward"] > 0) == (t > 1), where
            checked += 1
    assert checked == 2 * (1 + 2 + 3 + 4)


def test_formula_worked_example_and_bad_input():
    assert block_activation_elements(8, 2, 16, 4, 64, 4) == 1872
    assert block_activation_elements(8, 2, 16, 4, 64, 4, sequence_parallel=True) == 1056
    assert block_activation_elements(8, 2, 16, 4, 64, 4, recompute=True) == 256
    with pytest.raises(ValueError, match="must be divisible by t=3"):
        block_activation_elements(8, 2, 16, 4, 64, 3, sequence_parallel=True)
    with pytest.raises(TypeError, match="must be callable"):
        checkpoint(3, torch.zeros(1))


def test_checkpoint_replays_dropout():
    torch.manual_seed(0)
    layer = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Dropout(0.5))
    x = torch.randn(4, 6, requires_grad=True)
    torch.manual_seed(5)
    layer(x).pow(2).sum().backward()
    plain = [x.grad.clone(), layer[0].weight.grad.clone()]
    x.grad = None
    layer.zero_grad()
    torch.manual_seed(5)
    checkpoint(layer, x).pow(2).sum().backward()
    assert torch.equal(plain[0], x.grad) and torch.equal(plain[1], layer[0].weight.grad)
