"""Data-parallel SGD built on our all_reduce agrees with the things it imitates.

One world of 3 ranks runs every case (starting a world costs seconds). After a
few steps of momentum SGD, parameters from our naive and bucketed
DataParallel, and from the tutorial's average_gradients loop, must match
(a) single-process SGD on the concatenated global batch and (b) torch's own
DistributedDataParallel on the same shards, with gloo and with our all_reduce
as its communication hook.
"""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.testing import assert_close

import collectives
from collectives.train.models import Net
from tests.worlds import run_world

STEPS, PER_RANK = 3, 4


def _batches(world_size):
    g = torch.Generator().manual_seed(123)
    x = torch.randn(STEPS, PER_RANK * world_size, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (STEPS, PER_RANK * world_size), generator=g)
    return x, y


def _fresh(seed):
    torch.manual_seed(seed)
    return Net()


def _train(model, xs, ys, after_backward=lambda: None):
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for x, y in zip(xs, ys):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        after_backward()
        opt.step()
    # numpy, not tensors: torch tensors cross the result queue as shared memory,
    # which vanishes when the worker process exits.
    return [p.detach().numpy().copy() for p in model.parameters()]


def _equivalence(rank, world_size):
    x, y = _batches(world_size)
    mine = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
    xs, ys = x[:, mine], y[:, mine]
    results = {"single process, global batch": _train(_fresh(0), x, y)}

    # Ranks start from different weights (seed = rank): construction must fix that.
    dp = collectives.DataParallel(_fresh(rank), bucket_cap_mb=0.05)
    assert len(dp.buckets) > 1
    results["DataParallel bucketed"] = _train(dp, xs, ys)
    results["DataParallel bucketed, ring"] = _train(
        collectives.DataParallel(_fresh(rank), bucket_cap_mb=0.05, algorithm="ring"), xs, ys)
    results["DataParallel one bucket"] = _train(collectives.DataParallel(_fresh(rank)), xs, ys)
    results["NaiveDataParallel"] = _train(collectives.NaiveDataParallel(_fresh(rank)), xs, ys)

    model = _fresh(0)
    results["average_gradients"] = _train(model, xs, ys, lambda: collectives.average_gradients(model))

    ddp = torch.nn.parallel.DistributedDataParallel(_fresh(0))
    results["torch DDP (gloo)"] = _train(ddp, xs, ys)
    ddp = torch.nn.parallel.DistributedDataParallel(_fresh(0), bucket_cap_mb=0.05)
    ddp.register_comm_hook(state=None, hook=collectives.ddp_comm_hook("ring"))
    results["torch DDP + ddp_comm_hook"] = _train(ddp, xs, ys)
    return results


@pytest.mark.slow
def test_data_parallel_matches_single_process_and_torch_ddp():
    per_rank = run_world(_equivalence, 3)
    reference = per_rank[0]["single process, global batch"]
    for rank, results in enumerate(per_rank):
        for name, params in results.items():
            for p, q in zip(params, reference):
                assert_close(torch.from_numpy(p), torch.from_numpy(q), rtol=1e-5, atol=1e-6,
                             msg=lambda m: f"rank {rank}, {name}: {m}")
    # Every rank holds bitwise the same parameters (all_reduce gives identical results).
    for name in per_rank[0]:
        for results in per_rank[1:]:
            assert all((p == q).all() for p, q in zip(results[name], per_rank[0][name])), name


class _Branches(nn.Module):
    """Rank-dependent control flow: rank 0 uses head a, other ranks head b, nobody head c."""

    def __init__(self):
        super().__init__()
        self.trunk = nn.Linear(4, 4)
        self.a, self.b, self.c = nn.Linear(4, 1), nn.Linear(4, 1), nn.Linear(4, 1)
        self.register_buffer("count", torch.zeros(1))

    def forward(self, x, rank):
        h = self.trunk(x)
        return (self.a if rank == 0 else self.b)(h).sum()


def _features(rank, world_size):
    torch.manual_seed(0)
    xs = torch.randn(world_size, 2, 4)
    torch.manual_seed(rank)              # different initial weights and buffers on every rank
    model = _Branches()
    model.count.fill_(rank + 1)
    dp = collectives.DataParallel(model, bucket_cap_mb=1e-4)
    assert dp.module.count.item() == 1   # rank 0's buffer, broadcast at construction

    # Reference gradients: every rank's local gradient, averaged, from rank 0's weights.
    ref = _Branches()
    ref.load_state_dict(dp.module.state_dict())
    for r in range(world_size):
        ref(xs[r], r).backward()
    expected = {n: p.grad / world_size for n, p in ref.named_parameters() if p.grad is not None}

    # Unused parameters: no deadlock; partly used ones get the average; unused stay None.
    dp(xs[rank], rank).backward()
    for name, p in dp.module.named_parameters():
        if name.startswith("c."):
            assert p.grad is None, name
        else:
            assert_close(p.grad, expected[name], msg=lambda m: f"{name}: {m}")

    # no_sync: backward accumulates locally without a message; the next one reduces the sum.
    for p in dp.parameters():
        p.grad = None
    with dp.no_sync():
        loss = dp(xs[rank], rank)       # (forward broadcasts buffers: not counted)
        with collectives.count_traffic() as traffic:
            loss.backward()
    assert traffic.sent_messages == 0
    dp(xs[rank], rank).backward()
    assert_close(dp.module.trunk.weight.grad, 2 * expected["trunk.weight"])

    # Buffers: rank 0's are broadcast before each training-mode forward, not in eval mode.
    dp.module.count.fill_(10 + rank)
    dp.eval()
    dp(xs[rank], rank)
    in_eval = dp.module.count.item()
    dp.train()
    dp(xs[rank], rank)
    return in_eval, dp.module.count.item(), _overlap()


def _overlap():
    torch.manual_seed(0)
    model = Net()
    started = []
    # Registered before DataParallel's own hook, so it runs first: it sees how many
    # buckets are already on the wire when the very last gradient (conv1) arrives.
    model.conv1.weight.register_post_accumulate_grad_hook(lambda p: started.append(dp._next))
    dp = collectives.DataParallel(model, bucket_cap_mb=0.05)
    x = torch.randn(4, 1, 28, 28)
    F.cross_entropy(dp(x), torch.arange(4)).backward()
    return started[0], len(dp.buckets)


def test_unused_parameters_no_sync_buffers_and_overlap():
    results = run_world(_features, 2)
    assert [r[:2] for r in results] == [(10.0, 10.0), (11.0, 10.0)]
    for _, _, (started, buckets) in results:
        assert 1 <= started < buckets
