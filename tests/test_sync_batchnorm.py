"""SyncBatchNorm (collectives/parallel/sync_batchnorm.py) equals one BatchNorm over the concatenated batch.

One world of 3 ranks holding batches of 2, 3 and 4 samples (unequal on purpose).
The reference is a single-process ``nn.BatchNorm`` on the 9 samples at once,
with the loss the sum of every rank's loss; forward outputs, input gradients,
weight and bias gradients (summed over ranks, as data parallel training sums
them before dividing), running statistics and eval outputs must all agree.
"""
import pytest
import torch
import torch.nn as nn

import collectives
from collectives.parallel.sync_batchnorm import SyncBatchNorm
from tests.worlds import run_world

BATCH = [2, 3, 4]     # samples on rank 0, 1, 2


def inputs(shape_tail, dtype, step):
    """Every rank's batch and loss weights (each rank can build them all), and where its slice starts."""
    g = torch.Generator().manual_seed(10 + step)
    xs = [torch.randn(b, *shape_tail, generator=g, dtype=torch.float64).mul(3).add(5).to(dtype) for b in BATCH]
    ws = [torch.randn(b, *shape_tail, generator=g, dtype=torch.float64).to(dtype) for b in BATCH]
    return xs, ws


def compare_with_single_process(rank, world_size, shape_tail, dtype):
    channels = shape_tail[0]
    bn_class = nn.BatchNorm1d if len(shape_tail) == 1 else nn.BatchNorm2d
    torch.manual_seed(0)
    reference = bn_class(channels).to(dtype)
    with torch.no_grad():
        reference.weight.uniform_(0.5, 1.5)
        reference.bias.uniform_(-1, 1)
    ours = SyncBatchNorm.convert_sync_batchnorm(bn_class(channels).to(dtype))
    ours.load_state_dict(reference.state_dict())
    report = {}
    for step in range(2):                  # two steps: the running statistics accumulate
        xs, ws = inputs(shape_tail, dtype, step)
        x_all = torch.cat(xs).requires_grad_()
        reference.zero_grad()
        y_all = reference(x_all)
        (y_all * torch.cat(ws)).sum().backward()

        x = xs[rank].clone().requires_grad_()
        ours.zero_grad()
        y = ours(x)
        (y * ws[rank]).sum().backward()
        start = sum(BATCH[:rank])
        grads = torch.cat([ours.weight.grad, ours.bias.grad])
        collectives.all_reduce(grads)      # every rank's share, summed
        c = channels
        report[step] = {
            "output": (y - y_all[start:start + BATCH[rank]]).abs().max().item(),
            "input grad": (x.grad - x_all.grad[start:start + BATCH[rank]]).abs().max().item(),
            "weight grad": (grads[:c] - reference.weight.grad).abs().max().item(),
            "bias grad": (grads[c:] - reference.bias.grad).abs().max().item(),
            "running mean": (ours.running_mean - reference.running_mean).abs().max().item(),
            "running var": (ours.running_var - reference.running_var).abs().max().item(),
        }
    ours.eval()
    reference.eval()
    xs, _ = inputs(shape_tail, dtype, 5)
    report["eval"] = {"output": (ours(xs[rank]) - reference(xs[rank])).abs().max().item()}
    report["moved"] = (reference.running_mean.abs().max().item(), x_all.grad.abs().max().item())
    return report


@pytest.mark.parametrize("shape_tail,dtype,tol", [((4, 3, 2), torch.float64, 1e-10),
                                                  ((5,), torch.float64, 1e-10),
                                                  ((4, 3, 2), torch.float32, 2e-5)],
                         ids=["2d-float64", "1d-float64", "2d-float32"])
def test_equals_batchnorm_on_the_concatenated_batch(shape_tail, dtype, tol):
    for rank, report in enumerate(run_world(compare_with_single_process, 3, shape_tail, dtype)):
        running_mean, grad = report.pop("moved")
        assert running_mean > 0.5 and grad > 1e-3, "the test must exercise non-trivial values"
        for step, diffs in report.items():
            for what, diff in diffs.items():
                assert diff < tol, f"rank {rank}, step {step}: {what} differs by {diff}"


def local_batchnorm_differs_and_torch_needs_a_gpu(rank, world_size):
    xs, _ = inputs((4, 3, 2), torch.float64, 0)
    local = nn.BatchNorm2d(4).double()(xs[rank])
    synced = SyncBatchNorm(4).double()(xs[rank])
    try:
        nn.SyncBatchNorm(4).double()(xs[rank])
        torch_cpu = "ran"
    except ValueError as exc:
        torch_cpu = str(exc)
    return (local - synced).abs().max().item(), torch_cpu


def test_plain_batchnorm_differs_and_torch_syncbatchnorm_refuses_cpu():
    for diff, torch_cpu in run_world(local_batchnorm_differs_and_torch_needs_a_gpu, 3):
        assert diff > 1e-3, "local statistics should differ from the global ones"
        # torch.nn.SyncBatchNorm only syncs CUDA (and XPU, HPU) tensors; ours is the CPU comparison.
        assert torch_cpu.startswith("SyncBatchNorm expected input tensor to be on GPU"), torch_cpu


def test_convert_keeps_state_dtype_and_structure():
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Sequential(nn.BatchNorm1d(2))).double()
    model[1].running_mean.fill_(3.0)
    converted = SyncBatchNorm.convert_sync_batchnorm(model)
    assert isinstance(converted[1], SyncBatchNorm) and isinstance(converted[2][0], SyncBatchNorm)
    assert converted[1].running_mean.dtype == torch.float64 and converted[1].running_mean[0] == 3.0
    assert converted[1].num_batches_tracked.dtype == torch.int64


def one_value_per_channel(rank, world_size):
    """One sample in the whole global batch (on rank 0; the others have none): nn.BatchNorm1d's error on
    every rank, the running statistics untouched; two samples (on different ranks) are fine."""
    bn = SyncBatchNorm(3)
    out = {}
    for samples in ([1] + [0] * (world_size - 1), [1, 1] + [0] * (world_size - 2)):
        if len(samples) != world_size:
            continue
        x = torch.full((samples[rank], 3), float(rank + 1))
        try:
            bn(x)
            out[sum(samples)] = "ok"
        except ValueError as exc:
            out[sum(samples)] = str(exc)
        out[f"var after {sum(samples)}"] = bn.running_var.tolist()
    try:
        nn.BatchNorm1d(3)(torch.ones(1, 3))
    except ValueError as exc:
        out["torch"] = str(exc)
    return out


@pytest.mark.parametrize("world_size", [1, 3])
def test_one_value_per_channel_in_the_global_batch_raises_like_batchnorm(world_size):
    for out in run_world(one_value_per_channel, world_size):
        assert out["torch"].startswith("Expected more than 1 value per channel when training")
        assert out[1].startswith("Expected more than 1 value per channel when training"), out[1]
        assert "1 value in the batch of every rank together" in out[1], out[1]
        assert out["var after 1"] == [1.0, 1.0, 1.0]
        if world_size > 1:
            assert out[2] == "ok"
