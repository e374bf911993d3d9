"""Chapter 23: the planner's memory per rank against a real run, kind by kind.

    python -m tutorials.demos.ch23_check

A 2-block transformer (hidden 64, 4 heads, 16 tokens x 4 sequences per step, float32,
Adam) is trained for one step on 4 ranks in five configurations, the way
``python -m benchmarks.plan_check`` does it: data parallel with ZeRO-2, ZeRO-3 (FSDP),
tensor parallel with sequence parallelism, the same with every block recomputed, and a
2-stage 1F1B pipeline with 2 data-parallel replicas. Each rank measures what it holds
after the step (parameters, gradients, Adam's state) and the peak of the activation bytes
autograd kept during it; rank 0 prints the largest rank's figures beside
``collectives.plan.memory``. Bytes, not times: they are the same on every run.
"""
import torch.distributed as dist

from benchmarks.plan_check import KINDS, model_of, worker
from collectives.plan import Config, memory
from tutorials.demos.common import run

WORLD_SIZE = 4
DIMS = (2, 64, 4, 16, 4)         # layers, hidden, heads, tokens, sequences per step
CONFIGS = [Config(4, 1, 1, 1, zero=2), Config(4, 1, 1, 1, zero=3), Config(1, 4, 1, 1),
           Config(1, 4, 1, 1, recompute=True), Config(2, 1, 2, 1)]


def demo(rank, world_size):
    _, rows = worker(rank, world_size, DIMS, 1, CONFIGS)
    everyone = [None] * world_size
    dist.all_gather_object(everyone, rows)           # for printing only
    if rank != 0:
        return
    model = model_of(*DIMS)
    print(f"P = {int(model.params)} parameters; bytes per rank (the largest of the 4): measured / planned")
    print(f"{'configuration':<31}" + "".join(f"{k:>20}" for k in KINDS))
    for i, config in enumerate(CONFIGS):
        planned = memory(model, config)
        cells = []
        for kind in KINDS:
            measured = max(rows[i][kind] for rows in everyone)
            cells.append(f"{measured:>9}/{planned[kind]:<9.0f} ")
        print(f"{str(config):<31}" + "".join(f"{c:>20}" for c in cells))


if __name__ == "__main__":
    run(demo, WORLD_SIZE)
