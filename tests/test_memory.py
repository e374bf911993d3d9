"""Each algorithm allocates no more temporary memory than its ``cost`` states.

:class:`Allocations` is a ``TorchDispatchMode``: it sees every ATen operation
on the calling thread, and counts the bytes of each output whose storage is
none of the operation's inputs' (a fresh allocation; views and in-place
results share an input's storage). The sum of everything allocated bounds the
peak from above, so ``allocated <= cost.extra_memory`` proves the peak bound;
the algorithms here allocate once per call, so the two are equal, which is
checked too (a cost that overstates is also wrong). The algorithms are called
directly with a ``Comm`` on the test's thread, as ``collectives.api`` calls
them on its communication thread. Buffers inside the transport (gloo) are not
tensors and are not counted: ``benchmarks/memory.py`` measures the whole
process.
"""
import pytest
import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from collectives import ALGORITHMS, reduce_ops
from collectives.algorithms import REGISTRY, cost
from collectives.p2p_communications import Comm

from .worlds import run_world

ELEM = 4


class Allocations(TorchDispatchMode):
    """Bytes of new tensor storage allocated while active (on this thread)."""

    def __init__(self):
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0]
                  if isinstance(t, torch.Tensor)}
        out = func(*args, **kwargs)
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs:
                self.bytes += t.untyped_storage().nbytes()
        return out


def run(collective, algorithm, n, rank, e):
    """Call the algorithm itself on ``e`` elements (one rank's piece for the list collectives);
    return (S as ``cost`` counts it, bytes allocated)."""
    comm = Comm(dist.group.WORLD, collective, algorithm)
    fn = REGISTRY[collective][algorithm]
    red = reduce_ops.reduction(dist.ReduceOp.SUM, torch.float32, "test")
    x = torch.ones(e)
    lists = [torch.ones(e) for _ in range(n)]
    inputs = [torch.ones(e) for _ in range(n)]
    with Allocations() as a:
        if collective == "all_reduce":
            fn(comm, x, red)
        elif collective == "broadcast":
            fn(comm, x, 0)
        elif collective == "reduce":
            fn(comm, x, 0, red)
        elif collective == "scatter":
            fn(comm, x, lists if rank == 0 else None, 0)
        elif collective == "gather":
            fn(comm, x, lists if rank == 0 else None, 0)
        elif collective == "all_gather":
            fn(comm, lists, x)
        elif collective == "reduce_scatter":
            fn(comm, x, lists, red)
        elif collective == "all_to_all":
            fn(comm, lists, inputs)
        else:
            fn(comm)
    s = 0 if collective == "barrier" else e * ELEM * (1 if collective in ("all_reduce", "broadcast", "reduce") else n)
    return s, a.bytes


SIZES = (7,)                       # uneven pieces, some ranks with one element
LARGE = 600_001     # 2.4 MB all_reduce: Rabenseifner cuts its halves into several messages


def memory_world(rank, n):
    torch.manual_seed(0)
    out = {}
    for collective, names in ALGORITHMS.items():
        for algorithm in names:
            for e in SIZES + ((LARGE,) if collective == "all_reduce" else ()):
                s, allocated = run(collective, algorithm, n, rank, e)
                out[collective, algorithm, s] = allocated
    return out


@pytest.mark.parametrize("n", [3, 4])
def test_allocations_match_cost(n):
    per_rank = run_world(memory_world, n)
    for key in per_rank[0]:
        collective, algorithm, s = key
        stated = cost(collective, algorithm, n, s, ELEM).extra_memory
        allocated = [r[key] for r in per_rank]
        assert max(allocated) <= stated, f"{key} N={n}: allocated {allocated}, cost says {stated}"
        assert max(allocated) == stated, f"{key} N={n}: cost overstates: {allocated} vs {stated}"


def test_large_all_reduce_stays_within_a_chunk_per_rank():
    """Issue 14: ring, ring_pipelined and rabenseifner need at most S/N + one chunk (1 MiB)."""
    from collectives.algorithms._cost import CHUNK_BYTES
    for n in (2, 3, 4, 5, 6, 8):
        s = 64 << 20
        for algorithm in ("ring", "ring_pipelined", "rabenseifner"):
            extra = cost("all_reduce", algorithm, n, s, ELEM).extra_memory
            assert extra <= s // n + CHUNK_BYTES, (algorithm, n, extra)
    assert cost("all_reduce", "ring", 2, 64 << 20, ELEM).extra_memory == 32 << 20
