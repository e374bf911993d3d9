"""Wrong, step 1 of ring_attention: every rank sends with a blocking dist.send, then receives. Each
send waits for its receiver to post a receive, and every receiver is itself stuck sending: a
cycle around the whole ring."""
import torch
import torch.distributed as dist


def ring_attention_rotate(k, v, group=None):
    rank, n = dist.get_rank(), dist.get_world_size()
    if n == 1:
        return k.clone(), v.clone()
    right, left = (rank + 1) % n, (rank - 1) % n
    dist.send(k.contiguous(), right)
    dist.send(v.contiguous(), right)
    k_next, v_next = torch.empty_like(k), torch.empty_like(v)
    dist.recv(k_next, left)
    dist.recv(v_next, left)
    return k_next, v_next
