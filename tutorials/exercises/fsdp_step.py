"""Exercise: one forward and backward of a fully sharded (ZeRO-3, FSDP) model.

Build ``fsdp_step(shards, layers, x, target, loss_fn)``. The model is ``len(layers)``
layers; layer i's parameters are one flat vector of N x k_i values (N ranks, the tail
zero padding), cut into N pieces of k_i: this rank holds only its piece,
``shards[i]`` (piece r of rank r). ``layers[i](flat, x)`` computes layer i with its
*full* flat vector ``flat`` (differentiable in both). ``x`` and ``target`` are this
rank's batch; the loss is ``loss_fn(model(x), target)``.

Return ``grads``: ``grads[i]`` is this rank's piece (k_i values) of the gradient of
layer i's flat vector, averaged over the ranks, exactly what one process training on
all ranks' batches together would compute (the batches are the same size).

Rules (checked): never hold more than two layers' full vectors at once: a layer's
full vector exists while it is used (and an autograd graph through it keeps it, too).

Read: chapter 18, tutorials/18_fully_sharded.md.

Hint: use your ring ``all_gather`` and ``reduce_scatter`` (``from
tutorials.exercises.all_gather import all_gather``; the same for reduce_scatter).
1. forward, under ``torch.no_grad()``: for each layer, all-gather its pieces into a
   full vector, compute, keep the layer's *input* (an activation), let the vector go;
2. backward, from the last layer: all-gather the layer again, recompute its output
   from the kept input with gradients on (``flat.requires_grad_()``, the input too),
   ``torch.autograd.grad`` of the loss (last layer) or of the output with the gradient
   the layer above handed down; reduce-scatter the flat vector's gradient (cut into N
   pieces of k_i) and divide by N; hand the input's gradient to the layer below.

Traffic to reach: per layer two all-gathers and one reduce-scatter: 3(N-1)/N x S bytes
per rank, S the bytes of all (padded) parameters.

Steps, each graded on its own: ``--step 1``, one layer's pieces gathered, the padding cut
off, viewed as its tensors (fsdp_step_gather.py); ``--step 2``, this rank's piece of the
averaged gradients (fsdp_step_reduce_scatter.py); ``--step 3``, this exercise.

Grade it:  python -m tutorials.exercises.grade fsdp_step
"""
import torch  # noqa: F401  (imports your solution will need)
import torch.distributed as dist  # noqa: F401


def fsdp_step(shards, layers, x, target, loss_fn, group=None):
    """Forward and backward with parameters gathered layer by layer; return the averaged gradient pieces."""
    raise NotImplementedError("write the fully sharded forward and backward here")
