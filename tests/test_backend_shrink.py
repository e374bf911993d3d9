"""``dist.shrink_group`` on a "collectives" group: a job drops a dead rank and carries on.

Rank 2 of 4 dies (its process ends with no goodbye, as a SIGKILL leaves it). The others'
next all_reduce fails naming it; they shrink the group without it and finish an all_reduce
over the three that are left, with the right values, on our algorithms.
"""
import os

import pytest
import torch
import torch.distributed as dist

from collectives.backend import backend_of
from collectives.backend.process_group import BACKEND_SUBCLASSABLE
from collectives.errors import CollectiveError

from .worlds import DEATH_EXIT_CODE, run_world

pytestmark = pytest.mark.skipif(not hasattr(dist, "shrink_group"), reason="this torch has no shrink_group")

DEAD = 2


def shrink_world(rank, n):
    torch.set_num_threads(1)
    x = torch.full((3,), float(rank + 1))
    dist.all_reduce(x)                             # everyone alive: 1 + 2 + 3 + 4
    assert x.tolist() == [10.0] * 3
    if rank == DEAD:
        os._exit(DEATH_EXIT_CODE)
    try:
        dist.all_reduce(torch.ones(3))
    except CollectiveError as exc:
        failure = str(exc)
    else:
        raise AssertionError("an all_reduce with a dead member succeeded")
    if not BACKEND_SUBCLASSABLE:
        # torch 2.11 gives Backend no Python constructor, so our group cannot be shrunk; torch
        # says so itself, before any message
        with pytest.raises(TypeError, match="does not support shrinking"):
            dist.shrink_group([DEAD])
        return failure, None, dist.get_backend()
    group = dist.shrink_group([DEAD])
    assert dist.get_world_size(group) == n - 1
    assert backend_of(group) is not None            # still ours
    y = torch.full((5,), float(rank + 1))
    dist.all_reduce(y, group=group)
    return failure, y.tolist(), dist.get_backend(group)


def test_survivors_shrink_the_group_and_finish_an_all_reduce():
    n = 4
    results = run_world(shrink_world, n, backend="collectives", env={"COLLECTIVES_TIMEOUT": "5"}, timeout=120)
    assert results[DEAD] is None
    want = float(sum(r + 1 for r in range(n) if r != DEAD))
    failures = []
    for rank, got in enumerate(results):
        if rank == DEAD:
            continue
        failure, values, backend = got
        if BACKEND_SUBCLASSABLE:
            assert values == [want] * 5, (rank, values)
        assert backend == "collectives"
        failures.append(failure)
    # a rank whose only wait was on a live peer may blame that peer (issue 38, part 2)
    assert any(f"rank {DEAD} of the group" in f and "died" in f for f in failures), failures
