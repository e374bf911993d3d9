"""Wrong, step 1 of ring_attention: the blocks travel left, not right (sent to rank r - 1, received
from rank r + 1). Every rank still sees every block, but not in the ring's order, and the two
directions are one and the same on 2 ranks: the mistake shows from 3."""
import torch
import torch.distributed as dist


def ring_attention_rotate(k, v, group=None):
    rank, n = dist.get_rank(), dist.get_world_size()
    if n == 1:
        return k.clone(), v.clone()
    right, left = (rank + 1) % n, (rank - 1) % n
    k_next, v_next = torch.empty_like(k), torch.empty_like(v)
    requests = dist.batch_isend_irecv([dist.P2POp(dist.isend, k.contiguous(), left),
                                       dist.P2POp(dist.isend, v.contiguous(), left),
                                       dist.P2POp(dist.irecv, k_next, right),
                                       dist.P2POp(dist.irecv, v_next, right)])
    for request in requests:
        request.wait()
    return k_next, v_next
