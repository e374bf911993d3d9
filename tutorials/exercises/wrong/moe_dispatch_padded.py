"""Wrong (traffic): every piece padded to a fixed capacity, here all T tokens of the sender, as
capacity-factor MoE layers do: right result, but N-1 full-size messages where the uneven
all_to_all sends each token once."""
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
    header = torch.stack([send, torch.full_like(send, tokens.shape[0])], 1)   # (count, capacity) per rank
    got = header.clone()
    for step in range(1, n):
        to, frm = (rank + step) % n, (rank - step) % n
        exchange(header[to].clone(), to, got[frm], frm)
    out = [pieces[rank].clone() if j == rank else tokens.new_zeros((int(got[j, 1]), tokens.shape[1]))
           for j in range(n)]
    for step in range(1, n):
        to, frm = (rank + step) % n, (rank - step) % n
        padded = tokens.new_zeros(tokens.shape)
        padded[:len(pieces[to])] = pieces[to]
        exchange(padded, to, out[frm], frm)
    out = [o[:int(got[j, 0])] for j, o in enumerate(out)]
    return torch.cat(out), got[:, 0].tolist()
