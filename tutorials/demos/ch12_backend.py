"""Chapter 12: your own DDP and FSDP program, unmodified, on the algorithms of this course.

    python -m tutorials.demos.ch12_backend

1. torch's DistributedDataParallel on backend="collectives": one step's messages.
2. The same 20 steps on backend="gloo": the parameters agree.
3. FSDP2's fully_shard: which of our collectives one step uses, and their bytes.
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

import collectives  # registers the "collectives" backend
from collectives.train.models import Net
from tutorials.demos.common import run

WORLD_SIZE = 4


def batch(rank, step, n=8):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g)


def train_step(model, opt, rank, step):
    x, y = batch(rank, step)
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()


def table(messages, rank):
    """Rows (collective, algorithm, messages sent, bytes sent) from this rank's trace."""
    rows = {}
    for m in messages:
        if m.kind == "send":
            row = rows.setdefault((m.collective, m.algorithm), [0, 0])
            row[0] += 1
            row[1] += m.nbytes
    return [(c, a, n, b) for (c, a), (n, b) in sorted(rows.items())]


def program(rank, world_size):
    # 1. Plain torch DDP. The only change from a gloo program is the backend's name,
    #    given to init_process_group by the launcher (see main below).
    torch.manual_seed(0)
    model = DDP(Net())
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for step in range(2):              # DDP settles its gradient buckets in these
        train_step(model, opt, rank, step)
    with collectives.trace() as messages:
        train_step(model, opt, rank, 2)
    grads = sum(p.numel() for p in model.parameters()) * 4
    ddp_rows = table(messages, rank)

    # 2. The same training on a gloo group of the same ranks.
    gloo = dist.new_group(list(range(world_size)), backend="gloo")
    torch.manual_seed(0)
    reference = DDP(Net(), process_group=gloo)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)
    for step in range(3, 20):
        train_step(model, opt, rank, step)
    for step in range(20):
        train_step(reference, ref_opt, rank, step)
    diff = max((p - q).abs().max().item() for p, q in zip(model.parameters(), reference.parameters()))

    # 3. FSDP2: parameters sharded over the ranks, gathered for each layer's compute.
    torch.manual_seed(0)
    sharded = Net()
    mesh = init_device_mesh("cpu", (world_size,))
    for layer in (sharded.conv1, sharded.conv2, sharded.fc1, sharded.fc2):
        fully_shard(layer, mesh=mesh)
    fully_shard(sharded, mesh=mesh)
    fsdp_opt = torch.optim.SGD(sharded.parameters(), lr=0.05)
    train_step(sharded, fsdp_opt, rank, 0)
    with collectives.trace() as messages:
        train_step(sharded, fsdp_opt, rank, 1)
    fsdp_rows = table(messages, rank)

    if rank == 0:
        print(f"1. torch DDP, {world_size} ranks, backend={dist.get_backend()!r}: one step, rank 0 sent")
        print(f"   {'collective':<15}{'algorithm':<20}{'messages':>9}{'bytes':>10}")
        for c, a, n, b in ddp_rows:
            print(f"   {c:<15}{a:<20}{n:>9}{b:>10}")
        chunks = [len(c) for c in torch.empty(grads // 4).tensor_split(world_size)]
        print(f"   gradients: one bucket of S = {grads} bytes; ring card: 2(N-1) = {2 * (world_size - 1)} "
              f"messages, 2(N-1)/N * S = {2 * (world_size - 1) * grads / world_size:.0f} bytes")
        print(f"   exactly: chunks of {chunks} floats; rank 0 sends every chunk but chunk 0, then every one but chunk 1: "
              f"{4 * (2 * sum(chunks) - chunks[0] - chunks[1])} bytes")
        print(f"2. after 20 steps, max |ours - gloo| over all parameters: {diff:.1e}")
        print("3. FSDP2 fully_shard, one step, rank 0 sent")
        print(f"   {'collective':<15}{'algorithm':<20}{'messages':>9}{'bytes':>10}")
        for c, a, n, b in fsdp_rows:
            print(f"   {c:<15}{a:<20}{n:>9}{b:>10}")


def main():
    run(program, WORLD_SIZE, backend="collectives", env={"COLLECTIVES_ALGO": "all_reduce:ring"})


if __name__ == "__main__":
    main()
