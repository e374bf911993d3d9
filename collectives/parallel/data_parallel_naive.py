"""Data parallelism the simplest way: average every gradient after backward.

What it teaches. N ranks hold the same model and each computes gradients on
its own slice of the global batch. If every rank then replaces each gradient
with the mean over the ranks, every rank takes the same optimizer step, and
that step equals single-process SGD on the whole global batch (the mean of the
per-rank mean losses is the global mean loss). Two things make it work:

1. **Same start.** The ranks must begin with identical weights: broadcast rank
   0's parameters and buffers once, at construction.
2. **Same gradients.** After ``loss.backward()``, ``all_reduce`` each
   gradient and divide by N (:func:`average_gradients`, the PyTorch
   tutorial's function).

Cost: one blocking ``all_reduce`` per parameter tensor, started only once the
whole backward pass is over, so nothing overlaps and every small tensor pays a
full message latency. ``collectives.DataParallel`` (``data_parallel.py``) fixes
both: it packs gradients into a few large buckets and starts reducing each
while backward is still running.

Reference: S. Arnold, "Writing Distributed Applications with PyTorch",
pytorch.org/tutorials/intermediate/dist_tuto.html.
"""
import torch
import torch.distributed as dist
import torch.nn as nn

from .. import api


def average_gradients(model, group=None, algorithm=None):
    """Replace every gradient of ``model`` with its mean over the ranks of ``group``.

    The tutorial's version: one ``all_reduce`` per parameter, then divide by
    the group size. A parameter that got no gradient on this rank counts as
    zero, so every rank issues the same sequence of collectives.

    Args:
        model (nn.Module): Model whose ``.grad`` fields were filled by backward.
        group (ProcessGroup, optional): Ranks to average over; None for all.
        algorithm (str, optional): One of ``ALGORITHMS["all_reduce"]``.

    Example::

        >>> loss_fn(model(x), y).backward()
        >>> collectives.average_gradients(model)
        >>> optimizer.step()    # the same step on every rank
    """
    size = float(dist.get_world_size(group))
    for param in model.parameters():
        if not param.requires_grad:
            continue
        if param.grad is None:
            param.grad = torch.zeros_like(param)
        api.all_reduce(param.grad, group=group, algorithm=algorithm)
        param.grad /= size


def broadcast_parameters(module, src=0, group=None):
    """Copy rank ``src``'s parameters and buffers into every rank's ``module``, one tensor at a time."""
    with torch.no_grad():
        for t in list(module.parameters()) + list(module.buffers()):
            api.broadcast(t, src=src, group=group)


class NaiveDataParallel(nn.Module):
    """Wrap ``module`` so that ``loss.backward()`` ends with averaged gradients.

    Broadcasts rank 0's weights at construction; after every backward pass runs
    :func:`average_gradients`. The training loop stays unchanged::

        >>> model = NaiveDataParallel(Net())
        >>> loss_fn(model(x), y).backward()   # gradients are averaged when this returns
        >>> optimizer.step()

    Args:
        module (nn.Module): The model, identical in structure on every rank.
        group (ProcessGroup, optional): Ranks to train across; None for all.
        algorithm (str, optional): All-reduce algorithm for the gradients.
    """

    def __init__(self, module, group=None, algorithm=None):
        super().__init__()
        self.module, self.group, self.algorithm = module, group, algorithm
        src = dist.get_process_group_ranks(group)[0] if group is not None else 0
        broadcast_parameters(module, src, group)
        self._queued = False
        # Hooks fire during backward; the first one to fire asks autograd to
        # call _after_backward once the whole pass is done.
        for p in module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._on_gradient)

    def _on_gradient(self, param):
        if not self._queued:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._after_backward)

    def _after_backward(self):
        self._queued = False
        average_gradients(self.module, self.group, self.algorithm)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)
