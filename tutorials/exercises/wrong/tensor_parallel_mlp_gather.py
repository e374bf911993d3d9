"""Wrong (traffic): g gathers every rank's whole partial output and sums them locally:
right results, but (N-1) x S bytes per rank forward where the ring all_reduce sends 2(N-1)/N x S."""
import torch
import torch.distributed as dist
import torch.nn.functional as F

from tutorials.exercises.solutions.all_gather import all_gather
from tutorials.exercises.solutions.all_reduce import all_reduce


class Copy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        all_reduce(grad)
        return grad


class GatherAndSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, partial):
        parts = [torch.empty_like(partial) for _ in range(dist.get_world_size())]
        all_gather(parts, partial.contiguous())
        return sum(parts[1:], parts[0].clone())

    @staticmethod
    def backward(ctx, grad):
        return grad


def tensor_parallel_mlp(x, w1, b1, w2, b2, group=None):
    h = F.gelu(F.linear(Copy.apply(x), w1, b1))
    return GatherAndSum.apply(F.linear(h, w2)) + b2
