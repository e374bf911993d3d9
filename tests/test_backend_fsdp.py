"""FSDP2 and DTensor, unmodified, on backend="collectives": the built-in gloo's values.

FSDP2's ``fully_shard`` and DTensor's ``redistribute`` reach the backend through
torch's functional collectives (``all_gather_into_tensor``, ``reduce_scatter_tensor``,
``all_reduce``, ``all_to_all_single``), a path that DDP does not take. Each world
runs the program twice: on a device mesh over the default group (our backend)
and on one over a gloo group of the same ranks.
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

import collectives
from collectives.train.models import Net

from .worlds import run_world

STEPS = 5


def fsdp_losses(rank, mesh, steps):
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)
    model = Net()
    for layer in (model.conv1, model.conv2, model.fc1, model.fc2):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    data = torch.Generator().manual_seed(1000 + rank)
    losses = []
    for _ in range(steps):
        x, y = torch.randn(8, 1, 28, 28, generator=data), torch.randint(0, 10, (8,), generator=data)
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def fsdp_world(rank, n):
    ours = init_device_mesh("cpu", (n,))
    assert ours.get_group().name() == "collectives" or dist.get_backend(ours.get_group()) == "collectives"
    theirs = DeviceMesh.from_group(dist.new_group(list(range(n)), backend="gloo"), "cpu")
    with collectives.count_traffic() as t:
        a = fsdp_losses(rank, ours, STEPS)
    b = fsdp_losses(rank, theirs, STEPS)
    return a, b, t.sent_bytes


def test_fsdp2_losses_match_gloo():
    for a, b, sent in run_world(fsdp_world, 2, backend="collectives"):
        # 2 ranks: all-gathers are copies and each reduce-scatter element is a + b, so the
        # losses agree to the last bit; our messages carried FSDP2's traffic
        assert a == b, (a, b)
        assert sent > 0


def dtensor_world(rank, n):
    results = []
    for mesh in (init_device_mesh("cpu", (n,)),
                 DeviceMesh.from_group(dist.new_group(list(range(n)), backend="gloo"), "cpu")):
        torch.manual_seed(0)
        full = torch.randn(n * 3, 2 * n)
        with collectives.count_traffic() as t:
            sharded = distribute_tensor(full, mesh, [Shard(0)])
            replicated = sharded.redistribute(mesh, [Replicate()])           # all_gather
            by_cols = sharded.redistribute(mesh, [Shard(1)])                  # all_to_all
            mine = torch.arange(n * 3 * 2.0).reshape(n * 3, 2) * (rank + 1)   # exact sums
            partial = DTensor.from_local(mine, mesh, [Partial()])
            summed = partial.redistribute(mesh, [Replicate()])               # all_reduce
            rs = partial.redistribute(mesh, [Shard(0)])                       # reduce_scatter
        results.append(([replicated.to_local(), by_cols.to_local(), summed.to_local(), rs.to_local(),
                         sharded.to_local()], t.sent_messages))
    (ours, ours_messages), (theirs, theirs_messages) = results
    torch.manual_seed(0)
    full = torch.randn(n * 3, 2 * n)
    total = torch.arange(n * 3 * 2.0).reshape(n * 3, 2) * (n * (n + 1) // 2)
    return ([torch.equal(a, b) for a, b in zip(ours, theirs)], ours_messages, theirs_messages,
            torch.equal(ours[0], full) and torch.equal(ours[2], total))


def test_dtensor_redistribute_matches_builtin():
    for equal, ours_messages, theirs_messages, full in run_world(dtensor_world, 3, backend="collectives"):
        assert all(equal), equal
        assert full      # Shard(0) -> Replicate rebuilt the whole tensor; Partial -> Replicate summed
        assert ours_messages > 0 and theirs_messages == 0   # ours moved through our door, gloo's did not
