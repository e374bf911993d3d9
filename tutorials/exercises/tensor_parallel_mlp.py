"""Exercise: a tensor-parallel MLP, Megatron style (column-parallel, then row-parallel).

Build ``tensor_parallel_mlp(x, w1, b1, w2, b2)``: the MLP ``y = gelu(x W1^T + b1) W2^T + b2``
with its hidden units split over the ranks. Every rank gets the whole input ``x``
(B x H, the same on every rank, ``requires_grad``), its rows ``w1`` (F/N x H) and ``b1``
(F/N) of the first layer, its columns ``w2`` (H x F/N) of the second layer, and the
whole ``b2`` (H). Return the whole ``y`` (B x H) on every rank, differentiable: after
``y.backward(dy)`` (the same ``dy`` everywhere) ``x.grad`` must be the whole gradient of
``x``, and ``w1.grad``, ``b1.grad``, ``w2.grad``, ``b2.grad`` this rank's slices of the
whole gradients, as one process computing the whole MLP would find them.

Read: chapter 17, tutorials/17_tensor_and_sequence_parallelism.md.

Hint: two ``torch.autograd.Function``s, each the identity one way and an all_reduce
the other (use your ring from the all_reduce exercise: ``from
tutorials.exercises.all_reduce import all_reduce``, or the reference in
``tutorials.exercises.solutions.all_reduce``):
* f, in front of the first layer: forward returns x as it is; backward all_reduces
  the gradient (each rank's hidden slice contributes a part of dL/dx);
* g, after the second layer's ``h @ w2.T``: forward all_reduces the partial outputs
  (on a copy: autograd may still need the input), backward passes the gradient through.
Add ``b2`` after g, once.

Traffic to reach: one ring all_reduce of y forward and one of dL/dx backward:
2 x 2(N-1)/N x S bytes sent per rank, S = B x H x 8 bytes, in 4(N-1) messages.

Grade it:  python -m tutorials.exercises.grade tensor_parallel_mlp
"""
import torch  # noqa: F401  (imports your solution will need)
import torch.distributed as dist  # noqa: F401
import torch.nn.functional as F  # noqa: F401


def tensor_parallel_mlp(x, w1, b1, w2, b2, group=None):
    """The whole MLP's output on every rank, from this rank's slices of its weights; differentiable."""
    raise NotImplementedError("write the tensor-parallel MLP here")
