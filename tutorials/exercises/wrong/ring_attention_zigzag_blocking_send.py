"""Wrong: every rank first sends its (k, v) with blocking dist.send, then receives. Each send waits
for its receiver to post a receive, and every receiver is itself stuck sending: a cycle."""
import math

import torch
import torch.distributed as dist


def ring_attention_zigzag(q, k, v, group=None):
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    c = q.shape[0] // 2
    mine = (rank, 2 * n - 1 - rank)
    scores, values = [[], []], [[], []]
    k, v = k.contiguous(), v.contiguous()
    for step in range(n):
        j = (rank - step) % n
        theirs = (j, 2 * n - 1 - j)
        for a in (0, 1):
            for b in (0, 1):
                if theirs[b] <= mine[a]:
                    s = q[a * c:(a + 1) * c] @ k[b * c:(b + 1) * c].T / math.sqrt(q.shape[-1])
                    if theirs[b] == mine[a]:
                        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
                    scores[a].append(s)
                    values[a].append(v[b * c:(b + 1) * c])
        if step < n - 1:
            dist.send(k, right)           # the mistake: every rank sends first, so nobody receives
            dist.send(v, right)
            k, v = torch.empty_like(k), torch.empty_like(v)
            dist.recv(k, left)
            dist.recv(v, left)
    return torch.cat([torch.softmax(torch.cat(scores[a], 1), -1) @ torch.cat(values[a]) for a in (0, 1)])
