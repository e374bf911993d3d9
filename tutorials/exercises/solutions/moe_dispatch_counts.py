"""Reference solution, step 1 of moe_dispatch: bincount, then one count to each rank, pairwise."""
import torch
import torch.distributed as dist


def moe_dispatch_counts(expert_of, group=None):
    rank, n = dist.get_rank(), dist.get_world_size()
    send = torch.bincount(expert_of, minlength=n)
    recv = send.clone()                                  # recv[rank] = send[rank]: my own count stays
    for step in range(1, n):
        to, frm = (rank + step) % n, (rank - step) % n
        ops = [dist.P2POp(dist.isend, send[to:to + 1], to), dist.P2POp(dist.irecv, recv[frm:frm + 1], frm)]
        for request in dist.batch_isend_irecv(ops):
            request.wait()
    return send, recv
