"""The door's scratch receive buffers (``Comm.scratch``): kept per group, lane and dtype, grown
to the largest inbox asked for, and never a reason for a wrong answer when calls of different
sizes, dtypes and algorithms follow one another on one group."""
import torch
import torch.distributed as dist

import collectives
from collectives import p2p_communications
from collectives.p2p_communications import SCRATCH_MIN

from .worlds import run_world


def kept_buffers():
    kept = p2p_communications._scratch_of.get(dist.group.WORLD)
    return {} if kept is None else {str(dtype): t.numel() for (_, dtype), t in kept.items()}


def one_after_another(rank, n):
    wrong, pointers = [], []
    for numel, dtype, algorithm in [(3 << 18, torch.float32, "ring"), (1 << 18, torch.float32, "ring"),
                                    (5 << 18, torch.float32, "rabenseifner"),
                                    (3 << 18, torch.float64, "recursive_doubling"),
                                    (1 << 18, torch.float32, "recursive_doubling"),
                                    (5 << 18, torch.float32, "ring"), (5 << 18, torch.float32, "ring")]:
        x = (torch.arange(numel) % 1000).to(dtype) * (rank + 1)     # sums exact in float32
        want = (torch.arange(numel) % 1000).to(dtype) * (n * (n + 1) // 2)
        collectives.all_reduce(x, algorithm=algorithm)
        if not torch.equal(x, want):
            wrong.append((numel, str(dtype), algorithm))
        kept = p2p_communications._scratch_of.get(dist.group.WORLD, {})
        pointers.append(sorted(t.data_ptr() for t in kept.values()))
    # a small call makes no buffer of its own
    small = torch.ones(SCRATCH_MIN // 8)
    collectives.all_reduce(small, algorithm="ring")
    return wrong, kept_buffers(), pointers[-1] == pointers[-2], bool(small.eq(n).all())


def test_calls_of_any_size_and_dtype_reuse_the_groups_buffers_and_agree():
    for n in (2, 3):
        for wrong, kept, reused, small_ok in run_world(one_after_another, n):
            assert wrong == [] and small_ok
            # one buffer per dtype, as large as the largest inbox asked for: at least the
            # ring's chunk of 5 << 18 elements; float64's, recursive doubling's whole tensor
            assert set(kept) == {"torch.float32", "torch.float64"}, kept
            assert kept["torch.float32"] >= -(-(5 << 18) // n) and kept["torch.float64"] == 3 << 18, kept
            assert reused       # the same call again found its buffer: no new memory
