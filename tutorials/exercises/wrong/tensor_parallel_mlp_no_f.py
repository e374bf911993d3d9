"""Wrong (no f): the forward is right, but the gradient of x is never summed over the ranks,
so each rank's x.grad holds only the part that flows through its own hidden units."""
import torch
import torch.nn.functional as F

from tutorials.exercises.solutions.all_reduce import all_reduce


class Reduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, partial):
        out = partial.contiguous().clone()
        all_reduce(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad


def tensor_parallel_mlp(x, w1, b1, w2, b2, group=None):
    h = F.gelu(F.linear(x, w1, b1))
    return Reduce.apply(F.linear(h, w2)) + b2
