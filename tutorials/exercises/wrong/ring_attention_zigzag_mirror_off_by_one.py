"""Wrong: the mirror chunk off by one, 2N - r where it is 2N-1-r. The first chunk's rows are
right; the second's queries attend in full to their own chunk (no diagonal mask: they see the
keys after them) and take rank r-1's mirror chunk, all future, for a diagonal."""
import math

import torch
import torch.distributed as dist


def fold(q, k, v, m, l, o, diagonal):
    """Fold one block of keys into the running (m, l, o) of the queries ``q`` (views: updated in place)."""
    s = q @ k.T / math.sqrt(q.shape[-1])
    if diagonal:                                    # the same chunk: a position sees itself and before
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
    m_new = torch.maximum(m, s.amax(-1))
    p = torch.exp(s - m_new.unsqueeze(-1))
    fade = torch.exp(m - m_new)                     # what was summed under the old maximum, rescaled
    l.mul_(fade).add_(p.sum(-1))
    o.mul_(fade.unsqueeze(-1)).add_(p @ v)
    m.copy_(m_new)


def ring_attention_zigzag(q, k, v, group=None):
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    c = q.shape[0] // 2
    mine = (rank, 2 * n - rank)                     # the mistake: the mirror of chunk r is 2N-1-r
    m = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype)
    l = torch.zeros_like(m)
    o = torch.zeros_like(q)
    k, v = k.contiguous(), v.contiguous()
    for step in range(n):                           # step 0: our own chunks, so every row's maximum is finite
        if step < n - 1:                            # post the next move first: it travels while we compute
            k_next, v_next = torch.empty_like(k), torch.empty_like(v)
            requests = dist.batch_isend_irecv([dist.P2POp(dist.isend, k, right), dist.P2POp(dist.isend, v, right),
                                               dist.P2POp(dist.irecv, k_next, left),
                                               dist.P2POp(dist.irecv, v_next, left)])
        j = (rank - step) % n
        theirs = (j, 2 * n - 1 - j)
        for a in (0, 1):
            rows = slice(a * c, (a + 1) * c)
            for b in (0, 1):
                if theirs[b] > mine[a]:             # all in the future: skipped, never computed
                    continue
                keys = slice(b * c, (b + 1) * c)
                fold(q[rows], k[keys], v[keys], m[rows], l[rows], o[rows], diagonal=theirs[b] == mine[a])
        if step < n - 1:
            for request in requests:
                request.wait()
            k, v = k_next, v_next
    return o / l.unsqueeze(-1)
