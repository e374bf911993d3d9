"""HSDP (a 2-D DeviceMesh, replicate x shard) with FSDP2 ``fully_shard``, unmodified, on
backend="collectives": the parameters gloo's run reaches, within 1e-6, for 3 seeds.

The mesh over the default group (ours) is ``init_device_mesh``'s; gloo's is the same 2 x 2
layout built from gloo groups of the same ranks (``DeviceMesh.from_group``). FSDP2 all-gathers
and reduce-scatters along "shard" and all-reduces along "replicate", each dimension a group.
"""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

import collectives

from .worlds import run_world

SEEDS = (0, 1, 2)
STEPS = 3


def hsdp_params(rank, mesh, seed):
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 5), nn.ReLU(), nn.Linear(5, 3))
    for layer in (model[0], model[2], model[4]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    data = torch.Generator().manual_seed(100 * seed + rank)
    for _ in range(STEPS):
        x, y = torch.randn(6, 10, generator=data), torch.randint(0, 3, (6,), generator=data)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return [p.full_tensor().detach().clone() for p in model.parameters()]


def hsdp_world(rank, n):
    torch.set_num_threads(1)
    shape, names = (2, n // 2), ("replicate", "shard")
    ours = init_device_mesh("cpu", shape, mesh_dim_names=names)
    assert dist.get_backend(ours.get_group("shard")) == "collectives"
    layout = torch.arange(n).reshape(shape)
    rows = [dist.new_group(layout[i].tolist(), backend="gloo") for i in range(shape[0])]      # shard
    cols = [dist.new_group(layout[:, j].tolist(), backend="gloo") for j in range(shape[1])]   # replicate
    i, j = divmod(rank, shape[1])
    theirs = DeviceMesh.from_group([cols[j], rows[i]], "cpu", mesh=layout, mesh_dim_names=names)
    out = []
    for seed in SEEDS:
        with collectives.count_traffic() as t:
            a = hsdp_params(rank, ours, seed)
        b = hsdp_params(rank, theirs, seed)
        out.append((max((x - y).abs().max().item() for x, y in zip(a, b)), t.sent_messages,
                    any(not torch.equal(x, y) for x, y in zip(a, hsdp_params_init(seed)))))
    return out


def hsdp_params_init(seed):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 5), nn.ReLU(), nn.Linear(5, 3))
    return [p.detach().clone() for p in model.parameters()]


def test_hsdp_2d_mesh_parameters_match_gloo():
    for per_seed in run_world(hsdp_world, 4, backend="collectives", timeout=200):
        for diff, sent, trained in per_seed:
            assert diff <= 1e-6, per_seed
            assert sent > 0          # FSDP2's traffic moved through our door
            assert trained           # the parameters did move: the comparison is not of two copies
