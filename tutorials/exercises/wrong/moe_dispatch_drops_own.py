"""Wrong: only the other ranks' pieces are collected; the tokens this rank routes to its own
expert are forgotten (the loop over the other ranks never reaches it)."""
import torch
import torch.distributed as dist


def exchange(send, to, recv, frm):
    for request in dist.batch_isend_irecv([dist.P2POp(dist.isend, send, to),
                                           dist.P2POp(dist.irecv, recv, frm)]):
        request.wait()


def moe_dispatch(tokens, expert_of, group=None):
    rank, n = dist.get_rank(), dist.get_world_size()
    send = torch.bincount(expert_of, minlength=n)
    pieces = tokens[expert_of.argsort(stable=True)].split(send.tolist())
    recv = send.clone()
    for step in range(1, n):
        to, frm = (rank + step) % n, (rank - step) % n
        exchange(send[to:to + 1], to, recv[frm:frm + 1], frm)
    out = [tokens.new_empty((int(c) if j != rank else 0, tokens.shape[1])) for j, c in enumerate(recv)]
    for step in range(1, n):
        to, frm = (rank + step) % n, (rank - step) % n
        exchange(pieces[to].contiguous(), to, out[frm], frm)
    return torch.cat(out), recv.tolist()
