"""Chapter 17: activation memory per rank, the formula beside the measurement, and recomputation.

    python -m tutorials.demos.ch17_activation_memory

One forward of one transformer block on groups of N = 1, 2, 4 ranks; rank 0 counts the
bytes autograd keeps for backward (activations only: the parameters' storages left out)
and prints them beside ``block_activation_elements`` x 8 (float64), for tensor parallelism,
sequence parallelism (regathered) and each of them with the block checkpointed. Then one
step with and without recomputation: the same gradients, and what recomputation costs in
messages.
"""
import torch
import torch.distributed as dist

import collectives
from collectives.parallel.recompute import block_activation_elements, checkpoint, saved_activation_bytes
from collectives.parallel.tensor_parallel import Block, ParallelBlock
from tutorials.demos.common import run

WORLD_SIZE = 4
S, B, H, HEADS, FFN = 16, 2, 32, 8, 128      # as ch17_tensor
E = 8                                         # float64: bytes per value


def block(group, sp):
    torch.manual_seed(0)
    return ParallelBlock(Block(H, HEADS, FFN, dtype=torch.float64), group, "regather" if sp else False)


def forward(group, sp, recompute):
    """(bytes kept, the output, the input, the block) for one forward on this rank."""
    n, r = dist.get_world_size(group), dist.get_rank(group)
    model = block(group, sp)
    x = torch.randn(S, B, H, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    x = (x.chunk(n)[r] if sp else x).clone().requires_grad_()   # a block's input: the previous layer's output
    y, kept = saved_activation_bytes((lambda x: checkpoint(model, x)) if recompute else model, x,
                                     exclude=model.parameters())
    return kept, y, x, model


def demo(rank, world_size):
    groups = {n: dist.new_group(list(range(n))) for n in (1, 2, 4)}   # every rank creates every group
    if rank == 0:
        print(f"1. bytes rank 0 keeps for backward, one block (S={S}, B={B}, H={H}, {HEADS} heads, "
              f"MLP {FFN}), float64: measured / formula")
        print("   N   tensor parallel   sequence parallel   TP checkpointed   SP checkpointed")
    for n in (1, 2, 4):
        cells = []
        for recompute in (False, True):
            for sp in (False, True):
                if rank < n:
                    kept = forward(groups[n], sp, recompute)[0]
                    formula = E * block_activation_elements(S, B, H, HEADS, FFN, n, sp, recompute)
                    cells.append(f"{kept}/{formula}")
        if rank == 0:
            print(f"   {n}   {cells[0]:>15}   {cells[1]:>17}   {cells[2]:>15}   {cells[3]:>15}")
        collectives.barrier()

    grads, sent = {}, {}
    for recompute in (False, True):
        _, y, x, model = forward(groups[4], False, recompute)
        with collectives.count_traffic() as traffic:
            y.pow(2).sum().backward()
        grads[recompute] = [p.grad for p in model.parameters()] + [x.grad]
        sent[recompute] = traffic.sent_bytes
    if rank == 0:
        same = all(torch.equal(a, b) for a, b in zip(grads[False], grads[True]))
        print("2. one backward on 4 ranks, tensor parallel")
        print(f"   gradients with recomputation bitwise those without: {same}")
        print(f"   bytes rank 0 sends in backward: {sent[False]} without, {sent[True]} with "
              f"(the forward's 2 all_reduces again: 2 x 2(N-1)/N x S B H x 8 = {2 * 2 * 3 * S * B * H * E // 4})")


if __name__ == "__main__":
    run(demo, WORLD_SIZE)
