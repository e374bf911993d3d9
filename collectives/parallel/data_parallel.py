"""Data parallelism the way DDP does it: gradient buckets reduced during backward.

What it teaches, beyond the naive version (``data_parallel_naive.py``):

1. **Buckets.** A model has many small gradient tensors; one all_reduce each
   pays one message latency each. Packing them into flat buckets of about
   ``bucket_cap_mb`` megabytes sends a few large messages instead.
2. **Overlap.** Backward produces gradients from the last layer to the first.
   Buckets are filled in that order (parameters in reverse), and each bucket's
   all_reduce starts asynchronously (``async_op=True``) the moment its last
   gradient arrives, while autograd keeps computing the earlier layers.
   ``backward()`` returns once every bucket is reduced and copied back.
3. **Same order everywhere.** Collectives must be issued in the same order on
   every rank, so bucket i starts only after buckets 0..i-1 have started.
4. **Unused parameters.** A parameter that gets no gradient this step (a
   branch not taken, on some ranks or all) never fires its hook. At the end of
   backward its slot is filled with zeros and the bucket is sent anyway, so
   no rank waits forever. Each bucket also carries one "used" count per
   parameter: a parameter no rank used keeps its gradient untouched (None
   stays None), one that some ranks used gets the average over all ranks.
5. **Gradient accumulation.** Inside ``with model.no_sync():`` backward only
   accumulates into ``.grad``; the next backward outside it reduces the sum.

Cost per step, for P parameters of B bytes on N ranks, with a ring all_reduce:
``ceil(B / cap)`` collectives of about ``2 (N-1)/N * cap`` bytes sent per rank,
mostly hidden behind backward's compute, instead of P collectives after it.

4-rank example: the MNIST net has 8 parameter tensors (187 kB). Naive: 8
blocking all_reduces after backward. Here, with ``bucket_cap_mb=0.05``: 4
buckets; the first (fc2 and fc1 gradients) is on the wire while conv2's
gradients are still being computed.

Reference: S. Li et al., "PyTorch Distributed: Experiences on Accelerating Data
Parallel Training", VLDB 2020 (arXiv:2006.15704).
"""
import contextlib

import torch
import torch.distributed as dist
import torch.nn as nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from .. import api


class _Bucket:
    """A flat buffer for some gradients, then one "used" count per gradient."""

    def __init__(self, params):
        self.params = params
        self.numel = sum(p.numel() for p in params)
        self.flat = torch.zeros(self.numel + len(params), dtype=params[0].dtype, device=params[0].device)
        self.slots, start = [], 0       # views of flat shaped like each parameter
        for p in params:
            self.slots.append(self.flat[start:start + p.numel()].view_as(p))
            start += p.numel()
        self.reset()

    def reset(self):
        self.got = [False] * len(self.params)
        self.ready = 0
        self.work = None

    def put(self, i, grad):
        self.slots[i].copy_(grad)
        self.got[i] = True
        self.ready += 1

    def seal(self):
        """Zero the slots of parameters without gradient; write the used flags."""
        for i, got in enumerate(self.got):
            if not got:
                self.slots[i].zero_()
        self.flat[self.numel:] = torch.tensor(self.got, dtype=self.flat.dtype)
        self.ready = len(self.params)

    @property
    def full(self):
        return self.ready == len(self.params)


def _make_buckets(params, cap_bytes):
    """Group ``params`` (in backward order) into buckets of one dtype and device, each <= cap."""
    buckets, current, size = [], [], 0
    for p in params:
        nbytes = p.numel() * p.element_size()
        if current and (size + nbytes > cap_bytes or
                        (p.dtype, p.device) != (current[0].dtype, current[0].device)):
            buckets.append(_Bucket(current))
            current, size = [], 0
        current.append(p)
        size += nbytes
    if current:
        buckets.append(_Bucket(current))
    return buckets


def _broadcast_coalesced(tensors, src, group):
    """Broadcast ``tensors`` from ``src`` as one flat message per dtype and device."""
    by_kind = {}
    for t in tensors:
        by_kind.setdefault((t.dtype, t.device), []).append(t)
    with torch.no_grad():
        for group_tensors in by_kind.values():
            flat = _flatten_dense_tensors([t.detach() for t in group_tensors])
            api.broadcast(flat, src=src, group=group)
            for t, value in zip(group_tensors, _unflatten_dense_tensors(flat, group_tensors)):
                t.copy_(value)


class DataParallel(nn.Module):
    """Wrap ``module`` for data-parallel training, like ``DistributedDataParallel``.

    At construction every rank receives rank 0's parameters and buffers (ranks
    that start with different weights end up identical). Then each
    ``loss.backward()`` returns with every gradient averaged over the group,
    the reduction having overlapped with the backward pass.

    Args:
        module (nn.Module): The model, identical in structure on every rank.
        group (ProcessGroup, optional): Ranks to train across; None for all.
        broadcast_buffers (bool): Before each forward in training mode, copy rank
            0's buffers (e.g. BatchNorm statistics) to every rank.
        bucket_cap_mb (float): Approximate size of one gradient bucket.
        algorithm (str, optional): All-reduce algorithm; None picks by size.
        compression (optional): How each bucket is sent: None (full precision), or an object
            of :mod:`collectives.parallel.compression` (``HalfPrecision(torch.float16)``,
            ``PowerSGD(rank=4)``), whose ``start()`` leaves the sum over ranks in the bucket.

    Example::

        >>> model = collectives.DataParallel(Net())
        >>> loss_fn(model(x), y).backward()   # averaged gradients on return
        >>> optimizer.step()                  # the same step on every rank
        >>> with model.no_sync():             # accumulate without communicating
        ...     loss_fn(model(x2), y2).backward()
    """

    def __init__(self, module, group=None, broadcast_buffers=True, bucket_cap_mb=25, algorithm=None,
                 compression=None):
        super().__init__()
        if bucket_cap_mb <= 0:
            raise ValueError(f"bucket_cap_mb must be positive, got {bucket_cap_mb}")
        self.module = module
        self.group = group
        self.broadcast_buffers = broadcast_buffers
        self.algorithm = algorithm
        self.compression = compression
        self.world_size = dist.get_world_size(group)
        self.src = dist.get_process_group_ranks(group)[0] if group is not None else 0
        self.require_sync = True
        _broadcast_coalesced(list(module.parameters()) + list(module.buffers()), self.src, group)

        params = [p for p in module.parameters() if p.requires_grad]
        self.buckets = _make_buckets(list(reversed(params)), int(bucket_cap_mb * 1024 * 1024))
        self._where = {}
        for b in self.buckets:
            for i, p in enumerate(b.params):
                self._where[p] = (b, i)
                p.register_post_accumulate_grad_hook(self._on_gradient)
        self._next = 0            # first bucket whose all_reduce has not started
        self._queued = False      # end-of-backward callback registered for this pass

    @contextlib.contextmanager
    def no_sync(self):
        """Inside this context backward only accumulates gradients locally."""
        previous, self.require_sync = self.require_sync, False
        try:
            yield
        finally:
            self.require_sync = previous

    def forward(self, *args, **kwargs):
        if self.training and self.broadcast_buffers:
            buffers = list(self.module.buffers())
            if buffers:
                _broadcast_coalesced(buffers, self.src, self.group)
        return self.module(*args, **kwargs)

    def _on_gradient(self, param):   # autograd runs hooks with gradients off
        if not self.require_sync:
            return
        if not self._queued:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finish)
        bucket, i = self._where[param]
        bucket.put(i, param.grad)
        if bucket.full:
            self._launch_full_buckets(at_end=False)

    def _launch_full_buckets(self, at_end):
        """Start the all_reduce of each bucket that is full, in order.

        The last bucket waits for the end of backward (``at_end``) and runs there as a blocking
        call: nothing is left to overlap it with, and ``_finish`` waits for it at once. Started
        async, it went to the group's lane thread and back, two thread hand-offs: 60 us and
        90-140 us at N=2 on 2 cores (docs/benchmarks.md, where DDP's step goes), more with more
        ranks than cores. Blocking, it runs on this thread once the earlier buckets' calls are
        done, as the engine orders every call of a group."""
        while self._next < len(self.buckets) and self.buckets[self._next].full:
            b = self.buckets[self._next]
            last = self._next == len(self.buckets) - 1 and self.compression is None
            if last and not at_end:
                return
            b.seal()
            self._next += 1
            if last:
                api.all_reduce(b.flat, group=self.group, async_op=False, algorithm=self.algorithm)
                b.work = None
            elif self.compression is None:
                b.work = api.all_reduce(b.flat, group=self.group, async_op=True, algorithm=self.algorithm)
            else:   # the "used" flags after the slots need only stay zero or not: any compression keeps that
                b.work = self.compression.start([id(p) for p in b.params], b.slots, b.flat, self.group,
                                                 self.algorithm)

    @torch.no_grad()
    def _finish(self):
        """End of backward: send what unused parameters left behind, wait, copy back."""
        for b in self.buckets[self._next:]:
            b.ready = len(b.params)          # sealed, with zeros for the missing, on launch
        self._launch_full_buckets(at_end=True)
        for b in self.buckets:
            if b.work is not None:           # None: the last bucket, done already (blocking)
                b.work.wait()
            b.flat[:b.numel].div_(self.world_size)
            used = b.flat[b.numel:].tolist()
            for i, p in enumerate(b.params):
                if not used[i]:
                    continue                # no rank used it: leave .grad as it was
                if p.grad is None:
                    p.grad = b.slots[i].clone()
                else:
                    p.grad.copy_(b.slots[i])
            b.reset()
        self._next = 0
        self._queued = False
