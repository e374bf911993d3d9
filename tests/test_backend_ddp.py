"""Unmodified torch DDP on backend="collectives": same parameters as on gloo, traffic as the card says.

One world per size: its default group uses our backend, and a second group of the
same ranks uses gloo, so the two trainings see the same seeds, data and machine.
The training code is torch's own ``DistributedDataParallel`` around the project's
MNIST ``Net`` with synthetic batches: nothing in it knows about our library.
"""
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import collectives
from collectives.algorithms._util import split_bounds
from collectives.train.models import Net

from .worlds import run_world

STEPS = 50


def train(rank, group, steps, dtype):
    """``steps`` of momentum SGD under torch DDP on ``group``; the flat parameters after."""
    torch.manual_seed(0)                                  # same initial weights on every rank
    model = DDP(Net().to(dtype), process_group=group)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    data = torch.Generator().manual_seed(1000 + rank)     # each rank its own batches
    for _ in range(steps):
        x = torch.randn(8, 1, 28, 28, generator=data, dtype=dtype)
        y = torch.randint(0, 10, (8,), generator=data)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def ddp_world(rank, n, steps, dtype):
    assert dist.get_backend() == "collectives"
    gloo = dist.new_group(list(range(n)), backend="gloo")
    ours = train(rank, None, steps, dtype)
    theirs = train(rank, gloo, steps, dtype)
    return torch.equal(ours, theirs), (ours - theirs).abs().max().item(), ours.abs().max().item()


def test_ddp_two_ranks_bitwise_equal_to_gloo():
    # With two ranks every element of the gradient sum is a + b on both backends, and
    # floating-point addition is commutative: the parameters agree to the last bit.
    for equal, diff, _ in run_world(ddp_world, 2, STEPS, torch.float32, backend="collectives"):
        assert equal, f"max difference {diff}"


def test_ddp_four_ranks_equal_to_gloo_up_to_summation_order():
    # With four ranks gloo and our ring add the four gradients in different orders, and
    # float addition is not associative: an element of the sum may round differently by an
    # ulp or two (float32: 1.5e-8 at the parameters' magnitude, |p| < 0.25 here). Measured
    # on this model, 50 steps: max |ours - gloo| = 3.4e-8 in float32 (8e-17 in float64), so
    # the differences stay at rounding level instead of growing. The bound, 1e-6, leaves a
    # 30x margin and is still far below what a wrong or missing contribution does (a
    # gradient of one rank dropped moves parameters by > 1e-4 in one step).
    for equal, diff, biggest in run_world(ddp_world, 4, STEPS, torch.float32, backend="collectives"):
        assert diff < 1e-6, f"max difference {diff} (max |p| {biggest})"


def traffic_world(rank, n):
    torch.manual_seed(0)
    model = DDP(Net())
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    buckets = model._get_ddp_logging_data()["bucket_sizes"]

    def step():
        x, y = torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    step()
    step()   # DDP rebuilds its buckets here and broadcasts their layout from rank 0 (40 bytes)
    with collectives.count_traffic() as t:
        step()
    numel = sum(p.numel() for p in model.parameters())
    return buckets, numel, t.sent_bytes, t.sent_messages, t.recv_bytes


@pytest.mark.parametrize("n", [2, 3])
def test_one_ddp_step_moves_what_the_ring_card_predicts(n):
    results = run_world(traffic_world, n, backend="collectives", env={"COLLECTIVES_ALGO": "all_reduce:ring"})
    for rank, (buckets, numel, sent, messages, received) in enumerate(results):
        # the model (46,730 float32 gradients, 187 KB) fits DDP's first bucket: one all_reduce
        assert str(buckets) == str(numel * 4), buckets
        # ring card: the reduce-scatter sends every chunk but chunk r, the all-gather every
        # chunk but chunk r+1; chunks are tensor_split(N) pieces; 2(N-1) messages
        b = split_bounds(numel, n)
        size = [b[i + 1] - b[i] for i in range(n)]
        want = 4 * (2 * numel - size[rank] - size[(rank + 1) % n])
        assert messages == 2 * (n - 1) and sent == want, (rank, sent, want)
        assert abs(sent - 2 * (n - 1) / n * numel * 4) <= 8       # = 2(N-1)/N * S, to a float or two
        assert received == sent or n > 2
