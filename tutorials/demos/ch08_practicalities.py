"""Chapter 8: the everyday rules of a multi-process program.

    python -m tutorials.demos.ch08_practicalities

1. Each rank's loss is its own shard's: all_reduce it (AVG) to log the global batch's loss,
   then log and draw progress bars on rank 0 only.
2. Rank 0 prepares the data while the others wait at a barrier.
3. Rank 0 writes the checkpoint, everyone waits, then everyone may read it.
4. Ranks that call different collectives: ``COLLECTIVES_DEBUG=1`` names the mismatch at once.
"""
import os
import shutil
import tempfile

import torch
import torch.distributed as dist
from tqdm import tqdm

import collectives
from tutorials.demos.common import print_ranks, run

WORLD_SIZE = 2


def log(*args):
    """print, on rank 0 only: N ranks printing the same line is N times the noise."""
    if dist.get_rank() == 0:
        print(*args, flush=True)


def demo(rank, world_size):
    # 1. In synchronous SGD every rank computes the loss of its own shard of the
    # batch: the values differ. The gradients are averaged; the loss is not,
    # unless we do it. To log the global batch's loss, average it: every rank
    # must call the all_reduce (inside "if rank == 0" it would hang).
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)                  # the same weights on every rank
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)   # the global batch
    shard = slice(rank * 8 // world_size, (rank + 1) * 8 // world_size)
    loss = torch.nn.functional.mse_loss(model(x[shard]), y[shard])
    log("1. every rank computes the loss of its own shard of the batch:")
    print_ranks(f"loss of my shard {loss.item():.4f}")
    logged = loss.detach().clone()                 # a copy: the graph and loss itself stay as they are
    collectives.all_reduce(logged, op=dist.ReduceOp.AVG)
    whole = torch.nn.functional.mse_loss(model(x), y).item()
    log(f"   all_reduce(AVG) of the shard losses: {logged.item():.4f}; loss of the whole batch "
        f"in one process: {whole:.4f}")
    # tqdm draws on stderr; disable it everywhere but rank 0.
    total = torch.zeros(1)
    for step in tqdm(range(5), desc="training", disable=rank != 0):
        t = torch.tensor([float(step)])
        collectives.all_reduce(t)
        total += t
    log(f"   five steps with a progress bar on rank 0; sum of all_reduce results: {total.item():g} "
        f"(= {world_size} x (0+1+2+3+4))")

    # Every rank needs the same directory: rank 0 makes it and broadcasts its name.
    holder = [tempfile.mkdtemp() if rank == 0 else None]
    dist.broadcast_object_list(holder, src=0)
    workdir = holder[0]

    # 2. Only one process should download or unpack a data set: the others would
    # race on the same files. They wait at the barrier until rank 0 is done.
    data_file = os.path.join(workdir, "data.pt")
    if rank == 0:
        torch.save(torch.arange(10.0), data_file)
    collectives.barrier()
    data = torch.load(data_file)
    log("2. rank 0 prepared the data, the others waited at a barrier, then all loaded it:")
    print_ranks(f"{len(data)} samples, sum {data.sum().item():g}")

    # 3. Checkpoint: every rank holds the same weights, so one writes them.
    # The barrier keeps any rank from reading (or deleting) a half-written file.
    weights = torch.full((3,), 0.5)
    path = os.path.join(workdir, "checkpoint.pt")
    if rank == 0:
        torch.save({"weights": weights, "step": 5}, path)
    collectives.barrier()
    loaded = torch.load(path)
    log("3. rank 0 saved a checkpoint, barrier, every rank reads it back:")
    print_ranks(f"step {loaded['step']}, weights {loaded['weights'].tolist()}")
    collectives.barrier()
    if rank == 0:
        shutil.rmtree(workdir)

    # 4. The classic hang: one rank's tensor has a different shape (say, a last
    # batch that is one sample short). Unchecked, both ranks would wait for
    # messages that never match, until COLLECTIVES_TIMEOUT; with
    # COLLECTIVES_DEBUG=1 the ranks compare the call first and every rank raises.
    os.environ["COLLECTIVES_DEBUG"] = "1"
    group = dist.new_group()     # calls are numbered per group: this one's first call is #0
    try:
        collectives.all_reduce(torch.ones(4 if rank == 0 else 3), group=group, algorithm="ring")
        outcome = "no error"
    except collectives.DesyncError as error:
        outcome = str(error)
    finally:
        del os.environ["COLLECTIVES_DEBUG"]
    log("4. rank 0 all_reduces 4 elements, rank 1 only 3; with COLLECTIVES_DEBUG=1:")
    log(outcome)

if __name__ == "__main__":
    run(demo, WORLD_SIZE)
