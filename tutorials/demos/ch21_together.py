"""Chapter 21: a small transformer on 8 ranks, 2 (data) x 2 (tensor) x 2 (pipeline).

    python -m tutorials.demos.ch21_together

Rank r is (d, p, t) = (r // 4, r // 2 % 2, r % 2): data-parallel replica d, pipeline
stage p (one transformer block each; the last also the output layer), tensor-parallel
rank t (half of the block's heads and half of its MLP).

1. The layout: each rank's coordinates and groups.
2. Three SGD steps against one process running the whole model on the whole batch.
3. One step's traffic per rank, by kind (pipeline messages, tensor-parallel all-reduces,
   the data-parallel all-reduce of the gradients), counted from a trace, against the
   formulas of the chapter.

The pieces: ``collectives.parallel.pipeline`` (chapter 16) for the stages,
``collectives.parallel.tensor_parallel`` (chapter 17) for each stage's block, and one
``collectives.all_reduce`` of the gradients per step between the replicas (chapter 6).
"""
import copy

import torch
import torch.distributed as dist
import torch.nn as nn

import collectives
from collectives.parallel.pipeline import PipelineStage
from collectives.parallel.tensor_parallel import Block, ParallelBlock
from tutorials.demos.common import run

WORLD_SIZE = 8
DP, PP, TP = 2, 2, 2
D, HEADS, T, BATCH, M, STEPS = 16, 4, 4, 8, 2, 3       # width, heads, tokens, global batch, micro-batches


def whole_model():
    """The one-process model, float64, the same in every process: a block per stage, an output layer."""
    torch.manual_seed(0)
    return [Block(D, HEADS, 4 * D, dtype=torch.float64) for _ in range(PP)], nn.Linear(D, D, dtype=torch.float64)


class Stage(nn.Module):
    """Pipeline stage p on tensor-parallel rank t: its share of block p (and the output layer, replicated)."""

    def __init__(self, block, head, group):
        super().__init__()
        self.block = ParallelBlock(block, group)       # this rank's heads and MLP columns
        self.head = copy.deepcopy(head)

    def forward(self, x):
        x = self.block(x)
        return self.head(x) if self.head is not None else x


def data(step):
    """(tokens, batch, width): the layout of chapter 17's blocks."""
    g = torch.Generator().manual_seed(100 + step)
    return (torch.randn(T, BATCH, D, generator=g, dtype=torch.float64),
            torch.randn(T, BATCH, D, generator=g, dtype=torch.float64))


def one_process():
    """The reference: the whole model, no messages, the whole batch at once."""
    blocks, head = whole_model()
    model = nn.Sequential(*blocks, head)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        opt.zero_grad()
        x, target = data(step)
        nn.functional.mse_loss(model(x), target).backward()
        opt.step()
    return blocks, head


def demo(rank, world_size):
    d, p, t = rank // 4, rank // 2 % 2, rank % 2
    # every rank creates every group, in the same order (torch's rule for new_group)
    groups = {}
    for kind, members in [("tp", [[4 * a + 2 * b, 4 * a + 2 * b + 1] for a in range(DP) for b in range(PP)]),
                          ("pp", [[4 * a + c, 4 * a + 2 + c] for a in range(DP) for c in range(TP)]),
                          ("dp", [[2 * b + c, 4 + 2 * b + c] for b in range(PP) for c in range(TP)])]:
        for ranks in members:
            group = dist.new_group(ranks)
            if rank in ranks:
                groups[kind] = (group, ranks)
    blocks, head = whole_model()
    stage = Stage(blocks[p], head if p == PP - 1 else None, groups["tp"][0])
    pipe = PipelineStage(stage, recv_shape=(T, BATCH // DP // M, D), group=groups["pp"][0], dtype=torch.float64)
    opt = torch.optim.SGD(stage.parameters(), lr=0.1)
    for step in range(STEPS):
        opt.zero_grad()
        x, target = data(step)
        mine = slice(d * BATCH // DP, (d + 1) * BATCH // DP)      # this replica's half of the batch
        with collectives.trace() as records:
            pipe.step(M, list(x[:, mine].chunk(M, dim=1)) if p == 0 else None,
                      list(target[:, mine].chunk(M, dim=1)) if p == PP - 1 else None, nn.functional.mse_loss)
            grads = torch.cat([q.grad.flatten() for q in stage.parameters()])   # one bucket
            collectives.all_reduce(grads, group=groups["dp"][0], algorithm="ring")
            grads /= DP
            offset = 0
            for q in stage.parameters():
                q.grad.copy_(grads[offset:offset + q.numel()].view_as(q))
                offset += q.numel()
        opt.step()

    # 2. the same as one process? this rank's share against the same share of the trained model
    trained_blocks, trained_head = one_process()
    expected = Stage(trained_blocks[p], trained_head if p == PP - 1 else None, groups["tp"][0])
    diff = max((a - b).abs().max().item() for a, b in zip(stage.parameters(), expected.parameters()))

    # 3. the last step's messages, by kind
    kinds = {"pipeline": [0, 0], "tensor": [0, 0], "data": [0, 0]}
    for msg in records.messages:
        if msg.kind != "send":
            continue
        kind = ("pipeline" if msg.collective == "send_recv" else
                "tensor" if msg.dst in groups["tp"][1] else "data")
        kinds[kind][0] += msg.nbytes
        kinds[kind][1] += 1
    params = sum(q.numel() for q in stage.parameters())
    row = (d, p, t, groups["tp"][1], groups["pp"][1], groups["dp"][1], diff, kinds, params)
    everyone = [None] * world_size
    dist.all_gather_object(everyone, row)        # for printing only
    if rank == 0:
        print("1. rank: (data, pipeline, tensor) coordinates; its tensor, pipeline and data groups")
        for r, (d_, p_, t_, tg, pg, dg, *_) in enumerate(everyone):
            print(f"   rank {r}: ({d_}, {p_}, {t_})  tensor {tg}  pipeline {pg}  data {dg}")
        print(f"2. {STEPS} SGD steps on a batch of {BATCH} sequences of {T} tokens, width {D}, {HEADS} heads, "
              f"{PP} blocks, float64")
        print(f"   every rank's parameters equal the same slices of one process's model, "
              f"within 1e-12: {all(r[6] < 1e-12 for r in everyone)}")
        a = BATCH // DP // M * T * D * 8
        print(f"3. one step's bytes sent (messages) per rank, by kind; A = {a} bytes per micro-batch's activation")
        print("   rank   pipeline      tensor parallel   data parallel  | formulas: m A + 16 (the step's check), "
              "4 m A + 256 m (TP-1) (the input check), 8 P")
        for r, (*_, kinds, params) in enumerate(everyone):
            cells = "  ".join(f"{kinds[k][0]:7d} ({kinds[k][1]:2d})" for k in ("pipeline", "tensor", "data"))
            print(f"   {r:4d}   {cells}   |  {M * a + 16}, {4 * M * a + 256 * M * (TP - 1)}, {params * 8} (P = {params} values)")


if __name__ == "__main__":
    run(demo, WORLD_SIZE)
