"""Wrong: right output, but scales the caller's q in place (q.mul_), so the queries it was handed change."""
import math

import torch
import torch.distributed as dist


def ring_attention(q, k, v, group=None):
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    q.mul_(1.0 / math.sqrt(q.shape[-1]))     # the mistake: scales the caller's queries in place
    m = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype)    # running maximum of each row
    l = torch.zeros_like(m)                                         # running sum of exp(s - m)
    o = torch.zeros_like(q)                                         # running sum of exp(s - m) @ v
    k, v = k.contiguous(), v.contiguous()
    for step in range(n):
        if step < n - 1:                  # post the next move first: the chunk travels while we compute
            k_next, v_next = torch.empty_like(k), torch.empty_like(v)
            requests = dist.batch_isend_irecv([dist.P2POp(dist.isend, k, right), dist.P2POp(dist.isend, v, right),
                                               dist.P2POp(dist.irecv, k_next, left),
                                               dist.P2POp(dist.irecv, v_next, left)])
        s = q @ k.T
        m_new = torch.maximum(m, s.amax(-1))
        p = torch.exp(s - m_new.unsqueeze(-1))
        fade = torch.exp(m - m_new)                 # what was summed under the old maximum, rescaled
        l = l * fade + p.sum(-1)
        o = o * fade.unsqueeze(-1) + p @ v
        m = m_new
        if step < n - 1:
            for request in requests:
                request.wait()
            k, v = k_next, v_next
    return o / l.unsqueeze(-1)
