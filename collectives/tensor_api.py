"""The single-tensor forms of torch.distributed, on our list-form collectives.

torch has, beside ``all_gather(tensor_list, tensor)`` and friends, forms that
take one big tensor instead of a list: FSDP, DTensor and most modern code call
these. Each function here cuts the big tensor into *views* (no copy when it is
contiguous, which torch requires anyway), one per rank, and calls the list form
in :mod:`collectives.api`, so the same algorithms, validation, staging, async
handles and traffic counters apply. Same names and signatures as torch, plus
``algorithm=``.

Cards (N ranks, S = bytes of the big tensor, s = S/N; "ring" as the example):

=========================  ====================  ===========================================
function                   carried by            bytes each rank sends (ring)
=========================  ====================  ===========================================
all_gather_into_tensor     all_gather            (N-1) * s, s = input bytes
reduce_scatter_tensor      reduce_scatter        (N-1) * s, s = output bytes
all_to_all_single          all_to_all            input bytes minus its own piece (linear,
                                                 pairwise: every other rank's rows once)
=========================  ====================  ===========================================
"""
import torch
from torch.distributed import ReduceOp

from . import api
from .group import group_info


def _where(name):
    return f"collectives.{name}"


def _pieces(name, what, t, n, shape_of_piece):
    """``t`` seen as ``n`` contiguous views of ``shape_of_piece`` (no copy), or a clear error."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{_where(name)}: {what} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_contiguous():
        raise ValueError(f"{_where(name)}: {what} must be contiguous (torch requires it too): the "
                         f"per-rank pieces are views into it")
    piece = 1
    for d in shape_of_piece:
        piece *= d
    if t.numel() != n * piece:
        raise ValueError(f"{_where(name)}: {what} has {t.numel()} elements; it must hold group size "
                         f"({n}) x {piece} elements (shape {list(shape_of_piece)} per rank)")
    return list(t.view(n, *shape_of_piece).unbind(0))


def _group_size(name, group):
    """The group's size, or None on a rank outside it (which returns at once, as torch's do)."""
    info = group_info(group, _where(name))
    return info.size if info.member else None


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False, algorithm=None):
    """Gather every rank's ``input_tensor`` into one ``output_tensor`` on every rank.

    Card: carried by ``all_gather`` (ring or recursive doubling, ``algorithm=``
    picks). Rank i's input lands in the i-th slice of ``output_tensor`` along
    dim 0 (or the i-th entry of a stacked ``(N, *input.shape)`` output). Each
    rank sends (N-1)/N * S bytes, S = output bytes, on the ring: N-1 messages of
    the input's size. The slices are views: no copy on either side.

    Args:
        output_tensor (Tensor): Contiguous; N times the input's elements, shaped
            ``(N * d0, ...)`` or ``(N, *input.shape)``.
        input_tensor (Tensor): This rank's contribution (unchanged).
        group (ProcessGroup, optional): Group to work on; None for the whole world.
        async_op (bool, optional): Return a handle instead of blocking.
        algorithm (str, optional): One of ``ALGORITHMS["all_gather"]``; None picks by size.

    Returns:
        A handle with ``wait()`` if ``async_op``, else None; None on ranks outside the group.

    Example::

        >>> out = torch.zeros(4, dtype=torch.int64)
        >>> collectives.all_gather_into_tensor(out, torch.tensor([1, 2]) + 2 * rank)
        >>> out
        tensor([1, 2, 3, 4])  # Rank 0
        tensor([1, 2, 3, 4])  # Rank 1
    """
    n = _group_size("all_gather_into_tensor", group)
    if n is None:
        return None
    outs = _pieces("all_gather_into_tensor", "output_tensor", output_tensor, n, tuple(input_tensor.shape))
    return api.all_gather(outs, input_tensor, group=group, async_op=async_op, algorithm=algorithm)


def reduce_scatter_tensor(output, input, op=ReduceOp.SUM, group=None, async_op=False, algorithm=None):
    """Reduce ``input`` across the group; rank i gets the reduction of its i-th slice.

    Card: carried by ``reduce_scatter`` (ring or recursive halving). ``input``
    is N slices shaped like ``output`` (along dim 0, or stacked). Each rank
    sends (N-1)/N * S bytes, S = input bytes, on the ring: N-1 messages of the
    output's size. The slices are views: no copy.

    Args:
        output (Tensor): This rank's result.
        input (Tensor): Contiguous, N times the output's elements (unchanged).
        op (ReduceOp, optional): SUM, PRODUCT, MIN, MAX, AVG, BAND, BOR or BXOR.
        group, async_op, algorithm: As in :func:`all_gather_into_tensor`
            (``ALGORITHMS["reduce_scatter"]``).

    Returns:
        A handle if ``async_op``, else None.

    Example::

        >>> out = torch.zeros(1)
        >>> collectives.reduce_scatter_tensor(out, torch.tensor([1.0, 10.0]))
        >>> out
        tensor([2.])   # Rank 0 (world of 2: 1 + 1)
        tensor([20.])  # Rank 1 (10 + 10)
    """
    n = _group_size("reduce_scatter_tensor", group)
    if n is None:
        return None
    ins = _pieces("reduce_scatter_tensor", "input", input, n, tuple(output.shape))
    return api.reduce_scatter(output, ins, op=op, group=group, async_op=async_op, algorithm=algorithm)


def _rows(name, what, t, splits, n):
    """``t`` cut along dim 0 into ``n`` views of ``splits[i]`` rows (equal when None)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{_where(name)}: {what} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_contiguous():
        raise ValueError(f"{_where(name)}: {what} must be contiguous (torch requires it too)")
    rows = t.shape[0] if t.dim() else 1
    if splits is None or len(splits) == 0:
        if rows % n:
            raise ValueError(f"{_where(name)}: {what} has {rows} rows, not divisible by the group size "
                             f"{n}; pass {what}_split_sizes")
        splits = [rows // n] * n
    splits = [int(s) for s in splits]
    if len(splits) != n or min(splits) < 0 or sum(splits) != rows:
        raise ValueError(f"{_where(name)}: {what}_split_sizes={splits} must be {n} non-negative row "
                         f"counts summing to {what}'s {rows} rows")
    row = t[0].numel() if t.dim() and rows else (t.numel() // max(rows, 1))
    return [piece.view((s,) + tuple(t.shape[1:])) if t.dim() else piece
            for piece, s in zip(t.view(-1).split([s * row for s in splits]), splits)]


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, group=None,
                      async_op=False, algorithm=None):
    """Rank i's ``input`` rows for rank j go to rank j's ``output``, in rank order.

    Card: carried by ``all_to_all`` (linear or pairwise; bruck for pieces of one
    size). ``input`` is cut along dim 0 into N pieces of ``input_split_sizes``
    rows (equal pieces when None), ``output`` likewise by ``output_split_sizes``;
    piece j of rank i's input must have as many rows as piece i of rank j's
    output. Each rank sends its whole input but its own piece, one message per
    other rank (linear, pairwise). Views, no copy.

    Args:
        output (Tensor): Contiguous; where the pieces from every rank land.
        input (Tensor): Contiguous; the pieces for every rank (unchanged).
        output_split_sizes (list[int], optional): Rows received from each rank.
        input_split_sizes (list[int], optional): Rows sent to each rank.
        group, async_op, algorithm: As in :func:`all_gather_into_tensor`
            (``ALGORITHMS["all_to_all"]``).

    Returns:
        A handle if ``async_op``, else None.

    Example::

        >>> # world of 2; rank 0 sends 1 row to itself and 2 to rank 1, rank 1 sends 1 and 1
        >>> inp = torch.tensor([0, 1, 2]) if rank == 0 else torch.tensor([10, 11])
        >>> out = torch.zeros(2 if rank == 0 else 3, dtype=torch.int64)
        >>> collectives.all_to_all_single(out, inp, [1, 1] if rank == 0 else [2, 1],
        ...                               [1, 2] if rank == 0 else [1, 1])
        >>> out
        tensor([ 0, 10])     # Rank 0
        tensor([ 1,  2, 11]) # Rank 1
    """
    n = _group_size("all_to_all_single", group)
    if n is None:
        return None
    outs = _rows("all_to_all_single", "output", output, output_split_sizes, n)
    ins = _rows("all_to_all_single", "input", input, input_split_sizes, n)
    return api.all_to_all(outs, ins, group=group, async_op=async_op, algorithm=algorithm)
