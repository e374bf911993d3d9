"""Reference solution: exchange the counts, then the uneven pieces, pairwise (chapter 19)."""
import torch
import torch.distributed as dist


def exchange(send, to, recv, frm):
    for request in dist.batch_isend_irecv([dist.P2POp(dist.isend, send, to),
                                           dist.P2POp(dist.irecv, recv, frm)]):
        request.wait()


def moe_dispatch(tokens, expert_of, group=None):
    rank, n = dist.get_rank(), dist.get_world_size()
    send = torch.bincount(expert_of, minlength=n)
    pieces = tokens[expert_of.argsort(stable=True)].split(send.tolist())   # one piece per expert, in order
    recv = send.clone()                                  # recv[rank] = send[rank]: my own piece stays
    for step in range(1, n):                             # 1. how many rows will each rank send me?
        to, frm = (rank + step) % n, (rank - step) % n
        exchange(send[to:to + 1], to, recv[frm:frm + 1], frm)
    out = [tokens.new_empty((int(c), tokens.shape[1])) for c in recv]
    out[rank].copy_(pieces[rank])
    for step in range(1, n):                             # 2. the rows themselves, uneven pieces
        to, frm = (rank + step) % n, (rank - step) % n
        exchange(pieces[to].contiguous(), to, out[frm], frm)
    return torch.cat(out), recv.tolist()
