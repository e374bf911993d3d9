"""Wrong: builds all_to_all from N built-in scatters (the grader switches built-ins off)."""
import torch.distributed as dist


def all_to_all(output_tensor_list, input_tensor_list, group=None):
    rank, n = dist.get_rank(), dist.get_world_size()
    for src in range(n):
        dist.scatter(output_tensor_list[src], input_tensor_list if rank == src else None, src=src)
