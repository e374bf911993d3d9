"""Wrong: the online softmax forgets to rescale. When a new chunk raises a row's maximum, the sums
made under the old maximum are kept as they were instead of being multiplied by exp(m_old - m_new)."""
import math

import torch
import torch.distributed as dist


def ring_attention(q, k, v, group=None):
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    scale = 1.0 / math.sqrt(q.shape[-1])
    m = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype)
    l = torch.zeros_like(m)
    o = torch.zeros_like(q)
    k, v = k.contiguous(), v.contiguous()
    for step in range(n):
        s = q @ k.T * scale
        m = torch.maximum(m, s.amax(-1))
        p = torch.exp(s - m.unsqueeze(-1))
        l = l + p.sum(-1)
        o = o + p @ v
        if step < n - 1:
            k_next, v_next = torch.empty_like(k), torch.empty_like(v)
            for request in dist.batch_isend_irecv([dist.P2POp(dist.isend, k, right), dist.P2POp(dist.isend, v, right),
                                                   dist.P2POp(dist.irecv, k_next, left),
                                                   dist.P2POp(dist.irecv, v_next, left)]):
                request.wait()
            k, v = k_next, v_next
    return o / l.unsqueeze(-1)
