"""Wrong (too much traffic): pads every piece to a fixed capacity of rows, the same on every rank
(as a GShard-style capacity does), so empty and small pieces travel as large ones: right tokens,
more bytes than the dispatch sends."""
import torch
import torch.distributed as dist

CAPACITY = 1024     # rows per piece, fixed: more than any rank of the graded cases holds


def moe_dispatch_tokens(tokens, expert_of, send, recv, group=None):
    rank, n = dist.get_rank(), dist.get_world_size()
    pieces = tokens[expert_of.argsort(stable=True)].split(send.tolist())
    capacity = CAPACITY
    out = [tokens.new_empty((int(c), tokens.shape[1])) for c in recv]
    out[rank].copy_(pieces[rank])
    for step in range(1, n):
        to, frm = (rank + step) % n, (rank - step) % n
        padded = tokens.new_zeros((capacity, tokens.shape[1]))
        padded[:pieces[to].shape[0]] = pieces[to]
        inbox = tokens.new_empty((capacity, tokens.shape[1]))
        ops = [dist.P2POp(dist.isend, padded, to), dist.P2POp(dist.irecv, inbox, frm)]
        for request in dist.batch_isend_irecv(ops):
            request.wait()
        out[frm].copy_(inbox[:int(recv[frm])])
    return torch.cat(out)
