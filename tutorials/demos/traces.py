"""Traced runs for the figures and notebooks: each returns every rank's messages on rank 0.

Functions here run inside a world started by ``tutorials.demos.common.run``;
they live in a module (not a notebook cell) because spawn pickles them by name.
"""
import time

import torch
import torch.distributed as dist
import torch.nn as nn

import collectives
from collectives.train.models import Net


def gather_to_rank0(items):
    """Concatenation of every rank's ``items`` on rank 0; None elsewhere."""
    everyone = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(list(items), everyone, dst=0)
    return sum(everyone, []) if dist.get_rank() == 0 else None


def all_reduce_trace(rank, world_size, algorithm, elements):
    """Messages of one all_reduce of ``elements`` float32 with ``algorithm``, after a warm-up."""
    x = torch.full((elements,), float(rank))
    collectives.all_reduce(x.clone(), algorithm=algorithm)   # first use opens the connections
    collectives.barrier()          # start together: the picture shows the algorithm, not stragglers
    with collectives.trace() as messages:
        collectives.all_reduce(x, algorithm=algorithm)
    return gather_to_rank0(messages.messages)


def all_reduce_traces(rank, world_size, algorithms, elements):
    """{algorithm: messages} on rank 0, one traced all_reduce each."""
    traces = {a: all_reduce_trace(rank, world_size, a, elements) for a in algorithms}
    return traces if rank == 0 else None


def training_step_trace(rank, world_size, bucket_cap_mb=0.05, batch=32):
    """One DataParallel training step of the MNIST net on random data, traced.

    Returns (messages, events, buckets, calls) on rank 0 (None elsewhere): events are
    (rank, time, label) for the start of forward, the start of backward, the
    moment autograd produced the last gradient and the return of backward, so
    the picture shows which bucket reductions overlapped with backward;
    buckets lists each bucket's parameter sizes, in the order they are reduced;
    calls are (rank, call number, start, end) of each rank's all_reduce calls
    (one per bucket).
    """
    torch.manual_seed(0)
    model = collectives.DataParallel(Net(), bucket_cap_mb=bucket_cap_mb, algorithm="ring")
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(batch, 1, 28, 28, generator=g), torch.randint(0, 10, (batch,), generator=g)
    events = []
    # conv1's weight is the first parameter, so its gradient is the last one autograd computes.
    model.module.conv1.weight.register_post_accumulate_grad_hook(
        lambda p: events.append((rank, time.time(), "last gradient computed")))
    nn.functional.cross_entropy(model(x), y).backward()    # warm-up step, untraced
    model.zero_grad()
    events.clear()
    collectives.barrier()
    with collectives.trace() as messages:
        events.append((rank, time.time(), "forward starts"))
        loss = nn.functional.cross_entropy(model(x), y)
        events.append((rank, time.time(), "backward starts"))
        loss.backward()
        events.append((rank, time.time(), "backward returns"))
    buckets = [[p.numel() for p in b.params] for b in model.buckets]
    calls = [(rank, c.seq, c.start, c.end) for c in messages.calls]
    messages, events, calls = (gather_to_rank0(r) for r in (messages.messages, events, calls))
    return (messages, events, buckets, calls) if rank == 0 else None


def train_mnist(rank, world_size, data_dir, steps, losses, subset=2048, batch_size=64):
    """Train the MNIST net with DataParallel for ``steps`` steps; rank 0 puts results on ``losses``.

    ``losses`` is a queue the notebook reads while training runs (the live curve):
    one (step, global batch's mean loss, [each rank's own loss]) per step, then None.
    """
    from collectives.train.data import load_mnist, prepare_mnist, train_loader
    if rank == 0:
        prepare_mnist(data_dir)            # unpack once (chapter 8) ...
    collectives.barrier()                  # ... while the others wait
    root = prepare_mnist(data_dir, download=False)
    dataset = load_mnist(root, subset=subset)
    loader = train_loader(dataset, batch_size, rank, world_size)
    torch.manual_seed(0)
    model = collectives.DataParallel(Net())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    step, epoch = 0, 0
    while step < steps:
        loader.sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            # Each rank's loss is its own shard's (chapter 8): gather them all, and their mean
            # is the global batch's loss.
            everyone = [torch.empty(1) for _ in range(world_size)]
            collectives.all_gather(everyone, loss.detach().reshape(1))
            if rank == 0:
                per_rank = [t.item() for t in everyone]
                losses.put((step, sum(per_rank) / world_size, per_rank))
            step += 1
            if step == steps:
                break
        epoch += 1
    if rank == 0:
        losses.put(None)
    return step


def training_step_traces(rank, world_size, caps):
    """{bucket_cap_mb: (messages, events, buckets, calls)} on rank 0, one traced step per cap."""
    traces = {cap: training_step_trace(rank, world_size, cap) for cap in caps}
    return traces if rank == 0 else None


def repeated_all_reduce_traces(rank, world_size, algorithms, elements, repeats):
    """{algorithm: [messages of call 1, call 2, ...]} on rank 0: ``repeats`` traced calls each.

    The algorithms take turns (a, b, a, b, ...), so a busy moment of the machine
    slows both alike; one call of 4 KiB on shared cores varies by several times.
    """
    traces = {a: [] for a in algorithms}
    for _ in range(repeats):
        for a in algorithms:
            traces[a].append(all_reduce_trace(rank, world_size, a, elements))
    return traces if rank == 0 else None


def broadcast_traces(rank, world_size, algorithms, elements):
    """{algorithm: messages} on rank 0, one traced broadcast from rank 0 each."""
    traces = {}
    for algorithm in algorithms:
        x = torch.full((elements,), float(rank))
        collectives.broadcast(x.clone(), src=0, algorithm=algorithm)   # warm-up
        collectives.barrier()
        with collectives.trace() as messages:
            collectives.broadcast(x, src=0, algorithm=algorithm)
        traces[algorithm] = gather_to_rank0(messages.messages)
    return traces if rank == 0 else None
