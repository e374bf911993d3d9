"""Chapter 17: tensor and sequence parallelism, a transformer block cut over the ranks.

    python -m tutorials.demos.ch17_tensor

1. Three SGD steps on one transformer block, in one process and cut over groups of 2 and
   4 ranks (tensor parallel, then sequence parallel): the same parameters.
2. The bytes each rank sends for one training step, counted, against the formula.
3. The activations each rank keeps for backward, measured, as the group grows; "regathered"
   is sequence parallelism keeping only its shard of each linear's input (Megatron's way).
"""
import torch
import torch.distributed as dist

import collectives
from collectives.parallel.recompute import saved_activation_bytes
from collectives.parallel.tensor_parallel import Block, ParallelBlock, reduce_replicated_grads
from tutorials.demos.common import run

WORLD_SIZE = 4
S, B, H, HEADS, FFN = 16, 2, 32, 8, 128      # sequence, batch, hidden, heads, MLP width
E = 8                                         # float64: bytes per value


def make_block():
    torch.manual_seed(0)                      # the same whole block on every rank
    return Block(H, HEADS, FFN, dtype=torch.float64)


def step(model, group, sp, seed):
    """One SGD step; with sequence parallelism each rank feeds and scores its S/N positions."""
    g = torch.Generator().manual_seed(seed)
    x, target = (torch.randn(S, B, H, generator=g, dtype=torch.float64) for _ in range(2))
    if sp:
        n, r = dist.get_world_size(group), dist.get_rank(group)
        x, target = x.chunk(n)[r], target.chunk(n)[r]
    model.zero_grad()
    (((model(x) - target) ** 2).sum() / (S * B * H)).backward()
    if sp:
        reduce_replicated_grads(model, group)
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.1 * p.grad


def saved_bytes(model, group, sp):
    """Bytes of the activations autograd keeps for backward during one forward pass: each
    storage once (the attention output is saved in two shapes of one storage), the
    parameters' storages left out (they are not activations and do not shrink with S x B)."""
    n, r = dist.get_world_size(group), dist.get_rank(group)
    x = torch.randn(S, B, H, dtype=torch.float64)
    x = (x.chunk(n)[r] if sp else x).clone()   # its own storage, as the previous layer's output is
    return saved_activation_bytes(model, x, exclude=model.parameters())[1]


def demo(rank, world_size):
    groups = {n: dist.new_group(list(range(n))) for n in (1, 2, 4)}   # every rank creates every group
    reference = make_block()
    for seed in range(3):
        step(reference, None, False, seed)    # a plain Block: one process, no messages
    if rank == 0:
        print(f"1. 3 SGD steps on a block (S={S}, B={B}, H={H}, {HEADS} heads, MLP {FFN}), float64")
    for n in (2, 4):
        for sp in (False, True):
            if rank < n:
                model = ParallelBlock(make_block(), groups[n], sp)
                for seed in range(3):
                    step(model, groups[n], sp, seed)
            if rank == 0:
                whole = ParallelBlock(reference, groups[n], sp).state_dict()   # rank 0's cut of the reference
                diff = max((a - whole[k]).abs().max().item() for k, a in model.state_dict().items())
                kind = "sequence parallel" if sp else "tensor parallel  "
                print(f"   {kind} on {n} ranks: largest difference from one process below 1e-12: {diff < 1e-12}")

    a = S * B * H * E
    rows = []
    for sp in (False, True, "regather"):
        model = ParallelBlock(make_block(), None, sp)
        with collectives.count_traffic() as t:
            step(model, None, sp, 0)
        rows.append((t.sent_bytes, t.sent_messages))
    if rank == 0:
        n = world_size
        print(f"2. bytes rank 0 sends in one step, N = {n}, A = S x B x H x 8 = {a} bytes of activation")
        print(f"   tensor parallel:   {rows[0][0]} in {rows[0][1]} messages; 4 all_reduces "
              f"+ the input check (N-1 lines of 256 bytes): 8(N-1)/N x A + {(n - 1) * 256} "
              f"= {8 * (n - 1) * a // n + (n - 1) * 256} in 8(N-1) + N-1 = {9 * (n - 1)}")
        print(f"   sequence parallel: {rows[1][0]} in {rows[1][1]} messages; 4 all_gathers + 4 reduce_scatters "
              f"+ the LayerNorm and bias gradients (6H values) + the input check: "
              f"{8 * (n - 1) * a // n} + {2 * (n - 1) * 6 * H * E // n} + {(n - 1) * 256} "
              f"in {8 * (n - 1)} + {2 * (n - 1)} + {n - 1}")
        print(f"   the same, regathered:  {rows[2][0]} in {rows[2][1]} messages; 2 all_gathers more in backward: "
              f"+ 2(N-1)/N x A = {2 * (n - 1) * a // n} in 2(N-1) = {2 * (n - 1)}")

    kept = {}
    for n in (1, 2, 4):
        for sp in (False, True, "regather"):
            if rank < n:
                kept[(n, sp)] = saved_bytes(ParallelBlock(make_block(), groups[n], sp), groups[n], sp)
    if rank == 0:
        print("3. bytes rank 0 keeps for backward in one forward pass of the block")
        print("   N   tensor parallel   sequence parallel   regathered")
        for n in (1, 2, 4):
            print(f"   {n}   {kept[(n, False)]:15d}   {kept[(n, True)]:17d}   {kept[(n, 'regather')]:10d}")


if __name__ == "__main__":
    run(demo, WORLD_SIZE)
