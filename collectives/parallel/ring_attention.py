"""Context parallelism: ring attention, the sequence split over the ranks, keys and values on a ring.

What it teaches. Attention over a sequence of S positions holds an S x S score
matrix per head, and every position needs every key before it. Context
parallelism gives rank r the r-th chunk of S/N positions, for every layer, and
moves keys and values instead of queries (Liu et al., "Ring Attention", 2023;
Megatron-Core's context parallelism is this ring of point-to-point sends by
default, ``cp_comm_type="p2p"``; Llama 3's gathers the keys and values with an
all_gather instead):

1. rank r computes Q, K, V for its own chunk;
2. **forward**: the (K, V) chunk travels around the ring: N-1 times each rank
   sends the chunk it holds to rank r+1 and receives one from rank r-1, and in
   the meantime attends its queries to the chunk it has. An *online softmax*
   (Milakov & Gimelshein, 2018; FlashAttention) folds one chunk at a time into
   a running maximum m, a running sum l and an unnormalised output o, so a rank
   holds two travelling (K, V) chunks (the one it attends to and the one
   arriving, two buffers swapped at each move) besides its own K and V, kept
   for backward, and scores only in S/N x S/N blocks per head, never S/N x S;
3. **backward**: the same ring again, the chunk now (K, V, dK, dV): each rank
   adds its queries' contribution to the travelling dK, dV before passing them
   on, and after N moves every chunk's gradient is complete and home (the last
   move carries dK, dV only). dQ stays where it is.

Causal attention: chunk j < r is attended in full, chunk r with the causal mask,
chunks j > r not at all (they still pass through: the ring is the ring). So low
ranks idle while high ranks work; the "zig-zag" chunk order fixes that
(:mod:`collectives.parallel.ring_attention_zigzag`).

Bytes rank r sends for one layer and step, c = bytes of one K chunk
(B x heads x S/N x head_dim x e): forward (N-1) x 2c in N-1 messages, backward
(N-1) x 4c + 2c in N messages. Before the forward's first key moves, every rank's
chunk is compared (:func:`collectives.parallel.shapes.same_shapes`: one line each,
"q, k, v [B, heads, S/N, head_dim] dtype", in a ring all_gather of N-1 messages of
256 bytes), so a rank whose chunk differs (a longer sequence, other heads) makes every
rank raise the same ValueError at once instead of waiting out the timeout.

Every message goes through the library's door: one ring pass is one call through
:mod:`collectives.call` (``CallState`` and ``run``: the group's engine lane, tags
that name the call, timeouts, desync check, traffic counters and traces).
"""
import math

import torch
import torch.distributed as dist

from ..call import CallState, nbytes, run
from .shapes import same_shapes

NEED = "every rank must hold q, k, v of one shape (B, heads, S/N, head_dim) and dtype, and the same causal"


def check_chunks(where, group, q, k, v, causal, fault=None, extra=""):
    """Refuse on every rank alike chunks that differ between ranks or are wrong on one (``fault``)."""
    if fault is None and not (q.shape == k.shape == v.shape and q.dim() == 4):
        fault = (f"q, k, v must share one shape (B, heads, S/N, head_dim), got "
                 f"{list(q.shape)}, {list(k.shape)}, {list(v.shape)}")
    if fault is None and not q.dtype == k.dtype == v.dtype:
        fault = f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}"
    line = f"q, k, v {list(q.shape)} {str(q.dtype).replace('torch.', '')}, {'causal' if causal else 'full'}{extra}"
    same_shapes(where, group, line, fault, NEED)


def start_online_softmax(q, k, v):
    """The forward's starting state: 1/sqrt(d), q, k, v detached, output o = 0, running max m = -inf,
    running sum l = 0, and the number of elements of one K chunk."""
    q, k, v = q.detach(), k.detach(), v.detach()
    m = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype, device=q.device)
    return 1.0 / math.sqrt(q.shape[-1]), q, k, v, torch.zeros_like(q), m, torch.zeros_like(m), k.numel()


def _ring(group, name, block, visit, moves, overlap):
    """Pass ``block`` (flat) around the group's ring ``moves`` times, calling ``visit(j, block)``
    on each chunk j as it passes; returns the block this rank holds at the end.

    ``overlap``: post each message before visiting (the visit only reads the chunk), else
    visit first (the visit writes into the chunk, which must then travel). With ``moves == N``
    the last move carries the second half of the block only (the gradients)."""
    call = CallState(name, group, None)
    call.check_tensor("block", block)
    if not call.member:
        raise ValueError(f"collectives.{name}: rank {call.me} is not a member of the group")
    n, r = call.size, call.info.rank
    held = {}

    def body(comm):
        right, left = (r + 1) % n, (r - 1) % n
        cur, nxt = block, torch.empty_like(block)
        with torch.no_grad():                        # the lane's thread has its own grad mode
            for step in range(moves):
                part = slice(block.numel() // 2 if step == n - 1 else 0, None)
                if not overlap:
                    visit((r - step) % n, cur)
                pending = comm.post(step, sends=[(cur[part], right)], recvs=[(nxt[part], left)])
                if overlap:
                    visit((r - step) % n, cur)        # computed while the chunk travels
                pending.wait()
                cur, nxt = nxt, cur
            if moves < n:
                visit((r - moves) % n, cur)
        held["block"] = cur
        return [cur]

    def local():
        with torch.no_grad():
            visit(r, block)
        held["block"] = block
        return [block]
    run(call, "ring", body, False, nbytes(block), local=local,
        shape=list(block.shape), dtype=block.dtype, moves=moves)
    return held["block"]


def _scores(q, k, scale, j, r, causal):
    s = q @ k.transpose(-1, -2) * scale
    if causal and j == r:
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
    return s


class _RingAttention(torch.autograd.Function):

    @staticmethod
    def forward(ctx, q, k, v, group, causal):
        n, r = dist.get_world_size(group), dist.get_rank(group)
        scale, q, k, v, o, m, l, size = start_online_softmax(q, k, v)

        def visit(j, block):
            nonlocal m, l
            if causal and j > r:
                return
            kj, vj = block[:size].view_as(k), block[size:].view_as(v)
            s = _scores(q, kj, scale, j, r, causal)
            m_new = torch.maximum(m, s.amax(-1))
            p = torch.exp(s - m_new.unsqueeze(-1))
            fade = torch.exp(m - m_new)                    # rescale what was summed under the old maximum
            l = l * fade + p.sum(-1)
            o.mul_(fade.unsqueeze(-1)).add_(p @ vj)
            m = m_new

        _ring(group, "ring_attention", torch.cat([k.flatten(), v.flatten()]), visit, n - 1, overlap=True)
        out = o / l.unsqueeze(-1)
        ctx.save_for_backward(q, k, v, out, m + torch.log(l))
        ctx.group, ctx.causal, ctx.scale, ctx.r, ctx.n = group, causal, scale, r, n
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        r, scale, causal = ctx.r, ctx.scale, ctx.causal
        grad_out = grad_out.contiguous()
        delta = (grad_out * out).sum(-1, keepdim=True)        # rowsum(dO * O)
        dq = torch.zeros_like(q)
        size = k.numel()

        def visit(j, block):
            if causal and j > r:
                return
            kj, vj = block[:size].view_as(k), block[size:2 * size].view_as(v)
            dk, dv = block[2 * size:3 * size].view_as(k), block[3 * size:].view_as(v)
            p = torch.exp(_scores(q, kj, scale, j, r, causal) - lse.unsqueeze(-1))
            dv.add_(p.transpose(-1, -2) @ grad_out)
            ds = p * (grad_out @ vj.transpose(-1, -2) - delta)
            dq.add_(ds @ kj * scale)
            dk.add_(ds.transpose(-1, -2) @ q * scale)

        block = torch.cat([k.flatten(), v.flatten(), torch.zeros(2 * size, dtype=k.dtype, device=k.device)])
        home = _ring(ctx.group, "ring_attention_backward", block, visit, ctx.n, overlap=False)
        return dq, home[2 * size:3 * size].view_as(k), home[3 * size:].view_as(v), None, None


def ring_attention(q, k, v, group=None, causal=True):
    """Attention of this rank's queries to the whole sequence, its keys and values passed on a ring.

    Args:
        q, k, v (Tensor): This rank's chunk of the sequence, ``(B, heads, S/N, head_dim)``:
            rank r holds positions ``r * S/N`` to ``(r + 1) * S/N - 1`` (the same chunk
            length on every rank).
        group (ProcessGroup, optional): The context-parallel group; None for the world.
        causal (bool): Each position attends to itself and the positions before it.

    Returns:
        Tensor: ``softmax(q k^T / sqrt(d)) v`` for this rank's queries, ``(B, heads, S/N,
        head_dim)``, differentiable in q, k and v; what
        ``F.scaled_dot_product_attention`` gives on the whole sequence, cut the same way.

    Raises:
        ValueError: on every rank alike, before any key moves, if q, k, v differ in shape or
            dtype on one rank, or ranks hold chunks of different shapes, dtypes or ``causal``.

    Example::

        >>> out = ring_attention(q, k, v)          # 4 ranks, each 1/4 of the sequence
        >>> full = F.scaled_dot_product_attention(Q, K, V, is_causal=True)
        >>> torch.allclose(out, full.chunk(4, dim=2)[rank])
        True
    """
    check_chunks("ring_attention", group, q, k, v, causal)
    return _RingAttention.apply(q, k, v, group, causal)
