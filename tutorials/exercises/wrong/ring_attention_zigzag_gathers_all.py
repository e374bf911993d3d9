"""Wrong (right numbers and traffic, a gather's memory): passes the chunks round the ring as it
should, but keeps every one it receives and computes only once all N are home, so each rank
holds the keys and values of every other rank at once: memory growing with N, which the ring
exists to avoid."""
import math

import torch
import torch.distributed as dist


def ring_attention_zigzag(q, k, v, group=None):
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    c = q.shape[0] // 2
    held = {rank: (k.contiguous(), v.contiguous())}
    for step in range(n - 1):                      # the mistake: collect first, compute after
        k_in, v_in = torch.empty_like(k), torch.empty_like(v)
        k_out, v_out = held[(rank - step) % n]
        for request in dist.batch_isend_irecv([dist.P2POp(dist.isend, k_out, right),
                                               dist.P2POp(dist.isend, v_out, right),
                                               dist.P2POp(dist.irecv, k_in, left),
                                               dist.P2POp(dist.irecv, v_in, left)]):
            request.wait()
        held[(rank - step - 1) % n] = (k_in, v_in)
    keys, values, where = [], [], []
    for j, (kj, vj) in held.items():
        for b, chunk in enumerate((j, 2 * n - 1 - j)):
            keys.append(kj[b * c:(b + 1) * c])
            values.append(vj[b * c:(b + 1) * c])
            where.append(chunk)
    out = torch.empty_like(q)
    for a, chunk in enumerate((rank, 2 * n - 1 - rank)):
        rows = slice(a * c, (a + 1) * c)
        needed = [i for i, b in enumerate(where) if b <= chunk]          # skip the future: the work is right
        s = torch.cat([q[rows] @ keys[i].T for i in needed], dim=1) / math.sqrt(q.shape[-1])
        column = 0
        for i in needed:
            if where[i] == chunk:
                s[:, column:column + c] = s[:, column:column + c].masked_fill(
                    torch.ones(c, c, dtype=torch.bool).triu(1), float("-inf"))
            column += c
        out[rows] = torch.softmax(s, -1) @ torch.cat([values[i] for i in needed])
    return out
