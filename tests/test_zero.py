"""ZeRO-1/2 (collectives/parallel/zero.py): the same parameters as data parallel, 1/N of the state, all_reduce's traffic.

Each test runs in one world of 4 ranks, on groups of 1, 2, 3 and 4 of them
(3 does not divide the 227 parameters, so the padding is exercised too).
"""
import torch
import torch.distributed as dist
import torch.nn as nn

import collectives
from collectives.parallel.zero import ZeroOptimizer, optimizer_state_bytes
from tests.worlds import run_world

STEPS = 3


def make_model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(10, 16), nn.Tanh(), nn.Linear(16, 3))   # 227 parameters


def batch(rank, step):
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(8, 10, generator=g), torch.randint(0, 3, (8,), generator=g)


def data_parallel_steps(model, optimizer, group, rank):
    """The reference: average every gradient with all_reduce (as DDP does), then the full optimizer."""
    n = dist.get_world_size(group)
    for step in range(STEPS):
        x, y = batch(rank, step)
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        for p in model.parameters():
            collectives.all_reduce(p.grad, group=group)
            p.grad /= n
        optimizer.step()


def zero_steps(model, optimizer, rank):
    for step in range(STEPS):
        x, y = batch(rank, step)
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()


def groups_of(world_size):
    """{size: group} for groups of 1..world_size ranks starting at rank 0 (every rank creates every group)."""
    return {n: dist.new_group(list(range(n))) for n in range(1, world_size + 1)}


def same_parameters_as_data_parallel(rank, world_size):
    """Groups of 3 (padding: 227 is not a multiple of 3) and 4; Adam at stages 1 and 2, SGD momentum at 1."""
    results = {}
    for n, group in groups_of(world_size).items():
        if n < 3 or rank >= n:
            continue
        for cls, kwargs, stages in [(torch.optim.Adam, {"lr": 1e-2}, (1, 2)),
                                    (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}, (1,))]:
            reference = make_model()
            data_parallel_steps(reference, cls(reference.parameters(), **kwargs), group, rank)
            for stage in stages:
                model = make_model()
                zero_steps(model, ZeroOptimizer(model.parameters(), cls, group=group, stage=stage, **kwargs), rank)
                diff = max((a - b).abs().max().item() for a, b in zip(model.parameters(), reference.parameters()))
                moved = max((a - b).abs().max().item() for a, b in zip(model.parameters(), make_model().parameters()))
                results[(n, stage, cls.__name__)] = (diff, moved)
    return results


def test_zero_gives_the_parameters_of_data_parallel():
    for rank, results in enumerate(run_world(same_parameters_as_data_parallel, 4)):
        assert len(results) == (6 if rank < 3 else 3)
        for key, (diff, moved) in results.items():
            assert moved > 1e-3, f"{key}: the parameters did not move"
            assert diff < 1e-6, f"rank {rank}, {key}: ZeRO differs from data parallel by {diff}"


def memory_and_traffic(rank, world_size):
    out = {}
    for n, group in groups_of(world_size).items():
        if rank >= n:
            continue
        for stage in (1, 2):
            model = make_model()
            opt = ZeroOptimizer(model.parameters(), torch.optim.Adam, group=group, stage=stage, lr=1e-3)
            x, y = batch(rank, 0)
            nn.functional.cross_entropy(model(x), y).backward()
            with collectives.count_traffic() as zero:
                opt.step()
            flat = torch.zeros(opt.padded_size)
            with collectives.count_traffic() as ring:
                collectives.all_reduce(flat, group=group, algorithm="ring")
            out[(n, stage)] = dict(state=opt.state_bytes(), grads=opt.grad_bytes(), padded=opt.padded_size,
                                   zero=(zero.sent_bytes, zero.sent_messages),
                                   ring=(ring.sent_bytes, ring.sent_messages),
                                   shard_grads=[p.grad is None for p in model.parameters()])
    full = make_model()
    adam = torch.optim.Adam(full.parameters(), lr=1e-3)
    x, y = batch(rank, 0)
    nn.functional.cross_entropy(full(x), y).backward()
    adam.step()
    out["torch_adam"] = optimizer_state_bytes(adam)
    return out


def test_optimizer_state_falls_as_one_over_n_and_traffic_equals_all_reduce():
    results = run_world(memory_and_traffic, 4)
    params = sum(p.numel() for p in make_model().parameters())    # 227
    # torch's Adam: exp_avg and exp_avg_sq per parameter, and a 4-byte step per tensor.
    assert results[0]["torch_adam"] == 2 * params * 4 + 4 * 4
    for n in (1, 2, 3, 4):
        shard = -(-params // n)
        for rank in range(n):
            for stage in (1, 2):
                r = results[rank][(n, stage)]
                # ZeRO's Adam: the same two values, for one shard, and one step counter.
                assert r["state"] == 2 * shard * 4 + 4, (n, stage, r)
                assert r["padded"] == shard * n
                assert r["zero"][0] == r["ring"][0] == 2 * (n - 1) * shard * 4, (n, r)
                assert r["zero"][1] == r["ring"][1] == 2 * (n - 1)
                if stage == 1:   # the full gradients stay; stage 2 keeps only its reduced shard
                    assert r["grads"] == params * 4 + shard * 4 and not any(r["shard_grads"])
                else:
                    assert r["grads"] == shard * 4 and all(r["shard_grads"])
    one, four = results[0][(1, 1)]["state"], results[0][(4, 1)]["state"]
    assert one == results[0]["torch_adam"] - 3 * 4     # one step counter instead of four
    assert four < one / 3.9


def mixed_dtypes(rank, world_size):
    """A bf16 parameter first, then fp32 ones; lr 0: nothing may change, not even by rounding."""
    out = {}
    for n, group in groups_of(world_size).items():
        if rank >= n:
            continue
        torch.manual_seed(0)
        params = [nn.Parameter(torch.randn(5, dtype=torch.bfloat16)), nn.Parameter(torch.randn(7) / 3),
                  nn.Parameter(torch.randn(2, 3, dtype=torch.bfloat16)), nn.Parameter(torch.randn(1))]
        before = [p.detach().clone() for p in params]
        opt = ZeroOptimizer(params, torch.optim.SGD, group=group, lr=0.0)
        built = [p.detach().clone() for p in params]
        for p in params:
            p.grad = torch.full_like(p, rank + 1.0)
        opt.step()
        out[n] = [(a.dtype, b.dtype, c.dtype, torch.equal(a, b), torch.equal(a, c))
                  for a, b, c in zip(before, built, params)]
    return out


def test_each_parameter_keeps_its_dtype_and_its_value():
    for rank, results in enumerate(run_world(mixed_dtypes, 3)):
        for n, rows in results.items():
            for i, (want, built, stepped, same_built, same_stepped) in enumerate(rows):
                assert built == stepped == want, (rank, n, i, want, built, stepped)
                assert same_built and same_stepped, f"rank {rank}, group of {n}: parameter {i} ({want}) changed"
