"""The benchmark runs and checks results; the cost model and algorithm=None behave.

No timing is asserted here (targets live in docs/benchmarks.md, measured by
``python -m collectives.bench``); these tests check that the tool measures
the right things and that the model and the chooser follow their rules.
"""
import json
import math
import time

import pytest
import torch

from collectives import bench, cost_model, tuning
from collectives.algorithms import ALGORITHMS

PARAMS = {"alpha": 50e-6, "beta": 1 / 1.5e9, "gamma": 1 / 5e9}


def test_bench_smoke_two_ranks(tmp_path):
    """Tiny sweep on 2 ranks: every row checked against the closed form, outputs written."""
    out = tmp_path / "out"
    table = tmp_path / "table.json"
    bench.main(["-b", "1K", "-e", "4K", "-f", "4", "-n", "2", "-c", "all_reduce,all_gather,broadcast",
                "--iters", "2", "-w", "1", "--batch", "1", "--out", str(out),
                "--write-table", str(table), "--timeout", "120"])
    data = json.loads((out / "results.json").read_text())
    rows = data["rows"]
    for collective in ("all_reduce", "all_gather", "broadcast"):
        labels = {r["algorithm"] for r in rows if r["collective"] == collective}
        assert labels == set(ALGORITHMS[collective]) | {"builtin", "default"}
    assert {r["size"] for r in rows} == {1024, 4096}
    assert all(r["check"] == "ok" for r in rows)
    for r in rows:
        assert r["time_us"] > 0
        assert math.isclose(r["busbw_GBps"],
                            r["algbw_GBps"] * bench.busbw_factor(r["collective"], r["world_size"]))
        assert (r["vs_builtin"] == 1.0) == (r["algorithm"] == "builtin")
        assert (r["default_over_best"] is not None) == (r["algorithm"] == "default")
    assert data["p2p"] and data["model"]["2"]["alpha"] >= 0 and data["model"]["2"]["beta"] > 0
    assert (out / "report.md").read_text().count("| all_reduce | 2 |") == 2 * (len(ALGORITHMS["all_reduce"]) + 2)
    assert (out / "all_reduce_n2.png").exists() and (out / "model_vs_measured.png").exists()
    choices = json.loads(table.read_text())["choices"]
    assert set(choices) == {"all_reduce", "all_gather", "broadcast"}
    assert all(name in ALGORITHMS["all_reduce"] for _, name in choices["all_reduce"]["2"])


@pytest.mark.parametrize("collective", bench.COLLECTIVES)
def test_case_closed_form_catches_a_wrong_result(collective):
    """The bench's checker rejects a result that differs in one element (world of 3, rank 0)."""
    case = bench.Case(collective, 96, torch.float32, bench.OPS["sum"], torch.device("cpu"), 0, 3)
    name, value = case.expected()

    class Fake:
        def __getattr__(self, attr):
            def run(*args, **kw):
                b = buffers[0]
                target = b[name]
                values = value if isinstance(value, list) else [value]
                targets = target if isinstance(target, list) else [target]
                for t, v in zip(targets, values):
                    t.copy_(v)
                targets[-1].view(-1)[-1] += 1
            return run
    buffers = []
    original = case.buffers
    case.buffers = lambda encoded: buffers.append(original(encoded)) or buffers[-1]
    assert case.check(Fake()) is not None


def test_busbw_factors_match_nccl_tests():
    assert bench.busbw_factor("all_reduce", 4) == 1.5
    assert bench.busbw_factor("all_gather", 4) == 0.75
    assert bench.busbw_factor("reduce_scatter", 8) == 7 / 8
    assert bench.busbw_factor("broadcast", 4) == bench.busbw_factor("reduce", 4) == 1.0


def test_sizes_follow_nccl_tests_flags():
    args = bench.build_parser().parse_args(["-b", "4K", "-e", "64K", "-f", "4"])
    assert bench.sizes_from(args) == [4096, 16384, 65536]
    args = bench.build_parser().parse_args(["-b", "1M", "-e", "3M", "-f", "1", "-i", "1M"])
    assert bench.sizes_from(args) == [1 << 20, 2 << 20, 3 << 20]


def test_fit_recovers_alpha_and_beta():
    rows = [{"size": s, "pingpong_oneway_us": 1e6 * (20e-6 + s / 2e9),
             "ring_exchange_us": 1e6 * (30e-6 + s / 1e9), "reduce_us": 1e6 * s / 4e9}
            for s in (4, 1024, 65536, 1 << 20, 16 << 20)]
    p = cost_model.fit(rows)
    assert math.isclose(p["alpha"], 20e-6, rel_tol=1e-6)
    assert math.isclose(1 / p["beta"], 2e9, rel_tol=1e-6)
    assert math.isclose(1 / p["beta_ring"], 1e9, rel_tol=1e-6)
    assert math.isclose(1 / p["gamma"], 4e9, rel_tol=1e-3)


def test_model_matches_the_cards():
    a, b, g = PARAMS["alpha"], PARAMS["beta"], PARAMS["gamma"]
    s = 1 << 20
    for n in (2, 4, 8):
        ring = cost_model.predict("all_reduce", "ring", n, s, PARAMS)
        assert math.isclose(ring, 2 * (n - 1) * a + 2 * (n - 1) / n * s * b + (n - 1) / n * s * g)
        rd = cost_model.predict("all_reduce", "recursive_doubling", n, s, PARAMS)
        assert math.isclose(rd, math.log2(n) * (a + s * b + s * g))
    # Not a power of two: the fold costs two more messages of S and one more reduction.
    assert math.isclose(cost_model.predict("all_reduce", "recursive_doubling", 3, s, PARAMS),
                        (a + s * b + s * g) + 2 * (a + s * b) + s * g)
    assert cost_model.predict("all_reduce", "ring", 1, s, PARAMS) == 0.0
    # Every registered algorithm of every collective has a formula.
    for collective, names in ALGORITHMS.items():
        for name in names:
            assert not math.isnan(cost_model.predict(collective, name, 4, s, PARAMS)), (collective, name)


def test_model_crossovers():
    """Latency-bound sizes favour few steps, bandwidth-bound sizes few bytes."""
    names = ALGORITHMS["all_reduce"]
    assert cost_model.best("all_reduce", names, 8, 64, PARAMS) == "recursive_doubling"
    assert cost_model.best("all_reduce", names, 8, 64 << 20, PARAMS) in ("ring", "ring_pipelined",
                                                                         "rabenseifner")
    assert cost_model.best("broadcast", ALGORITHMS["broadcast"], 8, 64, PARAMS) == "binomial_tree"
    assert cost_model.best("all_gather", ALGORITHMS["all_gather"], 8, 64 << 20, PARAMS) in (
        "ring", "recursive_doubling")


def test_choose_reads_the_measured_table(tmp_path, monkeypatch):
    table = {"choices": {"all_reduce": {"4": [[4096, "tree"], [1 << 20, "rabenseifner"],
                                              [64 << 20, "ring"]]}},
             "model": PARAMS}
    path = tmp_path / "t.json"
    path.write_text(json.dumps(table))
    monkeypatch.setattr(tuning, "_table", lambda: json.loads(path.read_text()))
    tuning.choose.cache_clear()
    try:
        assert tuning.choose("all_reduce", 4096, 4) == "tree"
        assert tuning.choose("all_reduce", 1, 4) == "tree"             # below the table: its first entry
        assert tuning.choose("all_reduce", 1 << 20, 4) == "rabenseifner"
        assert tuning.choose("all_reduce", 7 << 20, 4) == "rabenseifner"  # nearer 1M than 64M on a log scale
        assert tuning.choose("all_reduce", 128 << 20, 4) == "ring"       # just past the end: the end
        # Far beyond the largest measured size: the model, not an extrapolated table.
        assert tuning.choose("all_reduce", 1 << 30, 4) == cost_model.best(
            "all_reduce", ALGORITHMS["all_reduce"], 4, 1 << 30, PARAMS)
        # A group size the table lacks: the model with the table's parameters.
        assert tuning.choose("all_reduce", 64, 8) == cost_model.best("all_reduce", ALGORITHMS["all_reduce"],
                                                                      8, 64, PARAMS)
        assert tuning.choose("barrier", 0, 4) == "dissemination"
    finally:
        tuning.choose.cache_clear()


def test_choose_always_names_a_registered_algorithm():
    tuning.choose.cache_clear()
    for collective, names in ALGORITHMS.items():
        for n in (1, 2, 3, 4, 5, 8, 16):
            for nbytes in (0, 1, 4096, 1 << 20, 256 << 20):
                assert tuning.choose(collective, nbytes, n) in names


def test_best_from_rows_ignores_builtin_default_and_debug():
    rows = [{"collective": "all_reduce", "world_size": 2, "size": 4096, "algorithm": a, "time_us": t}
            for a, t in (("builtin", 1.0), ("default", 2.0), ("ring+debug", 0.5), ("ring", 9.0),
                         ("tree", 8.0))]
    assert tuning.best_from_rows(rows) == {"all_reduce": {"2": [[4096, "tree"]]}}


def test_best_from_rows_prefers_the_steady_winner_among_near_ties():
    """tree is 5% faster at one size only: within noise, so ring (near-best everywhere) keeps it."""
    rows = [{"collective": "all_reduce", "world_size": 2, "size": s, "algorithm": a, "time_us": t}
            for s, a, t in ((1, "ring", 10), (1, "tree", 10.5), (1, "naive_ring", 30),
                            (2, "ring", 10), (2, "tree", 9.5), (3, "ring", 10), (3, "tree", 20),
                            (4, "ring", 30), (4, "tree", 10))]
    assert tuning.best_from_rows(rows) == {"all_reduce": {"2": [[1, "ring"], [2, "ring"], [3, "ring"],
                                                                [4, "tree"]]}}


def test_a_table_measured_here_replaces_the_packaged_one(tmp_path, monkeypatch):
    # python -m collectives.bench --write-table FILE, then COLLECTIVES_TUNING_TABLE=FILE
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"choices": {"all_reduce": {"2": [[4096, "naive_ring"], [1 << 20, "ring"]]}}}))
    try:
        monkeypatch.setenv("COLLECTIVES_TUNING_TABLE", str(path))
        tuning._table.cache_clear()
        tuning.choose.cache_clear()
        assert tuning.choose("all_reduce", 4096, 2) == "naive_ring"
        assert tuning.choose("all_reduce", 1 << 20, 2) == "ring"
        monkeypatch.setenv("COLLECTIVES_TUNING_TABLE", str(tmp_path / "typo.json"))
        tuning._table.cache_clear()
        tuning.choose.cache_clear()
        with pytest.raises(ValueError, match=r"COLLECTIVES_TUNING_TABLE=.*typo\.json: cannot read"):
            tuning.choose("all_reduce", 4096, 2)
    finally:
        monkeypatch.delenv("COLLECTIVES_TUNING_TABLE")
        tuning._table.cache_clear()
        tuning.choose.cache_clear()
    assert tuning.table_path() == tuning.TABLE_PATH


def test_bench_call_prints_every_layer_for_every_batch(capfd):
    """The call-cost benchmark runs every row at each batch size and restores the API's door."""
    from collectives import api, bench_call
    from collectives.p2p_communications import Comm
    bench_call.main(["--world-sizes", "3", "--iters", "2", "--warmup", "1", "--batch", "1", "2"])
    out = capfd.readouterr().out
    rows = ("built-in", "api", "algorithm", "exchange, door", "exchange, torch",
            "exchange, torch + 100 us CPU", "api, no network")
    for batch in (1, 2):
        assert f"N=3, algorithm=tree, {batch} call(s) back to back" in out
    for row in rows:
        assert sum(line.strip().startswith(row + "  ") for line in out.splitlines()) == 2, row
    assert api.Comm is Comm


def test_thread_cpu_charges_the_calling_thread():
    """bench_cpu's per-thread clock sees 100 ms of busy work in the calling thread."""
    from collectives.bench_cpu import ROLES, thread_cpu
    before = thread_cpu()
    end = time.perf_counter() + 0.1
    while time.perf_counter() < end:
        pass
    after = thread_cpu()
    assert set(after) == set(ROLES)
    assert sum(after["calling"]) - sum(before["calling"]) >= 0.05


def test_bench_cpu_prints_a_row_per_candidate(capfd):
    """The per-thread CPU benchmark runs the built-in and each named algorithm and prints them."""
    from collectives import bench_cpu
    bench_cpu.main(["-n", "2", "-s", "4K", "-a", "ring,tree", "--rounds", "1", "--calls", "3", "--warmup", "1"])
    out = capfd.readouterr().out
    assert "all_reduce 4096 B float32, N=2, gloo, 1 rounds x 3 calls" in out
    for name in ("built-in", "ring", "tree"):
        line = next(line for line in out.splitlines() if line.strip().startswith(name + " "))
        cells = line.split()
        assert float(cells[1]) > 0                                   # wall ms per call
        assert len(cells) == 2 + len(bench_cpu.ROLES) + 2            # roles, total, ratio
        assert all(float(x) >= 0 for c in cells[2:2 + len(bench_cpu.ROLES)] for x in c.split("+"))
