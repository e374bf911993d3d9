"""Wrong (hangs): every rank calls the blocking send first; each waits for a neighbour that is sending too."""
import torch.distributed as dist


def send_recv_ring(tensor, group=None):
    rank, n = dist.get_rank(), dist.get_world_size()
    dist.send(tensor.clone(), (rank + 1) % n)
    dist.recv(tensor, (rank - 1) % n)
