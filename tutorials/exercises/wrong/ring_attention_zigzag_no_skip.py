"""Wrong (right numbers, twice the work): at every stop it computes all four blocks and masks the
ones in the future with -inf instead of skipping them. The masked entries add exp(-inf) = 0, so
the output is right; but every rank does 4N blocks where zig-zag needs 2N + 1, the very work the
layout was chosen to save."""
import math

import torch
import torch.distributed as dist


def ring_attention_zigzag(q, k, v, group=None):
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    c = q.shape[0] // 2
    mine = torch.tensor([rank] * c + [2 * n - 1 - rank] * c)            # the chunk of each query row
    offset = torch.arange(2 * c) % c                                      # the position within it
    m = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype)
    l = torch.zeros_like(m)
    o = torch.zeros_like(q)
    k, v = k.contiguous(), v.contiguous()
    for step in range(n):
        if step < n - 1:
            k_next, v_next = torch.empty_like(k), torch.empty_like(v)
            requests = dist.batch_isend_irecv([dist.P2POp(dist.isend, k, right), dist.P2POp(dist.isend, v, right),
                                               dist.P2POp(dist.irecv, k_next, left),
                                               dist.P2POp(dist.irecv, v_next, left)])
        j = (rank - step) % n
        theirs = torch.tensor([j] * c + [2 * n - 1 - j] * c)
        s = q @ k.T / math.sqrt(q.shape[-1])            # the mistake: all (2c)^2 scores, future ones too
        future = (theirs[None, :] > mine[:, None]) | ((theirs[None, :] == mine[:, None])
                                                      & (offset[None, :] > offset[:, None]))
        s = s.masked_fill(future, float("-inf"))
        m_new = torch.maximum(m, s.amax(-1))
        p = torch.exp(s - m_new.unsqueeze(-1))
        fade = torch.exp(m - m_new)
        l = l * fade + p.sum(-1)
        o = o * fade.unsqueeze(-1) + p @ v
        m = m_new
        if step < n - 1:
            for request in requests:
                request.wait()
            k, v = k_next, v_next
    return o / l.unsqueeze(-1)
