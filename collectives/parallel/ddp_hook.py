"""Run torch's own ``DistributedDataParallel`` with our all_reduce underneath.

DDP keeps its buckets, its hooks and its overlap; a communication hook only
replaces the one call that reduces a bucket. Swapping in ours lets a user
compare, on the same model and data, DDP+gloo against DDP+collectives, and
our :class:`collectives.DataParallel` against both.
"""
import torch
import torch.distributed as dist

from .. import api


def _gradient_views(bucket, buffer):
    """Views of the bucket's flat buffer shaped like its parameters (DDP lays them out in this order)."""
    views, offset = [], 0
    for p in bucket.parameters():
        views.append(buffer[offset:offset + p.numel()].view_as(p))
        offset += p.numel()
    return views


def ddp_comm_hook(algorithm=None, compression=None):
    """A hook for ``DistributedDataParallel.register_comm_hook`` that averages with our all_reduce.

    The hook's ``state`` is the process group to reduce over (None: the whole
    world), as for torch's built-in ``allreduce_hook``.

    Args:
        algorithm (str, optional): One of ``ALGORITHMS["all_reduce"]``; None picks by size.
        compression (optional): None (full precision), or an object of
            :mod:`collectives.parallel.compression`: ``HalfPrecision(torch.float16)`` is
            torch's ``fp16_compress_hook`` (``bfloat16``: its ``bf16_compress_hook``) on our
            all_reduce, ``PowerSGD(rank=4)`` its ``powerSGD_hook`` (with error feedback; it
            blocks until both of its all-reduces are done, so its bucket does not overlap
            with the rest of backward).

    Returns:
        A function ``hook(state, bucket) -> torch.futures.Future[Tensor]``.

    Example::

        >>> ddp = torch.nn.parallel.DistributedDataParallel(Net())
        >>> ddp.register_comm_hook(state=None, hook=collectives.ddp_comm_hook("ring"))
        >>> loss_fn(ddp(x), y).backward()   # buckets reduced by collectives.all_reduce
    """
    def hook(state, bucket):
        tensor = bucket.buffer()
        if compression is not None:
            handle = compression.start([id(p) for p in bucket.parameters()], _gradient_views(bucket, tensor),
                                       tensor, state, algorithm)
            handle.wait()     # the sum over ranks, in tensor
            tensor.div_(dist.get_world_size(state))
            done = torch.futures.Future()
            done.set_result(tensor)
            return done
        tensor.div_(dist.get_world_size(state))
        work = api.all_reduce(tensor, group=state, async_op=True, algorithm=algorithm)
        # a collective's future holds its outputs as a list, as torch's does; DDP wants the
        # bucket's tensor, so unwrap it the way torch's own allreduce_hook does
        return work.get_future().then(lambda fut: fut.value()[0])

    hook.__name__ = (f"collectives_all_reduce_hook({algorithm or 'auto'}"
                     f"{', ' + compression.name if compression is not None else ''})")
    return hook
