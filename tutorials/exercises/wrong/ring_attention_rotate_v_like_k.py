"""Wrong, step 1 of ring_attention: v is received into a buffer shaped like k. Right while the values
are as wide as the keys; where they are narrower (d_v < d), gloo fills the front of the larger
buffer and the block comes back with the wrong shape."""
import torch
import torch.distributed as dist


def ring_attention_rotate(k, v, group=None):
    rank, n = dist.get_rank(), dist.get_world_size()
    if n == 1:
        return k.clone(), v.clone()
    right, left = (rank + 1) % n, (rank - 1) % n
    k_next, v_next = torch.empty_like(k), torch.empty_like(k)
    requests = dist.batch_isend_irecv([dist.P2POp(dist.isend, k.contiguous(), right),
                                       dist.P2POp(dist.isend, v.contiguous(), right),
                                       dist.P2POp(dist.irecv, k_next, left),
                                       dist.P2POp(dist.irecv, v_next, left)])
    for request in requests:
        request.wait()
    return k_next, v_next
