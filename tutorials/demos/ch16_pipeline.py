"""Chapter 16: pipeline parallelism, four stages on four processes.

    python -m tutorials.demos.ch16_pipeline

1. The order of work on each stage, GPipe and 1F1B, for p = 4 stages and m = 6 micro-batches.
2. Three SGD steps of a 4-block MLP cut into 4 stages, both schedules, against one process
   running the same micro-batches one after another: the parameters, compared bitwise.
3. The messages of one step on each stage, counted, against m x A + 16 (the check) per neighbour and direction.
4. Activations each stage held at once: m with GPipe, p - s with 1F1B.
"""
import torch
import torch.distributed as dist
import torch.nn as nn

import collectives
from collectives.parallel.pipeline import PipelineStage, gpipe, one_f_one_b
from tutorials.demos.common import run

WORLD_SIZE = 4          # stages
M = 6                   # micro-batches
WIDTH, BATCH, STEPS = 16, 12, 3


def blocks():
    torch.manual_seed(0)    # the same model in every process; stage s keeps block s
    return [nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh()) for _ in range(WORLD_SIZE)]


def batch(step):
    g = torch.Generator().manual_seed(step)
    return torch.randn(BATCH, WIDTH, generator=g), torch.randn(BATCH, WIDTH, generator=g)


def one_process():
    """The reference: the whole model, the micro-batches in turn, gradients accumulated."""
    model = nn.Sequential(*blocks())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        opt.zero_grad()
        x, t = batch(step)
        for xi, ti in zip(x.chunk(M), t.chunk(M)):
            (nn.functional.mse_loss(model(xi), ti) / M).backward()
        opt.step()
    return model


def train(rank, p, schedule):
    block = blocks()[rank]
    stage = PipelineStage(block, recv_shape=(BATCH // M, WIDTH))
    opt = torch.optim.SGD(block.parameters(), lr=0.1)
    for step in range(STEPS):
        opt.zero_grad()
        x, t = batch(step)
        with collectives.count_traffic() as traffic:
            stage.step(M, list(x.chunk(M)) if stage.first else None, list(t.chunk(M)) if stage.last else None,
                       nn.functional.mse_loss, schedule)
        opt.step()
    return block, stage.peak_held, traffic


def demo(rank, p):
    if rank == 0:
        print(f"1. the order of work on each stage, p = {p}, m = {M}")
        for name, schedule in (("GPipe", gpipe), ("1F1B", one_f_one_b)):
            for s in range(p):
                print(f"   {name:5s} stage {s}: {' '.join(f'{k}{i}' for k, i in schedule(p, M, s))}")
    reference = one_process()
    rows = {}
    for schedule in ("gpipe", "1f1b"):
        block, held, traffic = train(rank, p, schedule)
        mine = list(block.parameters())
        theirs = list(reference[rank].parameters())
        same = all(torch.equal(a, b) for a, b in zip(mine, theirs))
        rows[schedule] = (same, held, traffic.sent_messages, traffic.sent_bytes, traffic.recv_bytes)
    everyone = [None] * p
    dist.all_gather_object(everyone, rows)      # for printing only
    if rank == 0:
        print(f"2. {STEPS} SGD steps, {p} stages, {M} micro-batches of {BATCH // M}x{WIDTH} float32: "
              f"parameters bitwise equal to one process")
        for schedule in ("gpipe", "1f1b"):
            print(f"   {schedule:5s}: {[r[schedule][0] for r in everyone]}")
        a = BATCH // M * WIDTH * 4
        print(f"3. one step's messages per stage (A = {a} bytes per activation or gradient)")
        print("   stage   sent   bytes sent   bytes received   (m x A + 16) x (neighbours): data + the check")
        for s, r in enumerate(everyone):
            _, _, msgs, sent, recvd = r["1f1b"]
            neighbours = (s > 0) + (s < p - 1)
            print(f"   {s:5d}   {msgs:4d}   {sent:10d}   {recvd:14d}   {(M * a + 16) * neighbours:20d}")
        print("4. activations held at once, per stage")
        for schedule in ("gpipe", "1f1b"):
            print(f"   {schedule:5s}: {[r[schedule][1] for r in everyone]}")


if __name__ == "__main__":
    run(demo, WORLD_SIZE)
