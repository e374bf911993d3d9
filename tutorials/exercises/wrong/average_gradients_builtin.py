"""Wrong: the PyTorch tutorial's average_gradients, with the built-in all_reduce (switched off while grading)."""
import torch.distributed as dist


def average_gradients(model, group=None):
    size = float(dist.get_world_size())
    for param in model.parameters():
        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)
        param.grad /= size
