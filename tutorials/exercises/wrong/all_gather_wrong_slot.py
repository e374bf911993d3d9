"""Wrong result: stores each received piece in the slot it just sent from, not the sender's slot."""
import torch
import torch.distributed as dist


def all_gather(tensor_list, tensor, group=None):
    rank, n = dist.get_rank(), dist.get_world_size()
    tensor_list[rank].copy_(tensor)
    right, left = (rank + 1) % n, (rank - 1) % n
    for step in range(n - 1):
        got = torch.empty_like(tensor)
        requests = [dist.isend(tensor_list[(rank - step) % n].clone(), right), dist.irecv(got, left)]
        for r in requests:
            r.wait()
        tensor_list[(rank + step + 1) % n].copy_(got)     # should be (rank - step - 1) % n
