"""Wrong: every rank first sends its chunk with a blocking dist.send, then receives. Each send
waits for its receiver to post a receive, and every receiver is itself stuck sending: a cycle."""
import math

import torch
import torch.distributed as dist


def ring_attention(q, k, v, group=None):
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    keys, values = [k], [v]
    for step in range(n - 1):
        dist.send(keys[-1].contiguous(), right)
        dist.send(values[-1].contiguous(), right)
        k_next, v_next = torch.empty_like(k), torch.empty_like(v)
        dist.recv(k_next, left)
        dist.recv(v_next, left)
        keys.append(k_next)
        values.append(v_next)
    return torch.softmax(q @ torch.cat(keys).T / math.sqrt(q.shape[-1]), -1) @ torch.cat(values)
