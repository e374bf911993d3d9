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

The tensor-parallel layer here is the minimal one the chapter describes: f (identity
forward, all-reduce backward) before a column-parallel matmul, g (all-reduce forward,
identity backward) after a row-parallel one; chapter 17's module
(``collectives.parallel.tensor_parallel``) builds the same operators.
"""
import math

import torch
import torch.distributed as dist
import torch.nn as nn

import collectives
from collectives.parallel.pipeline import PipelineStage
from tutorials.demos.common import run

WORLD_SIZE = 8
DP, PP, TP = 2, 2, 2
D, HEADS, T, BATCH, M, STEPS = 16, 4, 4, 8, 2, 3       # width, heads, tokens, global batch, micro-batches


class _F(torch.autograd.Function):
    """f: the input, unchanged, to every tensor-parallel rank; its gradients summed on the way back."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        if ctx.group is not None:
            grad = grad.contiguous().clone()
            collectives.all_reduce(grad, group=ctx.group, algorithm="ring")
        return grad, None


class _G(torch.autograd.Function):
    """g: the partial outputs of the tensor-parallel ranks summed; the gradient passed back unchanged."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous().clone()
        if group is not None:
            collectives.all_reduce(x, group=group, algorithm="ring")
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def full_weights():
    """The whole model's weights, float64, the same in every process."""
    g = torch.Generator().manual_seed(0)

    def w(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64) / math.sqrt(shape[-1])
    blocks = [dict(qkv=w(3 * D, D), o=w(D, D), w1=w(4 * D, D), w2=w(D, 4 * D),
                   b1=w(4 * D) / 4, b2=w(D) / 4, bo=w(D) / 4) for _ in range(PP)]
    return blocks, w(D, D)


def shard(full, t, tp):
    """Tensor-parallel rank t's share of a block's weights: its heads, its MLP columns."""
    part = D // tp                                         # this rank's share of the width
    rows, hidden = slice(t * part, (t + 1) * part), slice(t * 4 * part, (t + 1) * 4 * part)
    q, k, v = full["qkv"].split(D)
    return dict(qkv=torch.cat([q[rows], k[rows], v[rows]]),   # column-parallel: its heads' q, k, v
                o=full["o"][:, rows],                          # row-parallel: its heads' columns
                w1=full["w1"][hidden], b1=full["b1"][hidden],  # column-parallel
                w2=full["w2"][:, hidden],                      # row-parallel
                bo=full["bo"], b2=full["b2"])                  # added once, after the sum


class Block(nn.Module):
    """A pre-norm transformer block with tensor-parallel rank t's heads and MLP columns."""

    def __init__(self, full, t, tp, group):
        super().__init__()
        self.group, self.heads = group, HEADS // tp
        for name, value in shard(full, t, tp).items():
            setattr(self, name, nn.Parameter(value.clone()))
        self.norm1 = nn.LayerNorm(D, dtype=torch.float64)
        self.norm2 = nn.LayerNorm(D, dtype=torch.float64)

    def forward(self, x):
        b, n, _ = x.shape
        h = _F.apply(self.norm1(x), self.group)
        q, k, v = (h @ self.qkv.t()).view(b, n, 3, self.heads, D // HEADS).permute(2, 0, 3, 1, 4)
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(D // HEADS), dim=-1) @ v
        att = att.transpose(1, 2).reshape(b, n, -1)
        x = x + _G.apply(att @ self.o.t(), self.group) + self.bo
        h = _F.apply(self.norm2(x), self.group)
        h = torch.nn.functional.gelu(h @ self.w1.t() + self.b1)
        return x + _G.apply(h @ self.w2.t(), self.group) + self.b2


class Stage(nn.Module):
    def __init__(self, p, t, tp, group):
        super().__init__()
        blocks, head = full_weights()
        self.block = Block(blocks[p], t, tp, group)
        self.head = nn.Parameter(head.clone()) if p == PP - 1 else None

    def forward(self, x):
        x = self.block(x)
        return x @ self.head.t() if self.head is not None else x


def data(step):
    g = torch.Generator().manual_seed(100 + step)
    return (torch.randn(BATCH, T, D, generator=g, dtype=torch.float64),
            torch.randn(BATCH, T, D, generator=g, dtype=torch.float64))


def one_process():
    """The reference: the whole model (tensor-parallel size 1, no messages), the whole batch."""
    stages = [Stage(p, 0, 1, None) for p in range(PP)]
    params = [q for s in stages for q in s.parameters()]
    opt = torch.optim.SGD(params, lr=0.1)
    for step in range(STEPS):
        opt.zero_grad()
        x, target = data(step)
        for s in stages:
            x = s(x)
        nn.functional.mse_loss(x, target).backward()
        opt.step()
    return stages


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
    stage = Stage(p, t, TP, groups["tp"][0])
    pipe = PipelineStage(stage, recv_shape=(BATCH // DP // M, T, D), group=groups["pp"][0], dtype=torch.float64)
    opt = torch.optim.SGD(stage.parameters(), lr=0.1)
    for step in range(STEPS):
        opt.zero_grad()
        x, target = data(step)
        mine = slice(d * BATCH // DP, (d + 1) * BATCH // DP)      # this replica's half of the batch
        with collectives.trace() as records:
            pipe.step(M, list(x[mine].chunk(M)) if p == 0 else None,
                      list(target[mine].chunk(M)) if p == PP - 1 else None, nn.functional.mse_loss)
            grads = torch.cat([q.grad.flatten() for q in stage.parameters()])   # one bucket
            collectives.all_reduce(grads, group=groups["dp"][0], algorithm="ring")
            grads /= DP
            offset = 0
            for q in stage.parameters():
                q.grad.copy_(grads[offset:offset + q.numel()].view_as(q))
                offset += q.numel()
        opt.step()

    # 2. the same as one process? this rank's slices against the same slices of its trained model
    whole = one_process()[p]
    trained = {n: q.detach() for n, q in whole.block.named_parameters()}
    expected = {**shard(trained, t, TP), **{n: q for n, q in trained.items() if n.startswith("norm")}}
    if p == PP - 1:
        expected["head"] = whole.head.detach()
    mine = {n.removeprefix("block."): q.detach() for n, q in stage.named_parameters()}
    diff = max((mine[n] - expected[n]).abs().max().item() for n in mine)

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
        print("   rank   pipeline      tensor parallel   data parallel  | formulas: m A, 4 m A, 8 P")
        for r, (*_, kinds, params) in enumerate(everyone):
            cells = "  ".join(f"{kinds[k][0]:7d} ({kinds[k][1]:2d})" for k in ("pipeline", "tensor", "data"))
            print(f"   {r:4d}   {cells}   |  {M * a}, {4 * M * a}, {params * 8} (P = {params} values)")


if __name__ == "__main__":
    run(demo, WORLD_SIZE)
