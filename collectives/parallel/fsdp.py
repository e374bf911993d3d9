"""Fully sharded data parallel (ZeRO stage 3, FSDP): even the parameters live in shards.

What it teaches. ZeRO-1 and -2 (chapter 10) shard the optimizer state and the
gradients, but every rank still holds the whole model. Stage 3 shards the parameters
too: each layer's parameters are one flat vector, padded to N equal pieces, and rank r
keeps piece r only. A layer exists whole only while it is used:

1. **forward of layer i**: all-gather its pieces into the full flat vector, run the
   layer, free the vector (the activations the backward needs are kept, as usual);
2. **backward of layer i**: all-gather the pieces again, compute the gradients,
   free the vector;
3. **reduce-scatter** the layer's flat gradient: rank r gets the sum over ranks of
   piece r, divided by N, the gradient of the piece it owns. The optimizer then
   updates only that piece (its state is 1/N too, as in ZeRO-1).

Parameters held per rank: S/N (the pieces) plus the layers gathered at that moment:
the one computing and, with **prefetch**, the next one, whose all-gather is started
(``async_op=True``) before the current layer computes, so the messages move while
the arithmetic runs. With **overlap_reduce_scatter**, each layer's gradient reduce-scatter
is started (``async_op=True``) as soon as its backward is done and waited for only
when the whole backward is (autograd's end-of-backward callback, as torch's DDP and
FSDP use), so it moves while the earlier layers' gradients are computed.

Traffic per step, per rank, with the ring algorithms and S bytes of parameters
(padded): two all-gathers and one reduce-scatter of every layer, each (N-1)/N x S
bytes in N-1 messages per layer: **3(N-1)/N x S** bytes, 1.5 times DDP's ring
all-reduce (2(N-1)/N x S), in 3(N-1) messages per layer.

How a layer's graph survives its parameters being freed: the layer runs on views of
the gathered vector, and autograd keeps those views for the backward. Freeing
*resizes the vector's storage to zero bytes*, and gathering again before the backward
gives the same storage its bytes back, so the saved views read the right values
(this is what torch's FSDP does with its flat parameters). The gather writes through
a second tensor on the same storage (:func:`_alias`), so autograd does not see the
saved views modified in place.

Reference: S. Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training
Trillion Parameter Models", SC 2020; Y. Zhao et al., "PyTorch FSDP: Experiences on
Scaling Fully Sharded Data Parallel", VLDB 2023.
"""
import math
import time

import torch
import torch.nn as nn
from torch.func import functional_call

from .. import api
from ..group import group_info


def _alias(t):
    """A tensor on ``t``'s storage with its own version counter: writing through it
    leaves the views autograd saved from ``t`` unflagged."""
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage(), 0, t.shape)


class FullyShardedDataParallel(nn.Module):
    """Run ``layers`` one after the other with their parameters sharded over ``group``.

    Each layer (an ``nn.Module`` without buffers) is a unit: gathered whole for its
    forward and its backward, its gradient reduce-scattered. ``parameters()`` are this
    rank's pieces only: give them to any elementwise optimizer (SGD, Adam) and every
    rank updates its piece; the model is the same as one process training on the
    ranks' batches together (rank 0's initial weights are broadcast, as DDP does).

    Args:
        layers (list[nn.Module]): The model, in order; their trained parameters are taken
            over (each layer's own tensors are emptied); frozen ones (``requires_grad=False``)
            stay whole in the layer, rank 0's values on every rank, and never change.
        group (ProcessGroup, optional): Ranks to shard over; None for all.
        prefetch (bool): Start the next layer's all-gather before computing this one.
        algorithm (str): Algorithm of the all-gathers and the reduce-scatters.
        overlap_reduce_scatter (bool): Start each layer's gradient reduce-scatter without
            waiting, and wait for all of them at the end of ``backward()``; the gradients
            are the same bits, ready when ``backward()`` returns.

    Example::

        >>> model = FullyShardedDataParallel([nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2)])
        >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)   # this rank's pieces
        >>> loss_fn(model(x), y).backward()                       # gradients of the pieces, averaged
        >>> opt.step()
    """

    def __init__(self, layers, group=None, prefetch=True, algorithm="ring", overlap_reduce_scatter=False):
        super().__init__()
        info = group_info(group, "collectives.parallel.fsdp")
        self.group, self.prefetch, self.algorithm = group, prefetch, algorithm
        self.overlap_reduce_scatter = overlap_reduce_scatter
        self.scattering = []     # (unit, its piece of the gradient, reduce-scatter in flight)
        self.waits = []          # (start, end) of every wait for messages: the exposed communication
        self.world, self.rank = info.size, info.rank
        self.layers = list(layers)      # not submodules: parameters() is the pieces alone
        # Frozen parameters (requires_grad=False) stay whole in their layer on every rank,
        # rank 0's copy: packed into a trained piece, the optimizer would move them.
        for layer in self.layers:
            for p in layer.parameters():
                if not p.requires_grad:
                    api.broadcast(p.data, src=info.ranks[0], group=group)
        # a unit is a layer with trained parameters (activations like Tanh, frozen layers just run)
        self.units = [j for j, layer in enumerate(self.layers) if any(p.requires_grad for p in layer.parameters())]
        self.names, self.shapes, self.piece = [], [], []
        self.shards = nn.ParameterList()
        for j in self.units:
            params = {name: p for name, p in self.layers[j].named_parameters() if p.requires_grad}
            flat_len = sum(p.numel() for p in params.values())
            k = math.ceil(flat_len / self.world)
            flat = torch.zeros(k * self.world, dtype=next(iter(params.values())).dtype)
            torch.cat([p.detach().reshape(-1) for p in params.values()], out=flat[:flat_len])
            api.broadcast(flat, src=info.ranks[0], group=group)     # every rank starts alike
            self.names.append(list(params))
            self.shapes.append([p.shape for p in params.values()])
            self.piece.append(k)
            self.shards.append(nn.Parameter(flat[self.rank * k:(self.rank + 1) * k].clone()))
            for p in params.values():
                p.data = torch.empty(0, dtype=p.dtype)        # the whole copy is gone
        self.full = [None] * len(self.units)      # each unit's gathered vector (storage freed when idle)
        self.pending = {}                         # layer -> all-gather in flight
        self.peak_bytes = 0                       # most parameter bytes held at once (pieces + gathered)

    # -- gathering and freeing ------------------------------------------------------------

    def _start_gather(self, i):
        if i in self.pending or not 0 <= i < len(self.units):
            return
        k = self.piece[i]
        if self.full[i] is None:
            self.full[i] = torch.empty(k * self.world, dtype=self.shards[i].dtype)
        else:       # the vector autograd saved views of: give its storage its bytes back
            self.full[i].untyped_storage().resize_(k * self.world * self.full[i].element_size())
        target = _alias(self.full[i])
        self.pending[i] = api.all_gather(list(target.split(k)), self.shards[i].detach(), group=self.group,
                                         async_op=True, algorithm=self.algorithm)
        self.peak_bytes = max(self.peak_bytes, self.param_bytes())

    def _gathered(self, i, then):
        """Unit i's full vector (waiting for its gather), after starting unit ``then``'s."""
        self._start_gather(i)
        work = self.pending.pop(i)
        if self.prefetch:
            self._start_gather(then)       # moves while layer i computes
        self._wait(work)
        return self.full[i]

    def _wait(self, work):
        t = time.time()
        work.wait()
        self.waits.append((t, time.time()))

    def _finish_reduce_scatters(self):
        """End of backward: wait for every layer's reduce-scatter and hand the pieces to autograd's
        ``.grad`` (accumulating, as autograd would)."""
        scattering, self.scattering = self.scattering, []
        for i, mine, work in scattering:
            self._wait(work)
            mine.div_(self.world)
            shard = self.shards[i]
            shard.grad = mine if shard.grad is None else shard.grad.add_(mine)

    def _free(self, i):
        self.full[i].untyped_storage().resize_(0)

    def param_bytes(self):
        """Parameter bytes this rank holds now: its pieces plus every gathered layer."""
        pieces = sum(s.numel() * s.element_size() for s in self.shards)
        return pieces + sum(f.untyped_storage().nbytes() for f in self.full if f is not None)

    def params_of(self, i, flat):
        """Unit i's trained parameters as views of its flat vector, by name (for ``functional_call``,
        which takes the frozen ones from the layer itself)."""
        views, offset = {}, 0
        for name, shape in zip(self.names[i], self.shapes[i]):
            n = math.prod(shape)
            views[name] = flat[offset:offset + n].view(shape)
            offset += n
        return views

    def forward(self, x):
        for j, layer in enumerate(self.layers):
            if j in self.units:
                u = self.units.index(j)
                x = _Unit.apply(x, self.shards[u], self, u)
            else:
                x = layer(x)
        return x


class _Unit(torch.autograd.Function):
    """Unit i: gather, compute, free, in forward and again in backward; reduce-scatter."""

    @staticmethod
    def forward(ctx, x, shard, fsdp, i):
        flat = fsdp._gathered(i, then=i + 1).detach().requires_grad_()
        with torch.enable_grad():
            x_in = x.detach().requires_grad_(x.requires_grad)
            y = functional_call(fsdp.layers[fsdp.units[i]], fsdp.params_of(i, flat), (x_in,))
        fsdp._free(i)
        ctx.fsdp, ctx.i, ctx.flat, ctx.x_in, ctx.y = fsdp, i, flat, x_in, y
        return y.detach()

    @staticmethod
    def backward(ctx, dy):
        fsdp, i = ctx.fsdp, ctx.i
        fsdp._gathered(i, then=i - 1)          # the saved views of ctx.flat read the gathered values
        inputs = [ctx.flat] + ([ctx.x_in] if ctx.x_in.requires_grad else [])
        grads = torch.autograd.grad(ctx.y, inputs, dy)
        fsdp._free(i)
        k = fsdp.piece[i]
        mine = torch.empty(k, dtype=dy.dtype)
        work = api.reduce_scatter(mine, list(grads[0].split(k)), group=fsdp.group, async_op=True,
                                  algorithm=fsdp.algorithm)
        ctx.flat = ctx.x_in = ctx.y = None
        dx = grads[1] if len(grads) > 1 else None
        if fsdp.overlap_reduce_scatter:
            if not fsdp.scattering:     # the first layer of this backward: wait for all at its end
                torch.autograd.Variable._execution_engine.queue_callback(fsdp._finish_reduce_scatters)
            fsdp.scattering.append((i, mine, work))
            return dx, None, None, None
        fsdp._wait(work)
        return dx, mine.div_(fsdp.world), None, None
