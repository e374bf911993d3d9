"""Zig-zag ring attention: causal context parallelism with the same work on every rank.

Semantics. The plain causal ring (:mod:`collectives.parallel.ring_attention`) gives rank
r the r-th of N chunks; rank r's queries attend to r + 1 chunks of keys, so rank N-1 does
N times the work of rank 0 and everyone waits for it. Zig-zag cuts the sequence into 2N
chunks and gives rank r chunks r and 2N-1-r: one from the start, where queries see few
keys, and its mirror from the end, where they see many. Same ring, same messages; the
result is what ``F.scaled_dot_product_attention`` gives on the whole sequence, in the
zig-zag order (:func:`zigzag_split` cuts, :func:`zigzag_merge` puts back).

Optionally ``doc_ids``: packed documents, a position attending only to earlier positions
*of its own document*. The ids travel around the ring with the keys, so every rank
masks with the ids of the keys it actually holds, whatever the layout. (Positions that
restart at each document, e.g. for rotary embeddings, are computed on the whole
sequence and cut with :func:`zigzag_split` like the tokens: the layout must follow
them, which is where such bugs hide.)

Steps, rank r of N, chunk length c = S / 2N, its queries q = [Q_r ; Q_(2N-1-r)]:

1. forward: (K, V, ids) of both chunks travel N-1 times around the ring; at each stop
   rank r holds rank j's chunks {j, 2N-1-j} and, for each pair (query chunk a, key
   chunk b), skips it if b > a (the future), masks the diagonal if b == a, else attends
   in full; an online softmax folds the blocks in (running max, sum, output);
2. backward: the ring again with (K, V, ids, dK, dV); each rank adds its queries'
   gradients into the travelling dK, dV; after N moves they are home.

Work. At every other rank's stop exactly two c x c blocks are needed (j < r: (r, j) and
(2N-1-r, j); j > r: (2N-1-r, j) and (2N-1-r, 2N-1-j)), at its own three ((2N-1-r, r) in
full and the two diagonals, computed in full and masked): 2N + 1 blocks of c^2 score
entries on every rank. The plain ring's rank r computes r + 1 blocks of (2c)^2 (its
diagonal computed in full and masked): the busiest rank does 4N c^2, the mean 2(N+1) c^2,
a ratio of 2N/(N+1) (1.6 at N = 4) where zig-zag's is 1 (:func:`work`).

Bytes, as the plain ring: forward N-1 messages of (K, V) (2 x B heads 2c head_dim e),
backward N messages (K, V, dK, dV; the last dK, dV only), plus the ids (B x 2c
elements of q's dtype) when ``doc_ids`` is given; and first the plain ring's check
that every rank holds chunks of one shape (N-1 messages of 256 bytes).

Worked example, N = 4, S = 16, c = 2: rank 0 holds positions 0-1 and 14-15, rank 1
2-3 and 12-13, rank 2 4-5 and 10-11, rank 3 6-7 and 8-9. Rank 0 at the stop where it
holds rank 2's keys (positions 4-5, 10-11): its queries 14-15 see both, its queries 0-1
neither: two blocks, as at every stop.

References: H. Liu, M. Zaharia, P. Abbeel, "Ring Attention with Blockwise Transformers",
2023; the zig-zag layout of Zhu's ring-flash-attention (2024) and Llama 3's context
parallelism (Dubey et al., "The Llama 3 Herd of Models", 2024, section 3.3.2).
"""

import torch
import torch.distributed as dist

from .ring_attention import _ring, check_chunks, start_online_softmax


def work(n, zigzag=True):
    """Score entries each of ``n`` ranks computes for causal attention, in units of c^2 (c = S/2N)."""
    if zigzag:
        return [2 * n + 1] * n
    return [4 * (r + 1) for r in range(n)]


def zigzag_split(x, n, rank, dim=1):
    """Rank ``rank``'s part of a whole sequence ``x`` in the zig-zag layout: chunks rank and 2n-1-rank of 2n.

    Args:
        x (Tensor): The whole sequence along ``dim``; its length must be divisible by 2n.
        n (int): The context-parallel ranks.
        rank (int): This rank within them.
        dim (int): The sequence's dimension.

    Returns:
        Tensor: the two chunks, concatenated along ``dim`` (length S / n).

    Example::

        >>> zigzag_split(torch.arange(8), 2, 0, dim=0)
        tensor([0, 1, 6, 7])
    """
    if x.shape[dim] % (2 * n):
        raise ValueError(f"zigzag_split: the sequence length {x.shape[dim]} must be divisible by 2N = {2 * n} "
                         f"(two chunks per rank)")
    chunks = x.chunk(2 * n, dim=dim)
    return torch.cat([chunks[rank], chunks[2 * n - 1 - rank]], dim=dim)


def zigzag_merge(parts, dim=1):
    """The whole sequence back from every rank's zig-zag part (``parts[r]`` from rank r)."""
    n = len(parts)
    halves = [p.chunk(2, dim=dim) for p in parts]
    return torch.cat([halves[r][0] for r in range(n)] + [halves[r][1] for r in reversed(range(n))], dim=dim)


def _pairs(r, j, n, c, causal):
    """(query half a, key half b, mask-the-diagonal) for the blocks rank r needs from rank j's chunks."""
    mine, theirs = (r, 2 * n - 1 - r), (j, 2 * n - 1 - j)
    return [(a, b, mine[a] == theirs[b]) for a in (0, 1) for b in (0, 1)
            if not (causal and theirs[b] > mine[a])]


def _mask(c, diagonal, q_ids, k_ids, dtype, device):
    """Additive mask (0 or -inf) of one c x c block: the future on a diagonal block, other documents."""
    allowed = torch.ones(c, c, dtype=torch.bool, device=device)
    if diagonal:
        allowed = allowed.tril()
    if q_ids is not None:
        allowed = allowed & (q_ids.unsqueeze(-1) == k_ids.unsqueeze(-2)).unsqueeze(1)   # (B, 1, c, c)
    if bool(allowed.all()):
        return None
    return torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(~allowed, float("-inf"))


class _ZigzagAttention(torch.autograd.Function):

    @staticmethod
    def forward(ctx, q, k, v, doc_ids, group, causal):
        n, r = dist.get_world_size(group), dist.get_rank(group)
        c = q.shape[2] // 2
        scale, q, k, v, o, m, l, size = start_online_softmax(q, k, v)
        ids = None if doc_ids is None else doc_ids.to(q.dtype)
        halves = lambda t: t.split(c, dim=2)         # noqa: E731
        my_ids = None if ids is None else ids.split(c, dim=1)

        def visit(j, block):
            nonlocal m, l
            kj, vj = halves(block[:size].view_as(k)), halves(block[size:2 * size].view_as(v))
            k_ids = None if ids is None else block[2 * size:2 * size + ids.numel()].view_as(ids).split(c, dim=1)
            for a in (0, 1):
                needed = [(b, diag) for aa, b, diag in _pairs(r, j, n, c, causal) if aa == a]
                if not needed:
                    continue
                rows = slice(a * c, (a + 1) * c)
                scores = []
                for b, diag in needed:
                    s = q[:, :, rows] @ kj[b].transpose(-1, -2) * scale
                    mask = _mask(c, diag and causal, None if ids is None else my_ids[a],
                                 None if ids is None else k_ids[b], q.dtype, q.device)
                    scores.append(s if mask is None else s + mask)
                s = torch.cat(scores, dim=-1)
                vs = torch.cat([vj[b] for b, _ in needed], dim=2)
                m_old = m[:, :, rows]
                m_new = torch.maximum(m_old, s.amax(-1))
                p = torch.exp(s - m_new.unsqueeze(-1))
                fade = torch.exp(m_old - m_new)
                l[:, :, rows] = l[:, :, rows] * fade + p.sum(-1)
                o[:, :, rows] = o[:, :, rows] * fade.unsqueeze(-1) + p @ vs
                m[:, :, rows] = m_new

        parts = [k.flatten(), v.flatten()] + ([] if ids is None else [ids.flatten()])
        _ring(group, "ring_attention_zigzag", torch.cat(parts), visit, n - 1, overlap=True)
        out = o / l.unsqueeze(-1)
        ctx.save_for_backward(q, k, v, out, m + torch.log(l), ids if ids is not None else torch.empty(0))
        ctx.group, ctx.causal, ctx.scale, ctx.r, ctx.n, ctx.c, ctx.has_ids = group, causal, scale, r, n, c, ids is not None
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse, ids = ctx.saved_tensors
        ids = ids if ctx.has_ids else None
        r, n, c, scale, causal = ctx.r, ctx.n, ctx.c, ctx.scale, ctx.causal
        grad_out = grad_out.contiguous()
        delta = (grad_out * out).sum(-1)
        dq = torch.zeros_like(q)
        size = k.numel()
        extra = 0 if ids is None else ids.numel()
        my_ids = None if ids is None else ids.split(c, dim=1)

        def visit(j, block):
            kj = block[:size].view_as(k).split(c, dim=2)
            vj = block[size:2 * size].view_as(v).split(c, dim=2)
            k_ids = None if ids is None else block[2 * size:2 * size + extra].view_as(ids).split(c, dim=1)
            grads = block[2 * size + extra:]
            dk = grads[:size].view_as(k).split(c, dim=2)      # views: adding into them adds into the block
            dv = grads[size:].view_as(v).split(c, dim=2)
            for a, b, diag in _pairs(r, j, n, c, causal):
                rows = slice(a * c, (a + 1) * c)
                s = q[:, :, rows] @ kj[b].transpose(-1, -2) * scale
                mask = _mask(c, diag and causal, None if ids is None else my_ids[a],
                             None if ids is None else k_ids[b], q.dtype, q.device)
                if mask is not None:
                    s = s + mask
                p = torch.exp(s - lse[:, :, rows].unsqueeze(-1))
                do = grad_out[:, :, rows]
                dv[b].add_(p.transpose(-1, -2) @ do)
                ds = p * (do @ vj[b].transpose(-1, -2) - delta[:, :, rows].unsqueeze(-1))
                dq[:, :, rows] += ds @ kj[b] * scale
                dk[b].add_(ds.transpose(-1, -2) @ q[:, :, rows] * scale)

        parts = [k.flatten(), v.flatten()] + ([] if ids is None else [ids.flatten()])
        travelling = torch.cat(parts)
        # [k, v, ids, dk, dv]: the ring's last move carries the block's second half, which
        # holds all of dk, dv (ids is shorter than k and v together)
        block = torch.cat([travelling, torch.zeros(2 * size, dtype=k.dtype, device=k.device)])
        home = _ring(ctx.group, "ring_attention_zigzag_backward", block, visit, n, overlap=False)
        grads = home[home.numel() - 2 * size:]
        return dq, grads[:size].view_as(k), grads[size:].view_as(v), None, None, None


def zigzag_ring_attention(q, k, v, group=None, causal=True, doc_ids=None):
    """Attention of this rank's zig-zag queries to the whole sequence, keys and values on a ring.

    Args:
        q, k, v (Tensor): This rank's two chunks, ``(B, heads, S/N, head_dim)``: chunks r and
            2N-1-r of 2N, concatenated (:func:`zigzag_split` with ``dim=2``).
        group (ProcessGroup, optional): The context-parallel group; None for the world.
        causal (bool): Each position attends to itself and the positions before it.
        doc_ids (Tensor, optional): ``(B, S/N)`` integer document ids of this rank's
            positions, in the same layout; a position attends only within its document.

    Returns:
        Tensor: ``(B, heads, S/N, head_dim)``, this rank's rows of attention over the whole
        sequence, differentiable in q, k and v.

    Raises:
        ValueError: on every rank alike, before any key moves, if one rank's input is wrong
            (q, k, v of different shapes, an odd length, doc_ids of another shape) or ranks
            hold chunks of different shapes, dtypes, ``causal`` or doc_ids.

    Example::

        >>> q, k, v = (zigzag_split(t, n, rank, dim=2) for t in (Q, K, V))
        >>> out = zigzag_ring_attention(q, k, v)
        >>> full = F.scaled_dot_product_attention(Q, K, V, is_causal=True)
        >>> torch.allclose(out, zigzag_split(full, n, rank, dim=2))
        True
    """
    fault = None
    if q.dim() == 4 and q.shape[2] % 2:
        fault = (f"this rank's sequence length {q.shape[2]} must be even "
                 f"(two chunks of S/2N): the whole sequence must be divisible by 2N")
    elif doc_ids is not None and q.dim() == 4 and tuple(doc_ids.shape) != (q.shape[0], q.shape[2]):
        fault = f"doc_ids must have shape (B, S/N) = {[q.shape[0], q.shape[2]]}, got {list(doc_ids.shape)}"
    check_chunks("zigzag_ring_attention", group, q, k, v, causal, fault,
                 ", doc_ids" if doc_ids is not None else "")
    return _ZigzagAttention.apply(q, k, v, doc_ids, group, causal)
