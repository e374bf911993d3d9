"""Reference solution: ZeRO-1 with SGD momentum: reduce-scatter the gradients, update my shard, all-gather (chapter 10)."""
import torch
import torch.distributed as dist


def exchange(send, right, recv, left):
    for request in dist.batch_isend_irecv([dist.P2POp(dist.isend, send, right),
                                           dist.P2POp(dist.irecv, recv, left)]):
        request.wait()


def zero1_step(params, state, lr, momentum=0.9, group=None):
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    grad = torch.cat([p.grad.flatten() for p in params])
    shards = grad.tensor_split(n)
    inbox = torch.empty_like(shards[0])
    for step in range(n - 1):                           # reduce-scatter: shard r ends complete on rank r
        send_i, recv_i = (rank - step - 1) % n, (rank - step - 2) % n
        got = inbox[:shards[recv_i].numel()]
        exchange(shards[send_i], right, got, left)
        shards[recv_i].add_(got)
    my_grad = shards[rank] / n
    if "momentum" not in state:                         # torch.optim.SGD: the first buffer is the gradient
        state["momentum"] = my_grad.clone()
    else:
        state["momentum"].mul_(momentum).add_(my_grad)
    flat = torch.cat([p.detach().flatten() for p in params])
    pieces = flat.tensor_split(n)
    pieces[rank].sub_(lr * state["momentum"])
    for step in range(n - 1):                           # all-gather the updated shards
        send_i, recv_i = (rank - step) % n, (rank - step - 1) % n
        exchange(pieces[send_i], right, pieces[recv_i], left)
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
