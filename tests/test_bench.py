"""The benchmarks run and check results; the cost model and algorithm=None behave.

No timing is asserted here (figures live in docs/benchmarks.md, measured by
``python -m benchmarks.sweep`` and friends); these tests check that the tools
parse nccl-tests' flags, measure the right things, stay outside the library,
and that the model and the chooser follow their rules.
"""
import ast
import json
import math
import os
import pathlib
import threading
import time

import pytest
import torch

from benchmarks import common, sweep
from collectives import tuning
from collectives.tuning import cost_model
from collectives.algorithms import ALGORITHMS

PARAMS = {"alpha": 50e-6, "beta": 1 / 1.5e9, "gamma": 1 / 5e9}
ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_sweep_smoke_two_ranks(tmp_path, capfd):
    """Tiny sweep on 2 ranks: every row checked (#wrong 0), the built-in beside it, outputs written."""
    out = tmp_path / "out"
    sweep.main(["-b", "1K", "-e", "4K", "-f", "4", "--world-size", "2",
                "--collective", "all_reduce,all_gather,broadcast", "-n", "2", "-w", "1", "--batch", "1",
                "--model", "--out", str(out), "--timeout", "60"])
    printed = capfd.readouterr().out
    data = json.loads((out / "results.json").read_text())
    rows = data["rows"]
    for collective in ("all_reduce", "all_gather", "broadcast"):
        labels = {r["algorithm"] for r in rows if r["collective"] == collective}
        assert labels == set(ALGORITHMS[collective]) | {"builtin", "default", sweep.SELF}
    assert {r["size"] for r in rows} == {1024, 4096}
    assert all(r["wrong"] == 0 for r in rows)
    base = {(r["collective"], r["size"]): r for r in rows if r["algorithm"] == "builtin"}
    for r in rows:
        assert r["time_us"] > 0
        assert math.isclose(r["busbw_GBps"], r["algbw_GBps"] * sweep.busbw_factor(r["collective"], 2))
        # vs_bi: the median of per-round ratios, from the samples the row carries
        assert math.isclose(r["vs_builtin"], common.paired_ratio(
            r["samples_us"], base[r["collective"], r["size"]]["samples_us"]), rel_tol=1e-9)
        assert (r["default_over_best"] is not None) == (r["algorithm"] == "default")
        assert (r["self_ratio"] is not None) == (r["algorithm"] == sweep.SELF)
        assert r["redop"] == ("sum" if r["collective"] == "all_reduce" else "none")
        assert r["root"] == (0 if r["collective"] == "broadcast" else -1)
        assert r["type"] == "float"
        assert (r.get("predicted_us") is not None) == (r["algorithm"] != "builtin")
    model = data["meta"]["model"]["2"]
    assert model["alpha"] >= 0 and model["beta"] > 0
    assert (out / "p2p.csv").exists() and (out / "results.csv").exists()
    table_lines = [line for line in printed.splitlines() if line.startswith(" ") and " all_reduce " in line]
    assert len(table_lines) == 2 * (len(ALGORITHMS["all_reduce"]) + 3)
    report = (out / "report.md").read_text()
    assert "all_reduce, N=2" in report and "within the self-vs-self noise" in report
    assert (out / "all_reduce_n2.png").exists() and (out / "model_vs_measured.png").exists()


@pytest.mark.parametrize("collective", sweep.COLLECTIVES)
def test_case_counts_a_wrong_element(collective):
    """The checker counts exactly the one element that differs (world of 3, rank 0)."""
    case = sweep.Case(collective, 96, torch.float32, common.OPS["sum"], torch.device("cpu"), 0, 3)
    name, value = case.expected()

    class Fake:
        def __init__(self, off_by):
            self.off_by = off_by

        def __getattr__(self, attr):
            def run(*args, **kw):
                target = buffers[-1][name]
                values = value if isinstance(value, list) else [value]
                targets = target if isinstance(target, list) else [target]
                for t, v in zip(targets, values):
                    t.copy_(v)
                targets[-1].view(-1)[-1] += self.off_by
            return run
    buffers = []
    original = case.buffers
    case.buffers = lambda encoded: buffers.append(original(encoded)) or buffers[-1]
    assert case.wrong(Fake(0)) == 0
    assert case.wrong(Fake(1)) == 1


def test_busbw_factors_match_nccl_tests():
    assert sweep.busbw_factor("all_reduce", 4) == 1.5
    assert sweep.busbw_factor("all_gather", 4) == 0.75
    assert sweep.busbw_factor("reduce_scatter", 8) == 7 / 8
    assert sweep.busbw_factor("broadcast", 4) == sweep.busbw_factor("reduce", 4) == 1.0


def test_flags_mean_what_they_mean_in_nccl_tests(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    args = sweep.parse_args(["-b", "4K", "-e", "64K", "-f", "4", "-n", "7", "-w", "3", "-c", "0",
                             "-o", "max", "-d", "half"])
    assert args.sizes == [4096, 16384, 65536]
    assert (args.iters, args.warmup_iters, args.check, args.op, args.datatype) == (7, 3, 0, "max", "half")
    assert common.DTYPES[args.datatype] is torch.float16
    args = sweep.parse_args(["-b", "1M", "-e", "3M", "-f", "1", "-i", "1M"])
    assert args.sizes == [1 << 20, 2 << 20, 3 << 20]
    args = sweep.parse_args(["--collective", "all", "--algorithm", "ring,builtin", "--world-size", "2,4"])
    assert args.collective == list(sweep.COLLECTIVES)
    assert args.algorithm == ["ring", "builtin"] and args.world_size == [2, 4]
    assert sweep.parse_args([]).world_size == [2]


@pytest.mark.parametrize("argv", [["-b", "64K", "-e", "4K"], ["-b", "1M", "-e", "2M", "-f", "1", "-i", "0"],
                                  ["-b", "4X"], ["-o", "xor"], ["-d", "complex"], ["-c", "2"],
                                  ["--collective", "allreduce"], ["--algorithm", "rign"],
                                  ["--world-size", "0"], ["--world-size", "two"], ["-n", "0"]])
def test_bad_flags_are_refused(argv, monkeypatch, capsys):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(SystemExit) as exc:
        sweep.parse_args(argv)
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_world_size_comes_from_torchrun(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert sweep.parse_args([]).world_size == [3]
    assert sweep.parse_args(["--world-size", "3"]).world_size == [3]
    with pytest.raises(SystemExit, match="torchrun started 3"):
        sweep.parse_args(["--world-size", "2,4"])
    assert not common.is_rank0()


def test_sizes_and_human():
    assert [common.parse_size(x) for x in ("4", "4K", "4KB", "1.5K", "64M", "1G")] == \
        [4, 4096, 4096, 1536, 64 << 20, 1 << 30]
    assert common.sizes(4096, 4096, 4) == [4096]
    assert common.human(4096) == "4K" and common.human(3 << 20) == "3M" and common.human(1000) == "1000"


def test_the_library_never_imports_benchmarks():
    """benchmarks/ imports collectives, never the other way round (read from the source, by AST)."""
    offenders = []
    for path in sorted((ROOT / "collectives").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            offenders += [f"{path.relative_to(ROOT)}:{node.lineno}" for n in names
                          if n == "benchmarks" or n.startswith("benchmarks.")]
    assert offenders == []
    assert not list((ROOT / "collectives").glob("bench*.py")), "benchmarks live in benchmarks/"


def test_fit_recovers_alpha_and_beta():
    rows = [{"size": s, "pingpong_oneway_us": 1e6 * (20e-6 + s / 2e9),
             "ring_exchange_us": 1e6 * (30e-6 + s / 1e9), "reduce_us": 1e6 * s / 4e9}
            for s in (4, 1024, 65536, 1 << 20, 16 << 20)]
    p = cost_model.fit(rows)
    assert math.isclose(p["alpha"], 20e-6, rel_tol=1e-6)
    assert math.isclose(1 / p["beta"], 2e9, rel_tol=1e-6)
    assert math.isclose(1 / p["beta_ring"], 1e9, rel_tol=1e-6)
    assert math.isclose(1 / p["gamma"], 4e9, rel_tol=1e-3)


def test_a_fit_without_a_slope_leaves_the_floor_and_every_report_says_so():
    # one size only: no line through the points (the determinant is 0); the slope must still be
    # the floor, so that 1 / beta exists (a calibrated topology's bandwidth is 1 / beta)
    a, b = cost_model.fit_line([4096, 4096, 4096], [30e-6, 20e-6, 25e-6])
    assert b == cost_model.NO_BETA and a > 0
    # timings that do not grow with size: the slope is clamped at the floor
    assert cost_model.fit_line([4096, 1 << 20, 8 << 20], [90e-6, 40e-6, 41e-6])[1] == cost_model.NO_BETA
    assert cost_model.rate(cost_model.NO_BETA) == "none fitted (no slope in these timings)"
    assert cost_model.rate(1 / 2.5e9) == "2.500 GB/s"
    assert cost_model.rate(1 / 2.5e9, digits=1) == "2.5 GB/s"
    from benchmarks import pingpong, sim_calibrate
    dropped = {"alpha": 20e-6, "beta": cost_model.NO_BETA, "alpha_ring": 30e-6, "beta_ring": 1e-9,
               "gamma": cost_model.NO_BETA}
    # each line names every dropped figure it reports (the calibration's reports no gamma)
    for line, dropped_shown, kept in ((pingpong.fit_line_text(4, dropped), 2, "1.000 GB/s"),
                                      (sim_calibrate.fit_text(4, dropped), 1, "1.00 GB/s"),
                                      (sweep.model_text({4: dropped}), 2, None)):
        assert "1000000" not in line and line.count("none fitted") == dropped_shown, line
        assert kept is None or kept in line, line


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
    monkeypatch.setattr(tuning.tables, "shipped", lambda: json.loads(path.read_text()))
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


def test_a_table_measured_here_replaces_the_packaged_one(tmp_path, monkeypatch):
    # a table written for this machine, then COLLECTIVES_TUNING_TABLE=FILE
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"choices": {"all_reduce": {"2": [[4096, "naive_ring"], [1 << 20, "ring"]]}}}))
    try:
        monkeypatch.setenv("COLLECTIVES_TUNING_TABLE", str(path))
        tuning.reload()
        tuning.choose.cache_clear()
        assert tuning.choose("all_reduce", 4096, 2) == "naive_ring"
        assert tuning.choose("all_reduce", 1 << 20, 2) == "ring"
        monkeypatch.setenv("COLLECTIVES_TUNING_TABLE", str(tmp_path / "typo.json"))
        tuning.reload()
        tuning.choose.cache_clear()
        with pytest.raises(ValueError, match=r"COLLECTIVES_TUNING_TABLE=.*typo\.json: cannot read"):
            tuning.choose("all_reduce", 4096, 2)
    finally:
        monkeypatch.delenv("COLLECTIVES_TUNING_TABLE")
        tuning.reload()
        tuning.choose.cache_clear()
    assert tuning.table_path() == tuning.TABLE_PATH


def test_call_overhead_prints_every_layer_for_every_batch(capfd, tmp_path):
    """The call-cost benchmark runs every row at each batch size and restores the API's door."""
    from benchmarks import call_overhead
    from collectives import call
    from collectives.p2p_communications import Comm
    call_overhead.main(["--world-size", "3", "-n", "2", "-w", "1", "--batch", "1,2", "--out", str(tmp_path)])
    out = capfd.readouterr().out
    rows = ("built-in", "api", "algorithm", "exchange, door", "exchange, torch",
            "exchange, torch + 100 us CPU", "api, no network")
    for batch in (1, 2):
        assert f"N=3, algorithm=tree, {batch} call(s) back to back" in out
    for row in rows:
        assert sum(line.strip().startswith(row + "  ") for line in out.splitlines()) == 2, row
    assert call.Comm is Comm
    assert len(json.loads((tmp_path / "results.json").read_text())["rows"]) == 2 * len(rows)


def test_thread_cpu_charges_the_calling_thread():
    """benchmarks.cpu's per-thread clock sees 100 ms of busy work in the calling thread."""
    from benchmarks.cpu import ROLES, thread_cpu
    before = thread_cpu()
    # 100 ms of this thread's CPU (not of wall time: on a loaded machine it gets a fraction of it).
    end = time.thread_time() + 0.1
    while time.thread_time() < end:
        pass
    after = thread_cpu()
    assert set(after) == set(ROLES)
    assert sum(after["calling"]) - sum(before["calling"]) >= 0.05


def test_cpu_prints_a_row_per_candidate(capfd, tmp_path):
    """The per-thread CPU benchmark runs the built-in and each named algorithm and prints them."""
    from benchmarks import cpu as bench_cpu
    bench_cpu.main(["--world-size", "2", "-b", "4K", "--algorithm", "ring,tree", "--rounds", "1", "-n", "3",
                    "-w", "1", "--out", str(tmp_path)])
    out = capfd.readouterr().out
    assert "all_reduce 4096 B float32, N=2, gloo, 1 rounds x 3 calls" in out
    for name in ("built-in", "ring", "tree"):
        line = next(line for line in out.splitlines() if line.strip().startswith(name + " "))
        cells = line.split()
        assert float(cells[1]) > 0                                   # wall ms per call
        assert len(cells) == 2 + len(bench_cpu.ROLES) + 2            # roles, total, ratio
        assert all(float(x) >= 0 for c in cells[2:2 + len(bench_cpu.ROLES)] for x in c.split("+"))


def test_peak_extra_sees_a_short_lived_buffer():
    """benchmarks.memory's measure: a 32 MiB temporary freed before the call returns still counts."""
    from benchmarks import memory
    assert memory.exact_malloc()
    x = torch.ones(1 << 20)
    (x.repeat(8) + 1).sum()          # the first call also faults in torch's code pages: warm up
    extra = memory.peak_extra(lambda: (x.repeat(8) + 1).sum())      # two 32 MiB temporaries at once
    assert 63 << 20 <= extra <= 66 << 20
    assert memory.peak_extra(lambda: None) < 1 << 20
    # Freed blocks go back to the kernel, so a second identical call counts them again.
    assert memory.peak_extra(lambda: (x.repeat(8) + 1).sum()) >= 63 << 20


def test_memory_table_has_every_candidate(tmp_path, capfd):
    from benchmarks import memory
    memory.main(["-b", "1M", "--world-size", "2", "-n", "1", "-w", "1", "--algorithm", "builtin,ring,default",
                 "--out", str(tmp_path)])
    out = capfd.readouterr().out
    assert "all_reduce 1M float, N=2: extra peak resident memory per rank" in out
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert [r["algorithm"] for r in rows] == ["builtin", "ring", "default"]
    assert rows[2]["chosen"] in ALGORITHMS["all_reduce"]
    for r in rows:
        assert 0 <= r["least_rank_MiB"] <= r["extra_peak_MiB"] < 64
        assert math.isclose(r["extra_peak_over_S"], r["extra_peak_MiB"] / 1.0)


def test_desync_cost_times_both_sides(tmp_path, capfd):
    from benchmarks import desync_cost
    desync_cost.main(["-b", "4K", "--world-size", "2", "-n", "2", "-w", "1", "--batch", "1",
                      "--algorithm", "ring,default", "--debug", "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert [(r["world_size"], r["algorithm"]) for r in rows] == [(2, "ring"), (2, "default")]
    for r in rows:
        assert r["tags_on_us"] > 0 and r["tags_off_us"] > 0 and r["builtin_us"] > 0
        assert r["on_over_off"] > 0 and r["debug_over_on"] > 0
    assert "worst on/off" in capfd.readouterr().out


def test_paired_ratio_is_the_median_of_per_round_ratios():
    # each round: 1.1, 1.1, 1.5 (the last ran alone under load); the ratio of the medians is 1.2
    a, b = [1.1, 9.9, 1.2], [1.0, 9.0, 0.8]
    assert math.isclose(common.paired_ratio(a, b), 1.1)


def test_call_tags_switch_patches_the_door_and_restores_it():
    from benchmarks import desync_cost
    from collectives.p2p_communications import Comm
    original = Comm.tag
    with desync_cost.call_tags(False):
        assert Comm.tag(None, 5, 1024) == 5          # by step only
    assert Comm.tag is original


def test_ddp_backend_prints_a_ratio_per_world_size(capfd, monkeypatch):
    """benchmarks.ddp_backend takes the flags every benchmark takes (``--world-size 2,4``, -n, -w)."""
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    from benchmarks import ddp_backend
    ddp_backend.main(["--world-size", "2", "-n", "2", "-w", "1", "--steps", "1", "--batch-size", "4"])
    rows = [line.split() for line in capfd.readouterr().out.splitlines() if not line.startswith("#")]
    assert len(rows) == 1 and rows[0][:2] == ["2", "4"], rows
    assert all(float(x) > 0 for x in rows[0][2:])


def test_data_parallel_puts_the_two_doors_and_the_floor_side_by_side(capfd, monkeypatch, tmp_path):
    """benchmarks.data_parallel times our DataParallel on each door and the net with no averaging,
    and prints the step over the gloo door against each (README's main job with --transport gloo)."""
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    from benchmarks import data_parallel
    rows = data_parallel.main(["--world-size", "2", "--rounds", "2", "-n", "1", "-w", "1", "--batch-size", "4",
                               "--out", str(tmp_path)])
    out = capfd.readouterr().out
    names = [r["variant"] for r in rows]
    assert data_parallel.OURS_GLOO in names and data_parallel.FLOOR in names, names
    speedup = rows[-1]
    assert speedup["default"] > 0 and speedup["no_communication"] > 0, speedup
    assert "on the gloo door over its step with the default transport" in out, out


def test_cliff_counts_a_short_spin_of_the_running_thread():
    """benchmarks.cliff reads a thread's CPU to the nanosecond, the slice it is running now
    included: schedstat's first field moves only at a tick or a switch, so a caller that spun
    through a short run without yielding read 0 on CI."""
    if not os.path.isdir("/proc/self/task"):
        pytest.skip("per-thread CPU clocks are read the Linux way")
    from benchmarks import cliff
    me = [threading.get_native_id()]
    for _ in range(20):
        before = cliff._on_cpu_ns(me)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 200e-6:
            pass
        assert cliff._on_cpu_ns(me) - before >= 100_000


def test_cliff_times_each_candidate_under_both_policies(tmp_path, capfd):
    """benchmarks.cliff: every (policy, candidate) timed with its socket-thread CPU; the door's
    policy (SCHED_BATCH) is back on the threads afterwards."""
    import os
    if not hasattr(os, "SCHED_BATCH"):
        pytest.skip("SCHED_BATCH is Linux's")
    from benchmarks import cliff
    cliff.main(["--world-size", "2", "-b", "4K", "-e", "4K", "-n", "2", "-w", "1", "--rounds", "2",
                "--out", str(tmp_path)])
    printed = capfd.readouterr().out
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert {(r["policy"], r["candidate"]) for r in rows} == {
        (p, c) for p in cliff.POLICIES for c in ("1 exchange, torch", "2 exchanges, torch", "built-in", "ring")}
    for r in rows:
        assert r["median_us"] > 0 and 0 <= r["stalled"] <= 1
        assert r["io_cpu_us"] >= 0 and r["caller_cpu_us"] > 0
    assert printed.count("as torch made them") == 4 and "calls >2ms" in printed
