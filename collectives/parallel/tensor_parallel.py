"""Tensor and sequence parallelism (Megatron-LM): one layer's matrices split over the ranks of a group.

What it teaches. Data parallelism copies the model; tensor parallelism cuts
each weight matrix into N pieces, one per rank of a group, so a layer too big
for one device fits on N. Megatron (Shoeybi et al., 2019) pairs two cuts so a
whole MLP or attention block needs one collective forward and one backward:

1. **column-parallel** linear ``Y_r = X A_r``: rank r keeps the columns A_r of
   the first weight (rows of torch's ``weight``), sees the whole input X and
   computes its slice of the hidden units, no message needed; GeLU is applied
   slice by slice;
2. **row-parallel** linear ``Z = sum_r Y_r B_r``: rank r keeps the rows B_r of
   the second weight that match its slice, computes a partial output, and an
   **all_reduce** sums the partials (the operator Megatron calls *g*).
   Backward runs the mirror image: the gradient of X is a sum of N partial
   gradients, so the operator *f* in front of the column-parallel linear is the
   identity forward and an **all_reduce** backward.

Per block (an MLP, or attention with heads split over the ranks) that is one
all_reduce of the activation (S x B x H values) forward and one backward.

**Sequence parallelism** (Korthikanti et al., 2022). Between blocks the
activations are replicated on every rank, and LayerNorm, dropout and the residual
add repeat the same work on N copies. A ring all_reduce *is* a reduce_scatter
followed by an all_gather (chapter 4), so split it there: the row-parallel linear
ends with a **reduce_scatter** along the sequence (each rank keeps S/N positions)
and the next column-parallel linear starts with an **all_gather**; backward swaps
them. The same bytes cross the wire, and the activations between blocks take 1/N
of the memory. The price: parameters that act on the sequence shards (LayerNorm,
the row-parallel bias) see only S/N positions, so their gradients are summed over
the group once per step (:func:`reduce_replicated_grads`).

**The input check**, with or without sequence parallelism. Before a block's first
collective, every rank's input (the whole activation, or its shard) is compared
(:func:`collectives.parallel.shapes.same_shapes`: N-1 messages of 256 bytes per rank), so a
rank holding another input (a longer sequence, another batch) makes every rank raise the
same ValueError at once, instead of an all_reduce or all_gather of two sizes whose messages
never pair; the layers after it receive shapes derived from that one input and are not
checked again (a block checks once, in its attention's QKV projection; a lone layer checks
its own input).

Activations are laid out ``(sequence, batch, hidden)``, Megatron's order, so a
sequence shard is a contiguous slice along dim 0. The collectives are this
library's, with the ring algorithms named so the byte counts in chapter 17 hold.

References: M. Shoeybi et al., "Megatron-LM: Training Multi-Billion Parameter
Language Models Using Model Parallelism", 2019; V. Korthikanti et al.,
"Reducing Activation Recomputation in Large Transformer Models", 2022.
"""
import copy
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from .. import api, tensor_api
from .shapes import same_shapes

ALGORITHM = "ring"   # all_reduce, all_gather and reduce_scatter: the chapter's byte counts are the ring's


def _same_input(where, x, group, whole_sequence, sequence_parallel=True):
    """Every rank's input of one shape and dtype, or the same ValueError on every rank before the
    layer's first collective (whose messages would otherwise never pair: one rank's all_reduce
    or all_gather of another size waits until ``COLLECTIVES_TIMEOUT``)."""
    n, _ = _shape(group)
    fault = None
    if sequence_parallel and whole_sequence and x.dim() and x.shape[0] % n:
        fault = f"the sequence length {x.shape[0]} is not divisible by the group size {n}"
    if sequence_parallel:
        kind = "the whole sequence (S, B, features)" if whole_sequence else "a sequence shard (S/N, B, hidden)"
    else:
        kind = "its slice of the features (S, B, features/N)" if whole_sequence else "the same input (S, B, hidden)"
    same_shapes(where, group, f"x {list(x.shape)} {str(x.dtype).replace('torch.', '')}", fault,
                f"every rank must hold {kind} of one shape and dtype")


def _shape(group):
    """(N, this rank's place in the group); a rank outside the group has no slice to hold."""
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError(f"tensor parallel: rank {dist.get_rank()} is not a member of the group")
    return dist.get_world_size(group), rank


# --- the four operators: identity one way, a collective the other ---------------------------

class _CopyToParallel(torch.autograd.Function):
    """f: identity forward, all_reduce of the gradient backward (in front of a column-parallel linear)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()   # reduced in place: never touch autograd's own buffer
        api.all_reduce(grad, group=ctx.group, algorithm=ALGORITHM)
        return grad, None


class _ReduceFromParallel(torch.autograd.Function):
    """g: all_reduce forward (sums the row-parallel partials), identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        out = x.contiguous().clone()
        api.all_reduce(out, group=group, algorithm=ALGORITHM)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def _gather_sequence(x, group):
    n, _ = _shape(group)
    out = x.new_empty((n * x.shape[0],) + tuple(x.shape[1:]))
    tensor_api.all_gather_into_tensor(out, x.contiguous(), group=group, algorithm=ALGORITHM)
    return out


def _scatter_sequence(x, group):
    n, _ = _shape(group)
    if x.shape[0] % n:
        raise ValueError(f"sequence parallel: the sequence length {x.shape[0]} is not divisible by "
                         f"the group size {n}")
    out = x.new_empty((x.shape[0] // n,) + tuple(x.shape[1:]))
    tensor_api.reduce_scatter_tensor(out, x.contiguous(), group=group, algorithm=ALGORITHM)
    return out


class _GatherSequence(torch.autograd.Function):
    """Sequence parallel f: all_gather the sequence shards forward, reduce_scatter backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _gather_sequence(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _scatter_sequence(grad, ctx.group), None


class _ScatterSequence(torch.autograd.Function):
    """Sequence parallel g: reduce_scatter the partials onto sequence shards forward, all_gather backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _scatter_sequence(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _gather_sequence(grad, ctx.group), None


class _GatherLinear(torch.autograd.Function):
    """Sequence parallel f and the linear in one (``sequence_parallel="regather"``): keep only this
    rank's shard for backward and all_gather it again there (Megatron's way: activation memory
    /N, for one more all_gather per column-parallel linear)."""

    @staticmethod
    def forward(ctx, x, weight, bias, group):
        ctx.save_for_backward(x, weight)
        ctx.group, ctx.has_bias = group, bias is not None
        return F.linear(_gather_sequence(x, group), weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        whole = _gather_sequence(x, ctx.group)                  # again: it was not kept
        grad_x = _scatter_sequence(grad @ weight, ctx.group)
        grad2d = grad.reshape(-1, grad.shape[-1])
        grad_w = grad2d.t() @ whole.reshape(-1, whole.shape[-1])
        return grad_x, grad_w, grad2d.sum(0) if ctx.has_bias else None, None


# --- overlap: the sequence-parallel collectives cut in chunks, each chunk's messages moving
# while the previous chunk's matrix product runs (Megatron's tp-comm-overlap, by collectives) ---
#
# Rank r's shard holds positions [r s, (r+1) s) of the gathered sequence (s = S/N). Chunk k is
# positions [k c, (k+1) c) of *every* shard (c = s / chunks), so one all_gather_into_tensor of
# each rank's chunk k yields N pieces of c positions, rank-major, and one reduce_scatter_tensor
# of N such pieces leaves each rank its own chunk k. Chunk k+1's collective is issued with
# async_op=True before chunk k's product: the group's lane thread moves it meanwhile. Each row
# of the output is the same dot products as without chunks; only the rows' grouping into GEMM
# calls differs. ``waits`` (a list or None) receives (start, end) of every wait for a chunk's
# messages: the communication left exposed.

def _check_overlap(overlap, sequence_parallel):
    if not isinstance(overlap, int) or overlap < 0:
        raise ValueError(f"tensor parallel: overlap={overlap!r} must be a chunk count >= 0")
    if overlap and sequence_parallel is not True:
        raise ValueError(f"tensor parallel: overlap={overlap} needs sequence_parallel=True (it chunks the "
                         f"all_gather and reduce_scatter), not {sequence_parallel!r}")
    return overlap


def _check_chunks(s, chunks, what):
    if chunks < 1 or s % chunks:
        raise ValueError(f"tensor parallel overlap: {what} of {s} positions per rank is not divisible "
                         f"by overlap={chunks} chunks")
    return s // chunks


def _timed_wait(work, waits):
    if waits is None:
        work.wait()
        return
    t = time.time()
    work.wait()
    waits.append((t, time.time()))


def gather_linear_overlapped(x, weight, bias, group, chunks, waits=None):
    """``F.linear(all_gather(x), weight, bias)`` along dim 0 with the all_gather in ``chunks``
    pieces, piece k+1 in flight while piece k is multiplied. Returns (output, gathered input)."""
    n, _ = _shape(group)
    s = x.shape[0]
    c = _check_chunks(s, chunks, "a sequence shard")
    x = x.contiguous()
    whole = x.new_empty((n, s) + tuple(x.shape[1:]))
    out = x.new_empty((n, s) + tuple(x.shape[1:-1]) + (weight.shape[0],))
    parts = [x.new_empty((n * c,) + tuple(x.shape[1:])) for _ in range(chunks)]

    def start(k):
        return tensor_api.all_gather_into_tensor(parts[k], x[k * c:(k + 1) * c].contiguous(), group=group,
                                                 async_op=True, algorithm=ALGORITHM)
    work = start(0)
    for k in range(chunks):
        following = start(k + 1) if k + 1 < chunks else None    # issued before this chunk's product
        _timed_wait(work, waits)
        piece = parts[k].view((n, c) + tuple(x.shape[1:]))
        whole[:, k * c:(k + 1) * c] = piece
        out[:, k * c:(k + 1) * c] = F.linear(piece, weight, bias)
        work = following
    return out.view((n * s,) + tuple(out.shape[2:])), whole.view((n * s,) + tuple(x.shape[1:]))


def linear_scatter_overlapped(x, weight, group, chunks, waits=None):
    """``reduce_scatter(F.linear(x, weight))`` along dim 0 with the product in ``chunks`` pieces,
    piece k's reduce_scatter in flight while piece k+1 is multiplied."""
    n, _ = _shape(group)
    if x.shape[0] % n:
        raise ValueError(f"sequence parallel: the sequence length {x.shape[0]} is not divisible by "
                         f"the group size {n}")
    s = x.shape[0] // n
    c = _check_chunks(s, chunks, "a sequence shard")
    grid = x.view((n, s) + tuple(x.shape[1:]))
    out = x.new_empty((s,) + tuple(x.shape[1:-1]) + (weight.shape[0],))
    works = []
    for k in range(chunks):
        partial = F.linear(grid[:, k * c:(k + 1) * c], weight).reshape((n * c,) + tuple(out.shape[1:]))
        works.append(tensor_api.reduce_scatter_tensor(out[k * c:(k + 1) * c], partial, group=group,
                                                      async_op=True, algorithm=ALGORITHM))
    for work in works:
        _timed_wait(work, waits)
    return out


class _GatherLinearOverlap(torch.autograd.Function):
    """Sequence-parallel column linear, overlapped: all_gather/product forward, product/reduce_scatter
    backward (the input's gradient), each in chunks."""

    @staticmethod
    def forward(ctx, x, weight, bias, group, chunks, waits):
        y, whole = gather_linear_overlapped(x, weight, bias, group, chunks, waits)
        ctx.save_for_backward(whole, weight)
        ctx.group, ctx.chunks, ctx.waits, ctx.has_bias = group, chunks, waits, bias is not None
        return y

    @staticmethod
    def backward(ctx, grad):
        whole, weight = ctx.saved_tensors
        grad = grad.contiguous()
        grad_x = linear_scatter_overlapped(grad, weight.t(), ctx.group, ctx.chunks, ctx.waits)
        grad2d = grad.reshape(-1, grad.shape[-1])
        grad_w = grad2d.t() @ whole.reshape(-1, whole.shape[-1])
        return grad_x, grad_w, grad2d.sum(0) if ctx.has_bias else None, None, None, None


class _LinearScatterOverlap(torch.autograd.Function):
    """Sequence-parallel row linear (no bias), overlapped: product/reduce_scatter forward,
    all_gather/product backward."""

    @staticmethod
    def forward(ctx, x, weight, group, chunks, waits):
        ctx.save_for_backward(x, weight)
        ctx.group, ctx.chunks, ctx.waits = group, chunks, waits
        return linear_scatter_overlapped(x.contiguous(), weight, group, chunks, waits)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad_x, whole_grad = gather_linear_overlapped(grad, weight.t(), None, ctx.group, ctx.chunks, ctx.waits)
        grad_w = whole_grad.reshape(-1, whole_grad.shape[-1]).t() @ x.reshape(-1, x.shape[-1])
        return grad_x, grad_w, None, None, None


# --- the layers ---------------------------------------------------------------------------------

class ColumnParallelLinear(nn.Module):
    """``y = x A^T + b`` with A's rows (output features) split over the group: rank r computes
    ``out_features / N`` of the outputs, for the whole input.

    Args:
        in_features, out_features (int): As ``nn.Linear``; ``out_features`` divisible by N.
        bias (bool): A bias, split like the outputs.
        group (ProcessGroup, optional): The tensor-parallel group; None for the world.
        sequence_parallel (bool or "regather"): The input is this rank's sequence shard
            ``(S/N, B, in)``, all-gathered first; else the whole input ``(S, B, in)``, the
            same on every rank. "regather": keep only the shard for backward and gather it
            again there (activation memory /N; one all_gather more per step).
        overlap (int): With ``sequence_parallel=True``, cut the all_gather (and backward's
            reduce_scatter) into this many chunks along each shard's positions, chunk k+1's
            messages moving while chunk k is multiplied; 0 (the default): the plain path;
            1: one chunk, waited for at once (no overlap, but its waits recorded, see
            :func:`exposed_waits`). The same bytes; one message per chunk more per ring step.

    Example::

        >>> fc = ColumnParallelLinear.from_linear(nn.Linear(8, 16), group=tp)   # tp: 2 ranks
        >>> fc(x).shape                                                          # x: (S, B, 8)
        torch.Size([S, B, 8])   # 8 of the 16 outputs on each rank
    """

    def __init__(self, in_features, out_features, bias=True, group=None, sequence_parallel=False, dtype=None,
                 overlap=0):
        super().__init__()
        n, _ = _shape(group)
        self.overlap, self.waits = _check_overlap(overlap, sequence_parallel), None
        if out_features % n:
            raise ValueError(f"ColumnParallelLinear: out_features={out_features} is not divisible by "
                             f"the group size {n}")
        self.group, self.sequence_parallel = group, sequence_parallel
        self.check_input = True     # compare every rank's input shape before the first collective
        local = nn.Linear(in_features, out_features // n, bias=bias, dtype=dtype)
        self.weight, self.bias = local.weight, local.bias

    @classmethod
    def from_linear(cls, linear, group=None, sequence_parallel=False, overlap=0):
        """This rank's slice of a whole ``nn.Linear`` (the same on every rank)."""
        n, r = _shape(group)
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None, group,
                    sequence_parallel, linear.weight.dtype, overlap)
        with torch.no_grad():
            layer.weight.copy_(linear.weight.chunk(n, 0)[r])
            if linear.bias is not None:
                layer.bias.copy_(linear.bias.chunk(n, 0)[r])
        return layer

    def forward(self, x):
        if self.check_input:
            _same_input("ColumnParallelLinear", x, self.group, False, bool(self.sequence_parallel))
        if self.overlap:
            return _GatherLinearOverlap.apply(x, self.weight, self.bias, self.group, self.overlap, self.waits)
        if self.sequence_parallel == "regather":
            return _GatherLinear.apply(x, self.weight, self.bias, self.group)
        x = (_GatherSequence if self.sequence_parallel else _CopyToParallel).apply(x, self.group)
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """``y = x A^T + b`` with A's columns (input features) split over the group: rank r takes
    its ``in_features / N`` slice of the input (a column-parallel layer's output) and the
    partial outputs are summed, by all_reduce, or by reduce_scatter onto sequence shards.

    Args:
        in_features, out_features (int): As ``nn.Linear``; ``in_features`` divisible by N.
        bias (bool): A bias, whole on every rank, added after the sum.
        group (ProcessGroup, optional): The tensor-parallel group; None for the world.
        sequence_parallel (bool): Leave each rank its sequence shard ``(S/N, B, out)``;
            the bias then needs :func:`reduce_replicated_grads`.
        overlap (int): With ``sequence_parallel=True``, cut the product and its reduce_scatter
            (backward: the all_gather and the product) into this many chunks, one chunk's
            messages moving while the next is multiplied; 0: the plain path, 1: one chunk.
    """

    def __init__(self, in_features, out_features, bias=True, group=None, sequence_parallel=False, dtype=None,
                 overlap=0):
        super().__init__()
        n, _ = _shape(group)
        self.overlap, self.waits = _check_overlap(overlap, sequence_parallel), None
        if in_features % n:
            raise ValueError(f"RowParallelLinear: in_features={in_features} is not divisible by "
                             f"the group size {n}")
        self.group, self.sequence_parallel = group, sequence_parallel
        self.check_input = True     # compare every rank's input shape before the first collective
        local = nn.Linear(in_features // n, out_features, bias=bias, dtype=dtype)
        with torch.no_grad():   # nn.Linear's init for the whole layer: its fan-in is in_features, not in/N
            for p in local.parameters():
                p.uniform_(-in_features ** -0.5, in_features ** -0.5)
        self.weight, self.bias = local.weight, local.bias
        if self.bias is not None and sequence_parallel:
            self.bias.sequence_parallel = True   # its gradient is a sum over the sequence shards

    @classmethod
    def from_linear(cls, linear, group=None, sequence_parallel=False, overlap=0):
        n, r = _shape(group)
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None, group,
                    sequence_parallel, linear.weight.dtype, overlap)
        with torch.no_grad():
            layer.weight.copy_(linear.weight.chunk(n, 1)[r])
            if linear.bias is not None:
                layer.bias.copy_(linear.bias)
        return layer

    def forward(self, x):
        if self.check_input:
            _same_input("RowParallelLinear", x, self.group, True, bool(self.sequence_parallel))
        if self.overlap:
            y = _LinearScatterOverlap.apply(x, self.weight, self.group, self.overlap, self.waits)
            return y if self.bias is None else y + self.bias
        partial = F.linear(x, self.weight)
        y = (_ScatterSequence if self.sequence_parallel else _ReduceFromParallel).apply(partial, self.group)
        return y if self.bias is None else y + self.bias


class ParallelMLP(nn.Module):
    """Linear, GeLU, Linear: column-parallel then row-parallel, one collective each way.

    Args:
        hidden, ffn (int): Widths; ``ffn`` divisible by N.
        group, sequence_parallel, overlap: As :class:`ColumnParallelLinear`.
    """

    def __init__(self, hidden, ffn, group=None, sequence_parallel=False, dtype=None, overlap=0):
        super().__init__()
        self.fc1 = ColumnParallelLinear(hidden, ffn, True, group, sequence_parallel, dtype, overlap)
        self.fc2 = RowParallelLinear(ffn, hidden, True, group, sequence_parallel, dtype, overlap)
        self.fc2.check_input = False    # its input's shape follows from fc1's, checked there

    @classmethod
    def from_mlp(cls, mlp, group=None, sequence_parallel=False, overlap=0):
        """From ``nn.Sequential(nn.Linear(H, F), nn.GELU(), nn.Linear(F, H))`` (see :class:`Block`)."""
        self = cls(mlp[0].in_features, mlp[0].out_features, group, sequence_parallel, mlp[0].weight.dtype, overlap)
        self.fc1 = ColumnParallelLinear.from_linear(mlp[0], group, sequence_parallel, overlap)
        self.fc2 = RowParallelLinear.from_linear(mlp[2], group, sequence_parallel, overlap)
        self.fc2.check_input = False
        return self

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class ParallelAttention(nn.Module):
    """Causal self-attention with the heads split over the group: rank r projects Q, K, V for
    its ``heads / N`` heads (column-parallel), attends, and the output projection is
    row-parallel. Input and output ``(S, B, hidden)``, or sequence shards of it.

    Args:
        hidden, heads (int): ``heads`` divisible by N and dividing ``hidden``.
        group, sequence_parallel: As :class:`ColumnParallelLinear`.
    """

    def __init__(self, hidden, heads, group=None, sequence_parallel=False, dtype=None, overlap=0):
        super().__init__()
        n, _ = _shape(group)
        if heads % n or hidden % heads:
            raise ValueError(f"ParallelAttention: heads={heads} must be divisible by the group size {n} "
                             f"and divide hidden={hidden}")
        self.local_heads, self.head_dim = heads // n, hidden // heads
        # one fused projection: rank r's rows are [Q of its heads; K of its heads; V of its heads]
        self.qkv = ColumnParallelLinear(hidden, 3 * hidden, True, group, sequence_parallel, dtype, overlap)
        self.out = RowParallelLinear(hidden, hidden, True, group, sequence_parallel, dtype, overlap)
        self.out.check_input = False    # its input's shape follows from qkv's, checked there

    @classmethod
    def from_attention(cls, mha, group=None, sequence_parallel=False, overlap=0):
        """This rank's heads of an ``nn.MultiheadAttention`` (``in_proj_weight`` is [Wq; Wk; Wv])."""
        n, r = _shape(group)
        hidden = mha.embed_dim
        self = cls(hidden, mha.num_heads, group, sequence_parallel, mha.in_proj_weight.dtype, overlap)
        with torch.no_grad():
            mine = lambda t: torch.cat([part.chunk(n, 0)[r] for part in t.chunk(3, 0)])  # noqa: E731
            self.qkv.weight.copy_(mine(mha.in_proj_weight))
            self.qkv.bias.copy_(mine(mha.in_proj_bias))
        self.out = RowParallelLinear.from_linear(mha.out_proj, group, sequence_parallel, overlap)
        self.out.check_input = False
        return self

    def forward(self, x):
        qkv = self.qkv(x)                                   # (S, B, 3 * local heads * head_dim)
        s, b = qkv.shape[:2]
        q, k, v = qkv.view(s, b, 3, self.local_heads, self.head_dim).permute(2, 1, 3, 0, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)   # (B, heads, S, head_dim)
        return self.out(y.permute(2, 0, 1, 3).reshape(s, b, -1))


class Block(nn.Module):
    """The single-process transformer block the parallel ones are cut from (pre-LayerNorm):
    ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``; input ``(S, B, hidden)``."""

    def __init__(self, hidden, heads, ffn, dtype=None):
        super().__init__()
        self.ln1 = nn.LayerNorm(hidden, dtype=dtype)
        self.attn = nn.MultiheadAttention(hidden, heads, dtype=dtype)
        self.ln2 = nn.LayerNorm(hidden, dtype=dtype)
        self.mlp = nn.Sequential(nn.Linear(hidden, ffn, dtype=dtype), nn.GELU(), nn.Linear(ffn, hidden, dtype=dtype))

    def forward(self, x):
        h = self.ln1(x)
        mask = torch.ones(x.shape[0], x.shape[0], dtype=torch.bool, device=x.device).triu(1)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class ParallelBlock(nn.Module):
    """:class:`Block` with its attention and MLP tensor-parallel over ``group`` (the LayerNorms
    whole on every rank; with ``sequence_parallel`` they act on sequence shards; ``overlap``: as
    :class:`ColumnParallelLinear`)."""

    def __init__(self, block, group=None, sequence_parallel=False, overlap=0):
        super().__init__()
        self.ln1, self.ln2 = copy.deepcopy(block.ln1), copy.deepcopy(block.ln2)
        if sequence_parallel:
            for p in (*self.ln1.parameters(), *self.ln2.parameters()):
                p.sequence_parallel = True
        self.attn = ParallelAttention.from_attention(block.attn, group, sequence_parallel, overlap)
        self.mlp = ParallelMLP.from_mlp(block.mlp, group, sequence_parallel, overlap)
        self.mlp.fc1.check_input = False    # the MLP's input has the block input's shape, checked by attn.qkv

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


def reduce_replicated_grads(module, group=None):
    """Sum over the group the gradients of parameters that saw only this rank's sequence shard
    (marked ``p.sequence_parallel``: LayerNorms, row-parallel biases), in one all_reduce.

    Call after ``backward()`` when ``sequence_parallel`` is on; without it there is nothing to
    do (those gradients are already whole and equal on every rank). Returns the bytes reduced.
    """
    params = [p for p in module.parameters() if getattr(p, "sequence_parallel", False) and p.grad is not None]
    if not params:
        return 0
    flat = torch.cat([p.grad.flatten() for p in params])
    api.all_reduce(flat, group=group, algorithm=ALGORITHM)
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))
        offset += p.numel()
    return flat.numel() * flat.element_size()


def exposed_waits(module):
    """Give every tensor-parallel linear of ``module`` one shared list that overlapped layers fill with
    the (start, end) of each wait for a chunk's messages; return it."""
    waits = []
    for m in module.modules():
        if isinstance(m, (ColumnParallelLinear, RowParallelLinear)):
            m.waits = waits
    return waits
