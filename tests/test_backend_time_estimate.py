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
from collectives.backend.process_group import estimate_params, estimate_seconds
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
    from collectives.tuning import cost_model
    params = estimate_params(tables, 4)
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


def _calls(params, n, algorithms, sizes):
    from collectives.tuning import cost_model
    return [{"collective": "all_reduce", "algorithm": a, "world_size": n, "size": s,
             "time_us": 1e6 * cost_model.predict("all_reduce", a, n, s, params)}
            for a in algorithms for s in sizes]


def test_fit_calls_recovers_the_figures_that_made_the_calls():
    from collectives.tuning import cost_model
    made = {"call": 300e-6, "alpha": 50e-6, "beta": 1e-9, "gamma": 3e-10}
    rows = _calls(made, 4, ["ring", "tree", "recursive_doubling", "naive_ring", "rabenseifner"],
                  [4096, 65536, 1 << 20, 16 << 20])
    rows.append({"collective": "all_reduce", "algorithm": "untuned", "world_size": 4, "size": 4096,
                 "time_us": 1.0})       # a label that is no algorithm: left out
    found = cost_model.fit_calls(rows)
    for key, value in made.items():
        assert found[key] == pytest.approx(value, rel=1e-6), (key, found)
    # no per-call cost in the calls: none is found, and none is negative
    made = {"call": 0.0, "alpha": 80e-6, "beta": 2e-9, "gamma": 1e-9}
    found = cost_model.fit_calls(_calls(made, 3, ["ring", "tree", "naive_ring"], [4096, 1 << 20, 8 << 20]))
    assert all(v >= 0 for v in found.values())
    assert found["alpha"] == pytest.approx(80e-6, rel=1e-3) and found["call"] < 1e-9
    assert cost_model.fit_calls(rows[:3]) is None


def test_the_estimate_prices_with_the_figures_fitted_to_calls_where_the_table_has_them():
    from collectives.tuning import cost_model
    shipped = agreed.local().shipped
    ping = {"alpha": 40e-6, "beta": 3e-10, "gamma": 2e-10}
    calls = {"call": 900e-6, "alpha": 300e-6, "beta": 1e-9, "gamma": 5e-10}
    plain = agreed.Tables({"models": {"4": dict(ping)}}, shipped, "x", "-", "test")
    fitted = agreed.Tables({"models": {"4": dict(ping, calls=calls)}}, shipped, "x", "-", "test")
    for size in (4096, 1 << 20):
        algo = "ring"
        assert estimate_seconds("all_reduce", size, 4, plain, algo) == pytest.approx(
            cost_model.predict("all_reduce", algo, 4, size, ping))
        assert estimate_seconds("all_reduce", size, 4, fitted, algo) == pytest.approx(
            cost_model.predict("all_reduce", algo, 4, size, calls))
        assert cost_model.predict("all_reduce", algo, 4, size, calls) == pytest.approx(
            900e-6 + cost_model.predict("all_reduce", algo, 4, size, dict(calls, call=0.0)))
