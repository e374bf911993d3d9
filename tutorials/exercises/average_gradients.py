"""Exercise: average the gradients of a model over the ranks (synchronous SGD).

Build ``average_gradients(model)``: after ``loss.backward()`` on each rank's own
data, replace every ``param.grad`` with its mean over the ranks, so that every
rank then takes the same optimizer step. This is the PyTorch tutorial's
``average_gradients``, without ``dist.all_reduce``.

Read: chapter 6, tutorials/06_sync_sgd.md (why the mean, and why replicas stay identical).

Hint: you need an all_reduce built from messages: import yours
(``from tutorials.exercises.all_reduce import all_reduce``, once it passes) or
write the ring here. Either reduce each ``param.grad`` in turn and divide by N,
or, fewer and larger messages, copy all gradients into one flat tensor
(``torch.cat([p.grad.flatten() ...])``), reduce it once, divide, and copy back.

Traffic to reach: about 2(N-1)/N x S bytes sent per rank, S the bytes of all
gradients (a ring all_reduce; the whole-tensor ring sends (N-1) x S).

Grade it:  python -m tutorials.exercises.grade average_gradients
"""
import torch
import torch.distributed as dist


def average_gradients(model, group=None):
    """Replace every ``param.grad`` of ``model`` with its mean over all ranks."""
    raise NotImplementedError("average the gradients here")
