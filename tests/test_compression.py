"""Compressed gradients: the bytes they save, counted at the door, and what they cost in accuracy.

One world of 3 ranks runs every case. float16 and bfloat16 buckets must send
exactly half of float32's bytes; PowerSGD's two all-reduces per bucket must
carry exactly the rank-r factors (plus the vectors, sent whole); error
feedback must make the updates add up to the true gradients over steps; and
the same compressions as hooks of torch's DDP must agree with our DataParallel.
"""
import math

import pytest
import torch
import torch.nn.functional as F

import collectives
from collectives.parallel.compression import HalfPrecision, PowerSGD, make
from collectives.train.models import Net
from tests.worlds import run_world

PER_RANK = 4


def _batch(rank, step=0):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(PER_RANK, 1, 28, 28, generator=g), torch.randint(0, 10, (PER_RANK,), generator=g)


def _backward(model, rank, step=0):
    x, y = _batch(rank, step)
    model.zero_grad()
    F.cross_entropy(model(x), y).backward()


def _one_step(compression, rank, trace=False):
    """Gradients (numpy) of one DataParallel backward, and what this rank sent (bytes, calls' sizes)."""
    torch.manual_seed(0)
    model = collectives.DataParallel(Net(), algorithm="ring", compression=compression)
    with collectives.count_traffic() as traffic, collectives.trace() as calls:
        _backward(model, rank)
    grads = [p.grad.numpy().copy() for p in model.parameters()]
    return grads, traffic.sent_bytes, [c.nbytes for c in calls.calls if c.collective == "all_reduce"]


def _cumulative_error(rank, world_size):
    """PowerSGD on a fixed full-rank gradient: one step is far off, the running sum is not."""
    g = torch.Generator().manual_seed(7 + rank)
    grad = torch.randn(32, 48, generator=g)
    mean = sum(torch.randn(32, 48, generator=torch.Generator().manual_seed(7 + r)) for r in range(world_size))
    mean = mean / world_size
    compression, applied, errors = PowerSGD(rank=2), torch.zeros(32, 48), {}
    for t in range(1, 121):
        flat = grad.clone().flatten()
        compression.start(["w"], [flat.view(32, 48)], flat, None, "ring").wait()
        applied += flat.view(32, 48) / world_size
        if t in (1, 30, 120):   # how far the sum of the updates is from t times the mean gradient
            errors[t] = float((applied - t * mean).norm() / (t * mean.norm()))
    return errors


def _ddp(compression, rank):
    torch.manual_seed(0)
    ddp = torch.nn.parallel.DistributedDataParallel(Net())
    ddp.register_comm_hook(state=None, hook=collectives.ddp_comm_hook("ring", compression=compression))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    with collectives.count_traffic() as traffic:
        for step in range(3):
            _backward(ddp, rank, step)
            opt.step()
    return [p.detach().numpy().copy() for p in ddp.parameters()], traffic.sent_bytes


def _ours(compression, rank):
    torch.manual_seed(0)
    model = collectives.DataParallel(Net(), algorithm="ring", compression=compression)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(3):
        _backward(model, rank, step)
        opt.step()
    return [p.detach().numpy().copy() for p in model.parameters()]


def _everything(rank, world_size):
    out = {name: _one_step(make(name), rank) for name in ("none", "fp16", "bf16", "powersgd")}
    out["full, no compression object"] = _one_step(None, rank)
    out["cumulative"] = _cumulative_error(rank, world_size)
    out["ddp fp16"] = _ddp(HalfPrecision(torch.float16), rank)
    out["ours fp16"] = _ours(HalfPrecision(torch.float16), rank)
    out["ddp full"] = _ddp(None, rank)
    out["ddp powersgd"] = _ddp(PowerSGD(rank=4), rank)
    return out


@pytest.fixture(scope="module")
def world():
    return run_world(_everything, 3)


def _shapes():
    return [tuple(p.shape) for p in reversed(list(Net().parameters()))]


def test_half_precision_sends_exactly_half_the_bytes(world):
    for rank, out in enumerate(world):
        full_grads, full_bytes, full_calls = out["none"]
        assert out["full, no compression object"][1] == full_bytes
        for name in ("fp16", "bf16"):
            grads, sent, calls = out[name]
            assert 2 * sent == full_bytes, (name, sent, full_bytes)
            assert [2 * c for c in calls] == full_calls
            tol = 2e-3 if name == "fp16" else 2e-2
            for g, f in zip(grads, full_grads):
                torch.testing.assert_close(torch.from_numpy(g), torch.from_numpy(f), rtol=tol, atol=tol * 1e-1)


def test_powersgd_sends_the_rank_r_factors(world):
    compression = PowerSGD(rank=4)
    first, second = compression.values_sent(_shapes(), extra=len(_shapes()))   # + one "used" flag each
    assert first < sum(math.prod(s) for s in _shapes()) / 5
    for out in world:
        _, full_bytes, full_calls = out["none"]
        grads, sent, calls = out["powersgd"]
        assert calls == [4 * first, 4 * second], (calls, first, second)
        # the ring sends 2(N-1)/N of each call, up to the split into N pieces
        assert sent == pytest.approx(2 * 2 / 3 * 4 * (first + second), abs=2 * 2 * 4 * 2)
        assert sent < full_bytes / 5


def test_error_feedback_makes_the_updates_add_up(world):
    # The error left behind stays bounded (about 10 gradients' worth here), so the sum of
    # the updates approaches the sum of the gradients as 1/t, though each step is far off.
    for errors in (out["cumulative"] for out in world):
        assert errors[1] > 0.5, "rank 2 of a random 32 x 48 matrix should be far from it"
        assert errors[120] < 0.15 and errors[120] < errors[30] / 2.5, errors


def test_ddp_hooks_compress_like_data_parallel(world):
    for out in world:
        ddp_fp16, fp16_bytes = out["ddp fp16"]
        full, full_bytes = out["ddp full"]
        assert 2 * fp16_bytes == full_bytes
        for a, b in zip(ddp_fp16, out["ours fp16"]):
            torch.testing.assert_close(torch.from_numpy(a), torch.from_numpy(b), rtol=1e-3, atol=1e-5)
        psgd, psgd_bytes = out["ddp powersgd"]
        assert psgd_bytes < full_bytes / 5
        for a, b in zip(psgd, full):   # three steps of lr 0.05 from the same start: near each other
            assert float(abs(torch.from_numpy(a) - torch.from_numpy(b)).max()) < 0.05
    assert all((a == b).all() for out in world[1:] for a, b in zip(out["ddp powersgd"][0], world[0]["ddp powersgd"][0])), \
        "PowerSGD must leave the same parameters on every rank"


def test_make_rejects_unknown_names():
    with pytest.raises(ValueError, match="unknown compression 'int8'"):
        make("int8")
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        HalfPrecision(torch.int8)


def test_train_refuses_compression_without_buckets(tmp_path):
    from collectives.train.cli import main
    with pytest.raises(SystemExit, match="--compression fp16 needs --sync bucketed"):
        main(["--compression", "fp16", "--sync", "naive", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="--powersgd-rank must be at least 1"):
        main(["--compression", "powersgd", "--powersgd-rank", "0", "--out", str(tmp_path)])
