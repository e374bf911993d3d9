"""The public collectives: torch.distributed's names and signatures, our algorithms.

Each function below says what it computes and checks what only it knows (its
lists, its root); everything else, the path every call takes from validation to
the algorithm and back, is written once in :mod:`collectives.call`.
"""
from __future__ import annotations

from typing import List, Optional, Union

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from .algorithms import REGISTRY
from .call import CallState, copy_local, nbytes, run, run_in_place, shapes
from .engine import Work
from .group import GroupInfo

Group = Union[None, dist.ProcessGroup, GroupInfo]


def broadcast(tensor: torch.Tensor, src: Optional[int] = None, group: Group = None, async_op: bool = False,
              algorithm: Optional[str] = None, group_src: Optional[int] = None) -> Optional[Work]:
    """Send ``tensor`` from rank ``src`` to every rank of the group, in place.

    Args:
        tensor (Tensor): Data to send on ``src``; where the result lands on the others.
        src (int): Global rank of the source.
        group (ProcessGroup, optional): Group to work on; None for the whole world.
        async_op (bool, optional): Return a handle instead of blocking.
        algorithm (str, optional): One of ``ALGORITHMS["broadcast"]``; None picks by size.
        group_src (int, optional): The source as a rank of ``group``, instead of ``src``.

    Returns:
        A handle with ``wait()`` if ``async_op``, else None; None on ranks outside the group.

    Example::

        >>> t = torch.arange(2) + 1 + 2 * rank if rank == 0 else torch.zeros(2, dtype=torch.int64)
        >>> collectives.broadcast(t, src=0)
        >>> t
        tensor([1, 2])  # Rank 0
        tensor([1, 2])  # Rank 1
    """
    call = CallState("broadcast", group, algorithm)
    call.check_tensor("tensor", tensor)
    if not call.member:
        return None
    root = call.check_root("src", src, group_src)
    algo = call.choose(nbytes(tensor))
    return run_in_place(call, algo, tensor,
                        lambda comm, flat: REGISTRY["broadcast"][comm.algorithm](comm, flat, root),
                        async_op, src=call.ranks[root])


def reduce(tensor: torch.Tensor, dst: Optional[int] = None, op: ReduceOp = ReduceOp.SUM, group: Group = None,
           async_op: bool = False, algorithm: Optional[str] = None,
           group_dst: Optional[int] = None) -> Optional[Work]:
    """Reduce ``tensor`` across the group into rank ``dst``'s ``tensor``.

    Other ranks' tensors are left unchanged.

    Args:
        tensor (Tensor): Input on every rank; the result on ``dst``.
        dst (int): Global rank that receives the result.
        op (ReduceOp, optional): SUM, PRODUCT, MIN, MAX, AVG, BAND, BOR or BXOR.
        group, async_op, algorithm: As in :func:`broadcast`.
        group_dst (int, optional): The destination as a rank of ``group``, instead of ``dst``.

    Returns:
        A handle if ``async_op``, else None.

    Example::

        >>> t = torch.tensor([rank + 1.0])
        >>> collectives.reduce(t, dst=0)
        >>> t
        tensor([3.])  # Rank 0 (world of 2: 1 + 2)
        tensor([2.])  # Rank 1 (unchanged)
    """
    call = CallState("reduce", group, algorithm)
    call.check_tensor("tensor", tensor)
    red = call.op(op, tensor.dtype)
    if not call.member:
        return None
    root = call.check_root("dst", dst, group_dst)
    algo = call.choose(nbytes(tensor))

    def body(comm):
        buf = call.stage(tensor)
        call.ready()
        REGISTRY["reduce"][comm.algorithm](comm, buf.flat, root, red)
        if comm.rank == root:
            if red.average:
                buf.flat.div_(comm.size)
            buf.done()
        return [tensor]
    return run(call, algo, body, async_op, nbytes(tensor), local=lambda: [tensor],
                dst=call.ranks[root], op=red.name, shape=list(tensor.shape), dtype=tensor.dtype)


def all_reduce(tensor: torch.Tensor, op: ReduceOp = ReduceOp.SUM, group: Group = None,
               async_op: bool = False, algorithm: Optional[str] = None) -> Optional[Work]:
    """Reduce ``tensor`` across the group; every rank gets the result, in place.

    Every rank ends with bitwise the same tensor, whatever the algorithm.

    Args:
        tensor (Tensor): Input and output of the collective.
        op (ReduceOp, optional): SUM, PRODUCT, MIN, MAX, AVG, BAND, BOR or BXOR.
        group, async_op, algorithm: As in :func:`broadcast`.

    Returns:
        A handle if ``async_op``, else None.

    Example::

        >>> t = torch.tensor([rank + 1, rank + 1])
        >>> collectives.all_reduce(t, algorithm="ring")
        >>> t
        tensor([3, 3])  # Rank 0
        tensor([3, 3])  # Rank 1
    """
    call = CallState("all_reduce", group, algorithm)
    call.check_tensor("tensor", tensor)
    red = call.op(op, tensor.dtype)
    if not call.member:
        return None
    algo = call.choose(nbytes(tensor))

    def step(comm, flat):
        REGISTRY["all_reduce"][comm.algorithm](comm, flat, red)
        if red.average:
            flat.div_(comm.size)
    return run_in_place(call, algo, tensor, step, async_op, op=red.name)


def scatter(tensor: torch.Tensor, scatter_list: Optional[List[torch.Tensor]] = None, src: Optional[int] = None,
            group: Group = None, async_op: bool = False, algorithm: Optional[str] = None,
            group_src: Optional[int] = None) -> Optional[Work]:
    """Send ``scatter_list[i]`` of rank ``src`` to rank i's ``tensor``.

    Args:
        tensor (Tensor): Output on every rank.
        scatter_list (list[Tensor], optional): On ``src`` only: one tensor per rank
            of the group, each shaped like ``tensor``.
        src (int, optional): Global rank of the source (0 if neither it nor ``group_src`` is given).
        group, async_op, algorithm: As in :func:`broadcast`.
        group_src (int, optional): The source as a rank of ``group``, instead of ``src``.

    Returns:
        A handle if ``async_op``, else None.

    Example::

        >>> t = torch.zeros(1)
        >>> pieces = [torch.tensor([1.0]), torch.tensor([2.0])] if rank == 0 else None
        >>> collectives.scatter(t, pieces, src=0)
        >>> t
        tensor([1.])  # Rank 0
        tensor([2.])  # Rank 1
    """
    call = CallState("scatter", group, algorithm)
    call.check_tensor("tensor", tensor)
    if not call.member:
        return None
    root = call.root_and_list("src", src, group_src, "scatter_list", scatter_list, "source", tensor)
    algo = call.choose(nbytes(tensor) * call.size)

    def body(comm):
        out = call.stage(tensor, copy_in=False)
        pieces = call.inputs(scatter_list, [tensor]) if comm.rank == root else None
        call.ready()
        REGISTRY["scatter"][comm.algorithm](comm, out.flat, pieces, root)
        return [out.done()]

    def local():
        copy_local(tensor, scatter_list[0])
        return [tensor]
    return run(call, algo, body, async_op, nbytes(tensor) * call.size, local=local,
                src=call.ranks[root], shape=list(tensor.shape), dtype=tensor.dtype)


def gather(tensor: torch.Tensor, gather_list: Optional[List[torch.Tensor]] = None, dst: Optional[int] = None,
           group: Group = None, async_op: bool = False, algorithm: Optional[str] = None,
           group_dst: Optional[int] = None) -> Optional[Work]:
    """Collect every rank's ``tensor`` into ``gather_list`` on rank ``dst``.

    Args:
        tensor (Tensor): Input on every rank.
        gather_list (list[Tensor], optional): On ``dst`` only: one tensor per rank
            of the group, each shaped like ``tensor``, filled in group-rank order.
        dst (int, optional): Global rank of the destination (0 if neither it nor ``group_dst`` is given).
        group, async_op, algorithm: As in :func:`broadcast`.
        group_dst (int, optional): The destination as a rank of ``group``, instead of ``dst``.

    Returns:
        A handle if ``async_op``, else None.

    Example::

        >>> out = [torch.zeros(1), torch.zeros(1)] if rank == 0 else None
        >>> collectives.gather(torch.tensor([rank + 1.0]), out, dst=0)
        >>> out
        [tensor([1.]), tensor([2.])]  # Rank 0
        None                          # Rank 1
    """
    call = CallState("gather", group, algorithm)
    call.check_tensor("tensor", tensor)
    if not call.member:
        return None
    root = call.root_and_list("dst", dst, group_dst, "gather_list", gather_list, "destination", tensor)
    algo = call.choose(nbytes(tensor) * call.size)

    def body(comm):
        at_root = comm.rank == root
        inp = call.inputs([tensor], gather_list if at_root else ())[0]
        outs = [call.stage(t, copy_in=False) for t in gather_list] if at_root else None
        call.ready()
        REGISTRY["gather"][comm.algorithm](comm, inp, [o.flat for o in outs] if outs else None, root)
        return [o.done() for o in outs] if outs else []

    def local():
        copy_local(gather_list[0], tensor)
        return list(gather_list)
    return run(call, algo, body, async_op, nbytes(tensor) * call.size, local=local,
                dst=call.ranks[root], shape=list(tensor.shape), dtype=tensor.dtype)


def all_gather(tensor_list: List[torch.Tensor], tensor: torch.Tensor, group: Group = None,
               async_op: bool = False, algorithm: Optional[str] = None) -> Optional[Work]:
    """Collect every rank's ``tensor`` into ``tensor_list`` on every rank.

    Args:
        tensor_list (list[Tensor]): Output: one tensor per rank of the group, filled in
            group-rank order; each shaped like ``tensor``, or (as torch allows) sized like
            what that rank contributes, which the ring then moves at its own size.
        tensor (Tensor): Input on every rank (unchanged).
        group, async_op, algorithm: As in :func:`broadcast`.

    Returns:
        A handle if ``async_op``, else None.

    Example::

        >>> out = [torch.zeros(1), torch.zeros(1)]
        >>> collectives.all_gather(out, torch.tensor([rank + 1.0]))
        >>> out
        [tensor([1.]), tensor([2.])]  # Rank 0
        [tensor([1.]), tensor([2.])]  # Rank 1
    """
    call = CallState("all_gather", group, algorithm)
    call.check_tensor("tensor", tensor)
    call.check_list("tensor_list", tensor_list, tensor, same_shape=False)
    if not call.member:
        return None
    even = all(t.shape == tensor.shape for t in tensor_list)
    if not even:
        # torch lets rank i contribute tensor_list[i].numel() elements; only the ring moves
        # each piece at its own size
        mine = tensor_list[call.info.rank]
        if mine.numel() != tensor.numel():
            raise ValueError(f"{call.where}: tensor_list[{call.info.rank}] (this rank's slot) has "
                             f"{mine.numel()} elements but tensor has {tensor.numel()}")
        if algorithm not in (None, "ring"):
            raise ValueError(f"{call.where}: tensors of different sizes per rank need "
                             f"algorithm='ring' (or None), got {algorithm!r}")
    total = sum(nbytes(t) for t in tensor_list)
    algo = call.choose(total) if even else "ring"

    def body(comm):
        inp = call.inputs([tensor], tensor_list)[0]
        outs = [call.stage(t, copy_in=False) for t in tensor_list]
        call.ready()
        REGISTRY["all_gather"][comm.algorithm](comm, [o.flat for o in outs], inp)
        return [o.done() for o in outs]

    def local():
        copy_local(tensor_list[0], tensor)
        return list(tensor_list)
    return run(call, algo, body, async_op, total, local=local,
               shape=shapes(tensor_list), dtype=tensor.dtype)


def reduce_scatter(output: torch.Tensor, input_list: List[torch.Tensor], op: ReduceOp = ReduceOp.SUM,
                   group: Group = None, async_op: bool = False,
                   algorithm: Optional[str] = None) -> Optional[Work]:
    """Reduce ``input_list`` across the group; rank i gets the reduction of entry i.

    Args:
        output (Tensor): Output on every rank.
        input_list (list[Tensor]): One tensor per rank of the group, each shaped
            like ``output`` (unchanged).
        op (ReduceOp, optional): SUM, PRODUCT, MIN, MAX, AVG, BAND, BOR or BXOR.
        group, async_op, algorithm: As in :func:`broadcast`.

    Returns:
        A handle if ``async_op``, else None.

    Example::

        >>> out = torch.zeros(1)
        >>> collectives.reduce_scatter(out, [torch.tensor([1.0]), torch.tensor([10.0])])
        >>> out
        tensor([2.])   # Rank 0 (world of 2)
        tensor([20.])  # Rank 1
    """
    call = CallState("reduce_scatter", group, algorithm)
    call.check_tensor("output", output)
    call.check_list("input_list", input_list, output)
    red = call.op(op, output.dtype)
    if not call.member:
        return None
    algo = call.choose(nbytes(output) * call.size)

    def body(comm):
        ins = call.inputs(input_list, [output])
        out = call.stage(output, copy_in=False)
        call.ready()
        REGISTRY["reduce_scatter"][comm.algorithm](comm, out.flat, ins, red)
        if red.average:
            out.flat.div_(comm.size)
        return [out.done()]

    def local():
        copy_local(output, input_list[0])
        return [output]
    return run(call, algo, body, async_op, nbytes(output) * call.size, local=local,
                op=red.name, shape=shapes(input_list), dtype=output.dtype)


def all_to_all(output_tensor_list: List[torch.Tensor], input_tensor_list: List[torch.Tensor],
               group: Group = None, async_op: bool = False,
               algorithm: Optional[str] = None) -> Optional[Work]:
    """Rank i sends ``input_tensor_list[j]`` to rank j, which stores it in ``output_tensor_list[i]``.

    Args:
        output_tensor_list (list[Tensor]): One tensor per rank of the group; entry j
            must match the size of what rank j sends here.
        input_tensor_list (list[Tensor]): One tensor per rank of the group (unchanged).
        group, async_op, algorithm: As in :func:`broadcast`.

    Returns:
        A handle if ``async_op``, else None.

    Example::

        >>> ins = [torch.tensor([10 * rank + j]) for j in range(2)]
        >>> outs = [torch.zeros(1, dtype=torch.int64) for _ in range(2)]
        >>> collectives.all_to_all(outs, ins)
        >>> outs
        [tensor([0]), tensor([10])]  # Rank 0
        [tensor([1]), tensor([11])]  # Rank 1
    """
    call = CallState("all_to_all", group, algorithm)
    if not isinstance(input_tensor_list, (list, tuple)) or not input_tensor_list:
        raise TypeError(f"{call.where}: input_tensor_list must be a non-empty list of tensors")
    call.check_tensor("input_tensor_list[0]", input_tensor_list[0])
    like = input_tensor_list[0]
    call.check_list("input_tensor_list", input_tensor_list, like, same_shape=False)
    call.check_list("output_tensor_list", output_tensor_list, like, same_shape=False)
    if not call.member:
        return None
    # not this rank's byte count: with uneven pieces the ranks' counts differ, and each must run
    # the same algorithm (docs/errors.md); the group's size is what every member knows
    algo = call.choose(None)
    if algo == "bruck" and call.size == 1 and any(t.numel() != like.numel()
                               for t in (*input_tensor_list, *output_tensor_list)):
        # alone, nobody waits; with peers, bruck's own first messages agree on the pieces so
        # that every rank refuses them, not only those that hold uneven ones (its card)
        raise ValueError(f"{call.where}: algorithm='bruck' needs pieces of one size (every "
                         f"input and output tensor with {like.numel()} elements); for uneven "
                         f"pieces use 'linear' or 'pairwise'")

    def body(comm):
        ins = call.inputs(input_tensor_list, output_tensor_list)
        outs = [call.stage(t, copy_in=False) for t in output_tensor_list]
        call.ready()
        REGISTRY["all_to_all"][comm.algorithm](comm, [o.flat for o in outs], ins)
        return [o.done() for o in outs]

    def local():
        copy_local(output_tensor_list[0], input_tensor_list[0])
        return list(output_tensor_list)
    return run(call, algo, body, async_op, sum(nbytes(t) for t in input_tensor_list), local=local,
                dtype=like.dtype, sends=[t.numel() for t in input_tensor_list],
                recvs=[t.numel() for t in output_tensor_list])


def barrier(group: Group = None, async_op: bool = False, algorithm: Optional[str] = None) -> Optional[Work]:
    """Block until every rank of the group has entered the barrier.

    Args:
        group, async_op, algorithm: As in :func:`broadcast`.

    Returns:
        A handle if ``async_op``, else None.

    Example::

        >>> collectives.barrier()   # Rank 0 and Rank 1 both return only after both called it
    """
    call = CallState("barrier", group, algorithm)
    if call.cuda_direct and torch.cuda.is_available():
        # no tensor names a device: the token goes to the caller's current GPU
        call.device = torch.device("cuda", torch.cuda.current_device())
    if not call.member:
        return None
    algo = call.choose(0)

    def body(comm):
        REGISTRY["barrier"][comm.algorithm](comm)
        return []
    return run(call, algo, body, async_op, 0, local=lambda: [])


__all__ = ["broadcast", "reduce", "all_reduce", "scatter", "gather", "all_gather", "reduce_scatter",
           "all_to_all", "barrier"]
