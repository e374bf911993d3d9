"""Interleaved 1F1B: each rank holds v small stages instead of one big one, so the bubble
shrinks by v for the price of v times the messages.

Semantics. The model's L layers are cut into p*v *virtual stages*; rank r holds virtual
stages r, r + p, r + 2p, .., r + (v-1)p (its *chunks* 0..v-1). A micro-batch goes
forward through virtual stage 0, 1, .., pv-1: from rank 0 to p-1 in chunk 0, then back
to rank 0 for chunk 1, and so on around the ring v times. The parameters after a step are
bitwise those of one process running the micro-batches in turn: each chunk runs its
backwards in micro-batch order 0, 1, .., m-1, so every gradient sums in the same order.

Steps (Megatron-LM's interleaved schedule, Narayanan et al., 2021). Number the m*v
forwards of a rank k = 0, 1, ..: forward k is chunk (k // p) % v of micro-batch
(k // pv) * p + k % p, i.e. groups of p micro-batches go through chunk 0, then the same p
through chunk 1, and so on. Backward k is the same with the chunk reversed (v-1-c).

1. Warm up: rank r runs ``(p - r - 1) * 2 + (v - 1) * p`` forwards (at most m*v; with
   v = 1 it is plain 1F1B's ``p - r - 1``).
2. Steady: one forward, one backward, until the forwards are done.
3. Drain the remaining backwards.

Worked example, p = 2 ranks, v = 2 chunks, m = 2 micro-batches (virtual stages 0..3:
rank 0 holds 0 and 2, rank 1 holds 1 and 3). Rank 0: F(c0,0) F(c0,1) F(c1,0) F(c1,1)
(warm-up 2 + 2 = 4 = m*v), then B(c1,0) B(c1,1) B(c0,0) B(c0,1). Rank 1: warm-up
(0 + 2) = 2: F(c0,0) F(c0,1), then F(c1,0) B(c1,0), F(c1,1) B(c1,1), then B(c0,0)
B(c0,1). With 4 ranks (v = 2, m = 4) rank 0 warms up with 2*3 + 4 = 10 of its 8 forwards,
i.e. all of them, and rank 3 with 4.

Cost. With every virtual stage taking t_f / v forward and t_b / v backward, the
pipeline fills and drains in (p - 1) small steps instead of big ones: a step takes
(m + (p - 1) / v)(t_f + t_b), and the bubble is (p - 1) / (v m + p - 1)
(:func:`bubble_fraction`). The price: every micro-batch's activation crosses p*v - 1
boundaries instead of p - 1, so each rank sends v times as many messages (A bytes each),
:func:`cost`. It needs m to be a multiple of p (the groups of p above). Before the
first activation, the step's check of :func:`collectives.parallel.pipeline.check_step`
(16 bytes to each neighbouring stage, down the stages and back) refuses a bad step on
every rank alike.

Reference: D. Narayanan et al., "Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM", SC 2021, section 2.2.
"""
import time

import torch
import torch.distributed as dist

from .. import p2p_api
from ..group import group_info
from .pipeline import ACTIVATION, GRADIENT, HEADER_BYTES, check_step, meet


def bubble_fraction(p, m, v):
    """The idle fraction of interleaved 1F1B: (p-1) / (v m + p - 1)."""
    return (p - 1) / (v * m + p - 1)


def cost(p, m, v, activation_bytes):
    """Bytes and messages one rank sends per step (activations forward + gradients back, and the
    step's check: one 16-byte header to each neighbouring stage).

    Every virtual boundary but the model's ends carries one activation forward and one
    gradient back per micro-batch; a rank owns the outgoing side of v of them in each
    direction, less the model's two ends on ranks 0 and p-1.
    """
    boundaries = p * v - 1                    # per micro-batch, each way
    messages = 2 * m * boundaries / p         # average over ranks
    checks = 2 * (p - 1) / p                  # the step's check, down the stages and back
    return dict(messages=messages + checks, bytes=messages * activation_bytes + checks * HEADER_BYTES)


def _rule(p, m, v):
    """What is wrong with interleaving ``m`` micro-batches over ``p`` ranks of ``v`` chunks; None if nothing."""
    if v < 1 or m < 1:
        return f"v (chunks per rank) and m (micro-batches) must be >= 1, got v={v}, m={m}"
    if v > 1 and m % p:
        return (f"interleaving sends micro-batches in groups of p: m={m} must be a "
                f"multiple of the number of stages p={p}")
    return None


def check(p, m, v, where="interleaved_1f1b"):
    problem = _rule(p, m, v)
    if problem:
        raise ValueError(f"{where}: {problem}")


def interleaved_1f1b(p, m, v, s):
    """Rank ``s``'s order of work: a list of ``("F" or "B", chunk, micro-batch)``."""
    check(p, m, v)

    def forward(k):
        return (k // p) % v, (k // (p * v)) * p + k % p

    def backward(k):
        chunk, micro = forward(k)
        return v - 1 - chunk, micro

    total = m * v
    warmup = min(p - s - 1, m) if v == 1 else min((p - s - 1) * 2 + (v - 1) * p, total)
    ops = [("F", *forward(k)) for k in range(warmup)]
    for j in range(total - warmup):
        ops += [("F", *forward(warmup + j)), ("B", *backward(j))]
    return ops + [("B", *backward(j)) for j in range(total - warmup, total)]


class InterleavedStage:
    """This rank's v chunks of an interleaved pipeline.

    Args:
        chunks (list[nn.Module]): This rank's v chunks; chunk c is virtual stage c*p + rank.
        recv_shape (tuple): Shape of one micro-batch's activation between virtual stages.
        group (ProcessGroup, optional): The p ranks, in order; None for the world.
        dtype (torch.dtype): dtype of the activations between stages.

    Example::

        >>> stage = InterleavedStage([chunk0, chunk1], recv_shape=(8, 64))
        >>> loss = stage.step(m, micro_batches if rank == 0 else None,
        ...                   targets if rank == p - 1 else None, loss_fn)
        >>> optimizer.step()
    """

    def __init__(self, chunks, recv_shape, group=None, dtype=torch.float32):
        info = group_info(group, "collectives.parallel.pipeline_interleaved")
        self.chunks, self.group, self.dtype = list(chunks), group, dtype
        self.v = len(self.chunks)
        if self.v < 1:
            raise ValueError("InterleavedStage: chunks must hold at least one module")
        self.stage, self.num_stages, self.ranks = info.rank, info.size, info.ranks
        p = self.num_stages
        self.prev = info.ranks[(self.stage - 1) % p]     # global ranks, around the ring
        self.next = info.ranks[(self.stage + 1) % p]
        self.recv_shape = tuple(recv_shape)
        self.spans = []           # (global rank, "F3.1" (micro 3, chunk 1), start, end): for timelines
        self.peak_held = 0
        meet(group)

    def step(self, m, micro_batches=None, targets=None, loss_fn=None):
        """Forward and backward of every micro-batch through this rank's chunks.

        Args and Returns as :meth:`collectives.parallel.pipeline.PipelineStage.step`
        (the first rank gives the m inputs, the last the targets and ``loss_fn``).
        """
        p, v, s = self.num_stages, self.v, self.stage
        first, last = s == 0, s == p - 1
        rule = _rule(p, m, v) if isinstance(m, int) and not isinstance(m, bool) else None
        check_step(self, "InterleavedStage.step", m, micro_batches, targets, loss_fn, rule)
        self.spans, self.peak_held = [], 0
        me = dist.get_rank()
        local = {ACTIVATION: [], GRADIENT: []}    # messages to myself (p = 1): in order, like a link
        sends, held, total = [], {}, 0.0

        def deliver(tensor, peer, tag):
            if peer == me:
                local[tag].append(tensor)
            else:
                sends.append(p2p_api.isend(tensor, peer, self.group, tag=tag))

        def take(peer, tag):
            if peer == me:
                return local[tag].pop(0)
            x = torch.empty(self.recv_shape, dtype=self.dtype)
            p2p_api.recv(x, peer, self.group, tag=tag)
            return x

        for kind, c, i in interleaved_1f1b(p, m, v, s):
            model_input = first and c == 0
            model_output = last and c == v - 1
            if kind == "F":
                x = micro_batches[i] if model_input else take(self.prev, ACTIVATION).requires_grad_()
                start = time.time()
                y = self.chunks[c](x)
                if model_output:
                    y = loss_fn(y, targets[i]) / m
                    total += y.item()
                self.spans.append((me, f"F{i}.{c}", start, time.time()))
                if not model_output:
                    deliver(y.detach(), self.next, ACTIVATION)
                held[c, i] = (x, y)
                self.peak_held = max(self.peak_held, len(held))
            else:
                x, y = held.pop((c, i))
                dy = None if model_output else take(self.next, GRADIENT)
                start = time.time()
                torch.autograd.backward(y, dy)
                self.spans.append((me, f"B{i}.{c}", start, time.time()))
                if not model_input:
                    deliver(x.grad, self.prev, GRADIENT)
            sends = [work for work in sends if not (work.is_completed() and work.wait())]
        for work in sends:
            work.wait()
        return total if last else None
