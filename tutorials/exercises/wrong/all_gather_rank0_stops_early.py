"""Wrong (hangs): rank 0 runs one ring step fewer than the others, so its right neighbour waits for a message that never comes."""
import torch.distributed as dist


def all_gather(tensor_list, tensor, group=None):
    rank, n = dist.get_rank(), dist.get_world_size()
    tensor_list[rank].copy_(tensor)
    right, left = (rank + 1) % n, (rank - 1) % n
    steps = n - 2 if rank == 0 else n - 1           # should be n - 1 on every rank
    for step in range(steps):
        requests = [dist.isend(tensor_list[(rank - step) % n], right),
                    dist.irecv(tensor_list[(rank - step - 1) % n], left)]
        for r in requests:
            r.wait()
