"""Fully sharded data parallel (collectives/parallel/fsdp.py).

* on 1-4 ranks (layers whose sizes do not divide by N, so pieces are padded), with and
  without prefetch: the parameters after three SGD-with-momentum steps equal one
  process training on all ranks' batches together. Not bitwise: the gradients of the
  ranks are summed by the ring reduce-scatter in another order than one process's
  backward sums the examples of its batch. In float64 each step's difference is a few
  ulps of the gradient (relative 1e-16); after three steps 1e-12 absolute leaves 4
  orders of magnitude of margin and still catches any missing or doubled piece;
* traffic of one training step: two all-gathers and one reduce-scatter per layer,
  3(N-1) x piece bytes in 3(N-1) messages per layer (chapter 18's formula);
* parameter bytes held: the pieces (about S/N) plus two neighbouring layers at the peak
  (the one computing and the one prefetched), one layer without prefetch.
"""
import math

import torch
import torch.distributed as dist
import torch.nn as nn

import collectives
from collectives.parallel.fsdp import FullyShardedDataParallel
from tests.worlds import run_world

STEPS, LR, MOMENTUM, BATCH = 3, 0.1, 0.9, 4


def layers():
    torch.manual_seed(0)
    return [nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 9), nn.Tanh(), nn.Linear(9, 3)]


def batch(rank, step):
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(BATCH, 5, generator=g, dtype=torch.float64), torch.randn(BATCH, 3, generator=g,
                                                                                dtype=torch.float64)


def loss_fn(y, t):
    return (y - t).pow(2).mean()


def reference(n):
    model = nn.Sequential(*layers()).double()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for step in range(STEPS):
        opt.zero_grad()
        xs, ts = zip(*[batch(r, step) for r in range(n)])
        loss_fn(model(torch.cat(xs)), torch.cat(ts)).backward()
        opt.step()
    return [p.detach() for p in model.parameters()]


def _fsdp(rank, n, group, prefetch):
    model = FullyShardedDataParallel([m.double() for m in layers()], group=group, prefetch=prefetch)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    traffic = None
    for step in range(STEPS):
        opt.zero_grad()
        x, t = batch(rank, step)
        with collectives.count_traffic() as counted:
            loss_fn(model(x), t).backward()
        traffic = traffic or counted
        opt.step()
    # the whole model, for the comparison: gather every layer's pieces
    full = []
    for i, shard in enumerate(model.shards):
        flat = torch.empty(shard.numel() * n, dtype=shard.dtype)
        collectives.all_gather(list(flat.split(shard.numel())), shard.detach(), group=group)
        full += list(model.params_of(i, flat).values())
    ref = reference(n)
    layer_bytes = [k * n * 8 for k in model.piece]
    return dict(diff=max((a - b).abs().max().item() for a, b in zip(full, ref)),
                shapes_ok=[a.shape for a in full] == [b.shape for b in ref],
                traffic=(traffic.sent_bytes, traffic.sent_messages, traffic.recv_bytes, traffic.recv_messages),
                pieces=list(model.piece),
                peak=model.peak_bytes, layer_bytes=layer_bytes,
                held_after=model.param_bytes())


def _worlds(rank, world_size):
    out = {}
    for n in (1, 2, 3, 4):
        group = dist.new_group(list(range(n)))
        for prefetch in (True, False):
            if rank < n:
                out[n, prefetch] = _fsdp(rank, n, group, prefetch)
        collectives.barrier()
    return out


def test_fsdp_equals_one_process_and_moves_three_halves_of_ddp():
    results = run_world(_worlds, 4)
    numels = [5 * 7 + 7, 7 * 9 + 9, 9 * 3 + 3]
    for rank, out in enumerate(results):
        for (n, prefetch), r in out.items():
            where = f"rank {rank}, N={n}, prefetch={prefetch}"
            assert r["shapes_ok"], where
            assert r["diff"] < 1e-12, f"{where}: differs from one process by {r['diff']}"
            pieces = [math.ceil(p / n) for p in numels]
            assert r["pieces"] == pieces, where
            sent = 3 * (n - 1) * sum(pieces) * 8
            msgs = 3 * (n - 1) * len(pieces)
            assert r["traffic"] == (sent, msgs, sent, msgs), where
            own = sum(pieces) * 8
            biggest = sorted(r["layer_bytes"])
            assert r["held_after"] == own, f"{where}: gathered layers left after the step"
            if prefetch:     # a layer computing while its neighbour's gather is in flight
                sizes = r["layer_bytes"]
                assert r["peak"] == own + max(a + b for a, b in zip(sizes, sizes[1:])), where
            else:
                assert r["peak"] == own + biggest[-1], where


def frozen_layers():
    """layers() with layer 0's weight frozen and layer 2 wholly frozen (torch's FSDP never moves either)."""
    model = [m.double() for m in layers()]
    model[0].weight.requires_grad_(False)
    for p in model[2].parameters():
        p.requires_grad_(False)
    return model


def _frozen(rank, world_size):
    out = {}
    for n in (1, 3):
        group = dist.new_group(list(range(n)))
        if rank < n:
            model = FullyShardedDataParallel(frozen_layers(), group=group)
            opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
            for step in range(STEPS):
                opt.zero_grad()
                x, t = batch(rank, step)
                loss_fn(model(x), t).backward()
                opt.step()
            trained = []
            for i, shard in enumerate(model.shards):
                flat = torch.empty(shard.numel() * n, dtype=shard.dtype)
                collectives.all_gather(list(flat.split(shard.numel())), shard.detach(), group=group)
                trained += [(model.units[i], name, v) for name, v in model.params_of(i, flat).items()]
            ref = nn.Sequential(*frozen_layers())
            opt = torch.optim.SGD([p for p in ref.parameters() if p.requires_grad], lr=LR, momentum=MOMENTUM)
            for step in range(STEPS):
                opt.zero_grad()
                xs, ts = zip(*[batch(r, step) for r in range(n)])
                loss_fn(ref(torch.cat(xs)), torch.cat(ts)).backward()
                opt.step()
            start = frozen_layers()
            out[n] = dict(
                frozen_same=[torch.equal(model.layers[j].get_parameter(name), start[j].get_parameter(name))
                             for j, name in [(0, "weight"), (2, "weight"), (2, "bias")]],
                trained=[(j, name) for j, name, _ in trained],
                diff=max((v - ref[j].get_parameter(name)).abs().max().item() for j, name, v in trained))
        collectives.barrier()
    return out


def test_fsdp_never_moves_frozen_parameters():
    for rank, out in enumerate(run_world(_frozen, 3)):
        for n, r in out.items():
            assert r["frozen_same"] == [True, True, True], (rank, n, r["frozen_same"])
            assert r["trained"] == [(0, "bias"), (4, "weight"), (4, "bias")], (rank, n, r["trained"])
            assert r["diff"] < 1e-12, (rank, n, r["diff"])


def _shards_after(rank, n, group, overlap, backwards):
    """This rank's pieces after STEPS steps of ``backwards`` accumulated backward passes each."""
    model = FullyShardedDataParallel([m.double() for m in layers()], group=group,
                                     overlap_reduce_scatter=overlap)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    with collectives.count_traffic() as counted:
        for step in range(STEPS):
            opt.zero_grad()
            x, t = batch(rank, step)
            for _ in range(backwards):
                loss_fn(model(x), t).backward()
            assert all(s.grad is not None for s in model.shards), "a gradient not ready when backward returned"
            opt.step()
    return [s.detach().clone() for s in model.shards], counted.sent_bytes, len(model.waits)


def _overlap_worlds(rank, world_size):
    out = {}
    for n in (1, 2, 3, 4):
        group = dist.new_group(list(range(n)))
        if rank < n:
            for backwards in (1, 2):
                plain, plain_bytes, _ = _shards_after(rank, n, group, False, backwards)
                over, over_bytes, waits = _shards_after(rank, n, group, True, backwards)
                out[n, backwards] = (all(torch.equal(a, b) for a, b in zip(plain, over)), plain_bytes, over_bytes,
                                     waits)
        collectives.barrier()
    return out


def test_reduce_scatter_overlapped_with_backward_gives_the_same_bits():
    for rank, out in enumerate(run_world(_overlap_worlds, 4)):
        assert sorted(out) == [(n, b) for n in range(rank + 1, 5) for b in (1, 2)]
        for (n, backwards), (same, plain_bytes, over_bytes, waits) in out.items():
            where = f"rank {rank}, N={n}, {backwards} backward(s) a step"
            assert same, f"{where}: overlapped reduce-scatters changed the parameters"
            assert over_bytes == plain_bytes, where
            # every unit (3) waits for its gather forward, again backward, and for its reduce-scatter
            assert waits == STEPS * backwards * 3 * 3, where
