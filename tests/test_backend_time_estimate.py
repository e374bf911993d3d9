"""torch's ``_time_estimator`` on a "collectives" group: our cost model answers, no message moves.

torch 2.14's ``dist.distributed_c10d._time_estimator(group)`` asks the group's backend for
``supports_time_estimate``, calls ``_start_time_estimate()``, lets the collectives of its
``with`` block be issued, and stores ``_end_time_estimate()`` in ``cm.estimated_time``. Ours
sums ``cost_model.predict`` for each collective issued in the block, on the parameters of the
tables the group agreed on, in microseconds (NCCL's unit for the same figure).
"""
import pytest
import torch
import torch.distributed as dist

import collectives
from collectives.backend import backend_of
from collectives.backend.process_group import estimate_seconds
from collectives.tuning import agreed

from .worlds import run_world

_time_estimator = getattr(dist.distributed_c10d, "_time_estimator", None)
pytestmark = pytest.mark.skipif(_time_estimator is None, reason="this torch has no _time_estimator")


def estimate_world(rank, n):
    torch.set_num_threads(1)
    group = dist.new_group(list(range(n)))
    tables = agreed.tables_of(backend_of(group).group_info)
    x = torch.full((1000,), float(rank + 1))
    out = torch.full((3 * n,), -1.0)
    piece = torch.full((3,), float(rank))
    with collectives.count_traffic() as traffic:
        with _time_estimator(group) as cm:
            dist.all_reduce(x, group=group)
            dist.all_reduce(x[:0], group=group)
            dist.all_gather_into_tensor(out, piece, group=group)
            dist.broadcast(x, src=0, group=group)
            dist.barrier(group=group)
    # nothing ran: inputs and outputs are as they were, no message was sent
    assert torch.equal(x, torch.full((1000,), float(rank + 1))), x
    assert torch.equal(out, torch.full((3 * n,), -1.0)), out
    want = 1e6 * (estimate_seconds("all_reduce", 4000, n, tables)
                  + estimate_seconds("all_reduce", 0, n, tables)
                  + estimate_seconds("all_gather", 12 * n, n, tables)
                  + estimate_seconds("broadcast", 4000, n, tables)
                  + estimate_seconds("barrier", 0, n, tables))
    # a second block starts from zero; the group still runs collectives afterwards
    with _time_estimator(group) as again:
        dist.all_reduce(x, group=group)
    dist.all_reduce(x, group=group)
    assert torch.equal(x, torch.full((1000,), float(n * (n + 1) // 2))), x
    return traffic.sent_messages, cm.estimated_time, want, again.estimated_time, \
        1e6 * estimate_seconds("all_reduce", 4000, n, tables)


@pytest.mark.parametrize("world_size", [1, 3])
def test_time_estimator_sums_the_cost_model_without_sending(world_size):
    results = run_world(estimate_world, world_size, backend="collectives", env={"COLLECTIVES_TIMEOUT": "20"})
    for sent, got, want, again, one in results:
        assert sent == 0
        assert isinstance(got, float)
        assert got == pytest.approx(want, rel=1e-9)
        assert again == pytest.approx(one, rel=1e-9)
        if world_size == 1:
            assert got == 0.0
        else:
            assert got > 0
    assert len({r[1] for r in results}) == 1, results     # every rank estimates alike


def test_estimate_reads_the_agreed_model():
    tables = agreed.local()
    params = tables.shipped["model"]
    from collectives.tuning import cost_model
    for coll, size in [("all_reduce", 1 << 20), ("all_gather", 4096), ("all_to_all", 1 << 16)]:
        got = estimate_seconds(coll, size, 4, tables)
        picks = [cost_model.predict(coll, a, 4, size, params) for a in collectives.ALGORITHMS[coll]
                 if _modelled(coll, a)]
        assert min(picks) <= got <= max(picks)
    with pytest.raises(ValueError, match="collective"):
        estimate_seconds("all_sum", 10, 4, tables)


def _modelled(coll, algo):
    from collectives.tuning.choice import auto
    return auto(coll, algo) == "model"
