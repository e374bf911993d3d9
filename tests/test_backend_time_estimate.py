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
    for coll, size in [("all_reduce", 1 << 20), ("all_gather", 4096), ("all_to_all", 1 << 16)]:
        got = estimate_seconds(coll, size, 4, tables)
        # each algorithm with the figures the table holds for it (its own where the tune timed
        # it), plus what torch's API adds to a call
        picks = [params["torch_call"] + cost_model.predict(coll, a, 4, size, params)
                 for a in collectives.ALGORITHMS[coll] if _modelled(coll, a)
                 for params in [estimate_params(tables, 4, coll, a)]]
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


def test_the_estimate_adds_what_torch_api_adds_to_a_call():
    """The tune times calls of our API; torch asks for the time of its own calls, which pay
    torch's dispatch and our backend's wrapping on top (``torch_call``, measured by the tune)."""
    from collectives.tuning import tables as tuning_tables
    shipped = agreed.local().shipped
    ping = {"alpha": 40e-6, "beta": 3e-10, "gamma": 2e-10}
    calls = {"call": 900e-6, "alpha": 300e-6, "beta": 1e-9, "gamma": 5e-10}
    without = agreed.Tables({"models": {"4": dict(ping, calls=calls)}}, shipped, "x", "-", "test")
    with_torch = agreed.Tables({"models": {"4": dict(ping, calls=calls, torch_call=150e-6)}}, shipped,
                               "x", "-", "test")
    for size in (0, 4096, 1 << 20):
        assert estimate_seconds("all_reduce", size, 4, with_torch, "ring") == pytest.approx(
            150e-6 + estimate_seconds("all_reduce", size, 4, without, "ring"))
    assert estimate_seconds("all_reduce", 4096, 1, with_torch) == 0.0     # a group of one sends nothing
    # a table from before the figure existed prices as it did
    assert estimate_params(without, 4)["torch_call"] == 0.0
    for bad in (-1e-6, float("nan"), "150us"):
        table = {"models": {"4": dict(ping, torch_call=bad)}}
        assert "torch_call" in tuning_tables.problem(table)
    assert tuning_tables.problem({"models": {"4": dict(ping, torch_call=0.0)}}) is None


def test_each_algorithm_timed_at_two_sizes_gets_figures_of_its_own():
    """One set of figures for every algorithm is a compromise (at N=4 on 2 cores it priced the
    Bine tree's 4 KiB call 1.6x what the tune timed, the ring's 0.84x); each algorithm the tune
    timed at two sizes or more is priced with its own cost per call and factor on the rest."""
    from collectives.tuning import cost_model
    calls = {"call": 200e-6, "alpha": 100e-6, "beta": 1e-9, "gamma": 5e-10}
    rest = dict(calls, call=0.0)
    made = {"ring": (500e-6, 2.0), "tree": (50e-6, 0.5), "ring_pipelined": (300e-6, 1.5)}
    sizes = [4096, 65536, 1 << 20, 16 << 20]
    rows = [{"collective": "all_reduce", "algorithm": a, "world_size": 4, "size": s,
             "time_us": 1e6 * (c + k * cost_model.predict("all_reduce", a, 4, s, rest))}
            for a, (c, k) in made.items() for s in sizes]
    rows.append({"collective": "all_reduce", "algorithm": "bine", "world_size": 4, "size": 4096,
                 "time_us": 700.0})            # one size only: no figures of its own
    rows.append({"collective": "all_reduce", "algorithm": "untuned", "world_size": 4, "size": 4096,
                 "time_us": 1.0})              # a label that is no algorithm
    found = cost_model.fit_algorithms(rows, calls)
    assert set(found) == {"all_reduce"} and set(found["all_reduce"]) == set(made)
    for a, (c, k) in made.items():
        own = found["all_reduce"][a]
        assert own["call"] == pytest.approx(c, rel=1e-6)
        for key in ("alpha", "beta", "gamma"):
            assert own[key] == pytest.approx(k * calls[key], rel=1e-6)
        for s in sizes:     # predict with its own figures gives back the times it was fitted to
            want = next(r["time_us"] for r in rows if r["algorithm"] == a and r["size"] == s)
            assert 1e6 * cost_model.predict("all_reduce", a, 4, s, own) == pytest.approx(want, rel=1e-6)
    # a per-call cost that would come out negative is 0, and the factor is fitted alone
    neg = [dict(r, time_us=r["time_us"] - 1e6 * 500e-6 - 1e6 * 100e-6) for r in rows if r["algorithm"] == "ring"]
    own = cost_model.fit_algorithms(neg, calls)["all_reduce"]["ring"]
    assert own["call"] == 0.0 and own["alpha"] > 0

    # the estimate prices the algorithm with its own figures; others with the shared ones
    shipped = agreed.local().shipped
    ping = {"alpha": 40e-6, "beta": 3e-10, "gamma": 2e-10}
    tables = agreed.Tables({"models": {"4": dict(ping, calls=calls, algorithms=found, torch_call=10e-6)}},
                           shipped, "x", "-", "test")
    for s in (1024, 1 << 20):
        assert estimate_seconds("all_reduce", s, 4, tables, "ring") == pytest.approx(
            10e-6 + cost_model.predict("all_reduce", "ring", 4, s, found["all_reduce"]["ring"]))
        assert estimate_seconds("all_reduce", s, 4, tables, "bine") == pytest.approx(
            10e-6 + cost_model.predict("all_reduce", "bine", 4, s, calls))
    # a damaged entry is named
    from collectives.tuning import tables as tuning_tables
    bad = {"models": {"4": dict(ping, algorithms={"all_reduce": {"ring": {"call": 1.0}}})}}
    assert '"algorithms"' in tuning_tables.problem(bad)
    assert tuning_tables.problem({"models": {"4": dict(ping, algorithms=found)}}) is None


def test_the_tune_report_names_a_figure_the_fit_dropped_instead_of_printing_it_as_a_bandwidth():
    """At N = 3 and 4 the bytes an all_reduce sends grow with the bytes it reduces, and
    fit_calls drops beta (its floor, 1e-15 s a byte): the report printed that as 1,000,000 GB/s."""
    import io
    from benchmarks import tune
    from collectives.tuning import cost_model
    # calls whose time has no beta at all: the fit keeps the rest, and beta at its floor
    made = {"call": 200e-6, "alpha": 60e-6, "beta": 0.0, "gamma": 2e-9}
    rows = _calls(made, 4, ["ring", "naive_ring"], [4096, 65536, 1 << 20, 16 << 20])
    calls = cost_model.fit_calls(rows)
    assert calls["beta"] <= cost_model.NO_BETA
    model = {"alpha": 50e-6, "beta": cost_model.NO_BETA, "gamma": 1e-10, "calls": calls}
    out = io.StringIO()
    tune.report([(4, {"model": model, "seconds": 1.0, "skipped": [], "others_cpu": 0.0})], rows, "T", 1.0,
                file=out)
    text = out.getvalue()
    assert "1000000" not in text, text
    assert text.count("beta dropped") == 2, text
    # a beta the fit kept is printed as a bandwidth, as before
    model = dict(model, beta=1e-9, calls=dict(calls, beta=2e-9))
    out = io.StringIO()
    tune.report([(4, {"model": model, "seconds": 1.0, "skipped": [], "others_cpu": 0.0})], rows, "T", 1.0,
                file=out)
    assert "beta 1.000 GB/s" in out.getvalue() and "beta 0.500 GB/s" in out.getvalue(), out.getvalue()
