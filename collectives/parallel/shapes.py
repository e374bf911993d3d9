"""Same shapes everywhere: every rank's inputs described and compared before the first data message.

Semantics. Sequence parallelism and ring attention cut one sequence over the ranks of a
group, so every rank must hold a chunk of the same shape (sequence length, heads, head
dim, dtype). If one does not, its data messages have another size than its neighbours
expect: they never pair (the size is in the tag), and every rank would wait out
``COLLECTIVES_TIMEOUT``. :func:`same_shapes` runs first instead: each rank writes one
line of text, either what it holds (``"q, k, v [1, 2, 4, 8] float64, causal"``) or what
is wrong with it on its own (``"q, k, v must share one shape ..."``), and one all_gather
gives every rank every line. Every rank then reaches the same verdict from the same
lines: no error, or the same ``ValueError`` naming the ranks and what each holds. Nothing
else has moved, so the group stays usable.

Steps, rank r of N:

1. describe: r's line, UTF-8, cut to :data:`LINE_BYTES` and padded with zeros;
2. exchange: ring all_gather of the N lines (N-1 messages of LINE_BYTES each);
3. judge: the first rank with a fault of its own is named, with its words; else, if the
   lines differ, every group of ranks with one line is named with it.

Worked example, N = 4, rank 2's chunk longer: lines L, L, L', L; after the all_gather
every rank holds [L, L, L', L] and raises "ranks hold different inputs: ranks 0, 1, 3:
L; rank 2: L'".

Cost: (N-1) messages of LINE_BYTES = 256 bytes per rank and call (:func:`cost`), one
more ring all_gather's latency before the data moves.
"""
import torch
import torch.distributed as dist

from .. import tensor_api

LINE_BYTES = 256


def cost(n):
    """Messages and bytes one rank sends for one check on a group of ``n``."""
    return dict(messages=n - 1, bytes=(n - 1) * LINE_BYTES)


def _ranks(ranks):
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def same_shapes(where, group, line, fault=None, need=""):
    """Raise the same ValueError on every rank of ``group`` unless every rank's ``line`` agrees.

    Args:
        where (str): The caller's name, first in the error.
        group (ProcessGroup, optional): The ranks that must agree; None for the world. Errors
            name global ranks.
        line (str): What this rank holds, e.g. ``"x [4, 2, 8] float32"``.
        fault (str, optional): What is wrong with this rank's input on its own; every rank
            raises it, naming this rank.
        need (str): What every rank must hold, said after a disagreement.

    Returns:
        None. Raises ``ValueError`` on every rank alike, before any other message.

    Example::

        >>> same_shapes("ring_attention", None, f"q, k, v {list(q.shape)} {q.dtype}")
    """
    n, me = dist.get_world_size(group), dist.get_rank(group)
    if me < 0:
        raise ValueError(f"{where}: rank {dist.get_rank()} is not a member of the group")
    named = list(range(n)) if group is None else dist.get_process_group_ranks(group)   # global ranks
    text = ("!" + fault if fault else line).encode()[:LINE_BYTES]
    mine = torch.zeros(LINE_BYTES, dtype=torch.uint8)
    mine[:len(text)] = torch.tensor(list(text), dtype=torch.uint8)
    every = torch.empty(n * LINE_BYTES, dtype=torch.uint8)
    tensor_api.all_gather_into_tensor(every, mine, group=group, algorithm="ring")
    lines = [bytes(row.tolist()).rstrip(b"\0").decode(errors="replace") for row in every.view(n, LINE_BYTES)]
    for rank, said in enumerate(lines):
        if said.startswith("!"):
            raise ValueError(f"{where}: rank {named[rank]}: {said[1:]}")
    if len(set(lines)) > 1:
        groups = {}
        for rank, said in enumerate(lines):
            groups.setdefault(said, []).append(named[rank])
        held = "; ".join(f"{_ranks(ranks)}: {said}" for said, ranks in groups.items())
        raise ValueError(f"{where}: ranks hold different inputs: {held}{'; ' + need if need else ''}")
