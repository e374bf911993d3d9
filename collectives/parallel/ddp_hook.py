"""Run torch's own ``DistributedDataParallel`` with our all_reduce underneath.

DDP keeps its buckets, its hooks and its overlap; a communication hook only
replaces the one call that reduces a bucket. Swapping in ours lets a user
compare, on the same model and data, DDP+gloo against DDP+collectives, and
our :class:`collectives.DataParallel` against both.
"""
import torch.distributed as dist

from .. import api


def ddp_comm_hook(algorithm=None):
    """A hook for ``DistributedDataParallel.register_comm_hook`` that averages with our all_reduce.

    The hook's ``state`` is the process group to reduce over (None: the whole
    world), as for torch's built-in ``allreduce_hook``.

    Args:
        algorithm (str, optional): One of ``ALGORITHMS["all_reduce"]``; None picks by size.

    Returns:
        A function ``hook(state, bucket) -> torch.futures.Future[Tensor]``.

    Example::

        >>> ddp = torch.nn.parallel.DistributedDataParallel(Net())
        >>> ddp.register_comm_hook(state=None, hook=collectives.ddp_comm_hook("ring"))
        >>> loss_fn(ddp(x), y).backward()   # buckets reduced by collectives.all_reduce
    """
    def hook(state, bucket):
        tensor = bucket.buffer()
        tensor.div_(dist.get_world_size(state))
        work = api.all_reduce(tensor, group=state, async_op=True, algorithm=algorithm)
        # a collective's future holds its outputs as a list, as torch's does; DDP wants the
        # bucket's tensor, so unwrap it the way torch's own allreduce_hook does
        return work.get_future().then(lambda fut: fut.value()[0])

    hook.__name__ = f"collectives_all_reduce_hook({algorithm or 'auto'})"
    return hook
