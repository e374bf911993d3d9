"""Reference solution, step 2 of moe_dispatch: sort by expert, cut by the counts, exchange pairwise."""
import torch
import torch.distributed as dist


def moe_dispatch_tokens(tokens, expert_of, send, recv, group=None):
    rank, n = dist.get_rank(), dist.get_world_size()
    pieces = tokens[expert_of.argsort(stable=True)].split(send.tolist())   # piece j: rows for expert j
    out = [tokens.new_empty((int(c), tokens.shape[1])) for c in recv]
    out[rank].copy_(pieces[rank])
    for step in range(1, n):
        to, frm = (rank + step) % n, (rank - step) % n
        ops = [dist.P2POp(dist.isend, pieces[to].contiguous(), to), dist.P2POp(dist.irecv, out[frm], frm)]
        for request in dist.batch_isend_irecv(ops):
            request.wait()
    return torch.cat(out)
