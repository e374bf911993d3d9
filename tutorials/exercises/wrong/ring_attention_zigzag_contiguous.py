"""Wrong: the plain causal ring, as if rank r held positions 2cr to 2c(r+1) - 1 (the contiguous
layout). Its two chunks are r and 2N-1-r of 2N, so it masks the wrong keys: right on one rank
(where both layouts are the whole sequence), wrong from two on. Had the inputs been laid out
contiguously it would be right, and rank N-1 would do N times rank 0's work."""
import math

import torch
import torch.distributed as dist


def ring_attention_zigzag(q, k, v, group=None):
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % n, (rank - 1) % n
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
        if j <= rank:                        # the mistake: rank j's keys taken as all before rank r's queries
            s = q @ k.T / math.sqrt(q.shape[-1])
            if j == rank:
                s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
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
