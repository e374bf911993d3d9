"""The simulator's model of one machine (``--topology local``): what each figure charges, and
that the calibration finds figures that play the measured programs back.

Each figure is checked alone, on a topology where everything else costs nothing, against
the time it must add by its definition (``collectives/sim/topology.py``):

* ``overhead``: CPU per message a rank posts; ``call``: CPU per collective call;
* ``host_bandwidth``: one capacity every message on the machine shares;
* ``copy`` / ``alloc``: a rank's own torch operations, by the bytes they write and the new
  memory they touch (views free, the inputs made before the call not counted, reductions
  left to gamma);
* ``switch``: a core turning from one rank to another, which never happens while every
  rank has a core of its own;
* ``python``: a rank's own code, by the host time it takes in the simulator;
* ``calls``: a batch of calls back to back, reported per call.
"""
import math

import pytest
import torch

from benchmarks import pingpong, sim_calibrate
from collectives.sim import simulate
from collectives.sim.topology import validate

S = 1 << 20
FREE = {"kind": "flat", "alpha": 0.0, "bandwidth": 1e15, "gamma": 0.0, "name": "free"}


def exchange(comm, tensor, op):
    """Every rank sends right and receives from its left: two messages per rank."""
    n, r = comm.size, comm.rank
    comm.sendrecv(tensor, (r + 1) % n, torch.empty_like(tensor), (r - 1) % n, 0)


def test_overhead_is_cpu_per_message_posted():
    t = simulate("all_reduce", exchange, 2, 4096, dict(FREE, overhead=10e-6), check=False).time
    assert t == pytest.approx(20e-6)


def test_call_is_paid_once_per_call_and_calls_report_per_call():
    spec = dict(FREE, alpha=7e-6, call=30e-6)
    one = simulate("broadcast", "linear", 2, 4096, spec).time
    assert one == pytest.approx(37e-6)
    assert simulate("broadcast", "linear", 2, 4096, spec, calls=5).time == pytest.approx(one)


def test_calls_start_from_fresh_inputs_so_results_stay_exact():
    r = simulate("all_reduce", "ring", 5, 5 * 7 * 4, "ethernet-100g", device="cpu", calls=3)
    assert r.wrong is None
    with pytest.raises(ValueError, match="calls"):
        simulate("all_reduce", "ring", 2, 64, "ethernet-100g", calls=0)


def test_host_bandwidth_is_shared_by_every_message_on_the_machine():
    spec = dict(FREE, host_bandwidth=1e9)
    alone = simulate("all_reduce", exchange, 2, S, dict(spec, host_bandwidth=1e15), check=False).time
    four = simulate("all_reduce", exchange, 4, S, spec, check=False).time
    assert alone == pytest.approx(2 * S / 1e15)            # two messages share even a fast host
    assert four == pytest.approx(4 * S / 1e9)          # four messages at once, a quarter each


def test_local_writes_and_new_memory_are_charged_by_the_bytes():
    copy, alloc = 1e-10, 3e-10
    spec = dict(FREE, copy=copy, alloc=alloc)

    def clone(comm, tensor, op):           # allocates and writes S bytes, then views for free
        y = tensor.clone()
        y.view(-1)[: y.numel() // 2]
        comm.sendrecv(y, 1 - comm.rank, tensor, 1 - comm.rank, 0)

    def copy_into(comm, tensor, op):       # writes S bytes into memory the rank had
        tensor.copy_(tensor.flip(0))       # flip allocates and writes S too
        comm.sendrecv(tensor, 1 - comm.rank, torch.empty_like(tensor), 1 - comm.rank, 0)

    for device in ("meta", "cpu"):
        got = simulate("all_reduce", clone, 2, S, spec, device=device, check=False).time
        assert got == pytest.approx((copy + alloc) * S, rel=1e-4), device
        got = simulate("all_reduce", copy_into, 2, S, spec, device=device, check=False).time
        assert got == pytest.approx((2 * copy + 2 * alloc) * S, rel=1e-4), device   # flip, empty_like: alloc


def test_reductions_are_gammas_alone_on_real_and_meta_tensors():
    spec = dict(FREE, gamma=1e-10, copy=1e-10, alloc=1e-10)
    meta = simulate("all_reduce", "recursive_doubling", 2, S, spec).time
    real = simulate("all_reduce", "recursive_doubling", 2, S, spec, device="cpu")
    assert real.wrong is None
    assert real.time == pytest.approx(meta)


def test_a_core_switches_ranks_only_when_they_share_it():
    spec = dict(FREE, cores=2, wake=10e-6)
    for algorithm in ("ring", "recursive_doubling"):
        own = simulate("all_reduce", algorithm, 2, 4096, spec).time
        assert simulate("all_reduce", algorithm, 2, 4096, dict(spec, switch=50e-6)).time == pytest.approx(own)
        shared = simulate("all_reduce", algorithm, 4, 4096, spec).time
        assert simulate("all_reduce", algorithm, 4, 4096, dict(spec, switch=50e-6)).time >= shared + 50e-6


def test_python_charges_a_ranks_own_code_by_its_host_time():
    import time

    def think_then_send(comm, tensor, op):   # 5 ms of host time before the message
        end = time.perf_counter() + 5e-3
        while time.perf_counter() < end:
            pass
        comm.sendrecv(tensor, 1 - comm.rank, torch.empty_like(tensor), 1 - comm.rank, 0)

    assert simulate("all_reduce", think_then_send, 2, 64, FREE, check=False).time < 1e-6
    t = simulate("all_reduce", think_then_send, 2, 64, dict(FREE, python=1.0), check=False).time
    assert 5e-3 <= t < 0.1
    shared = simulate("all_reduce", think_then_send, 2, 64, dict(FREE, python=1.0, cores=1), check=False).time
    assert shared >= 10e-3                   # one core: the two ranks think one after the other


@pytest.mark.parametrize("field, value", [("overhead", -1), ("call", "x"), ("switch", True),
                                          ("copy", -1e-9), ("host_bandwidth", 0)])
def test_the_machine_figures_are_validated(field, value):
    with pytest.raises(ValueError, match=field):
        validate(dict(FREE, **{field: value}))


def test_host_bandwidth_is_for_one_machine():
    with pytest.raises(ValueError, match="host_bandwidth"):
        validate({"kind": "fat_tree", "ranks_per_leaf": 4, "oversubscription": 2, "alpha": 0.0,
                  "bandwidth": 1e9, "gamma": 0.0, "host_bandwidth": 1e9})


# ---------------------------------------------------------------- the calibration

def measured(truth, cores):
    """What ``pingpong.measure`` would report on a machine that is exactly ``truth``: the
    latency fits and the API calls, as ``sim_calibrate.latencies`` reads them."""
    spec = dict(FREE, cores=cores, **truth)
    door_only = dict(spec, call=0.0)
    batch = pingpong.API_BATCH
    fits = {}
    for n in (2, 4):
        f = {"alpha": simulate("broadcast", sim_calibrate._pingpong, n, 4, door_only, calls=batch).time / 2,
             "alpha_ring": simulate("broadcast", sim_calibrate._ring_exchange, n, 4, door_only,
                                    calls=batch).time}
        for field, (collective, algorithm) in pingpong.API_CALLS.items():
            f[field] = simulate(collective, algorithm, n, 4, spec, calls=batch).time
        fits[n] = f
    return fits


def test_the_calibration_plays_a_known_machine_back():
    truth = {"alpha": 20e-6, "overhead": 10e-6, "wake": 40e-6, "call": 100e-6, "switch": 15e-6}
    fits = measured(truth, 2)
    found = sim_calibrate.latencies(fits, 2, 0.0)   # host time would make it noisy
    again = measured(found, 2)
    for n in fits:
        for field, want in fits[n].items():
            assert again[n][field] == pytest.approx(want, rel=0.03), (n, field, found)


def test_memory_rates_are_the_slopes_of_the_two_copies():
    rows = [{"size": s, "copy_us": 1 + s * 1e-4, "fresh_copy_us": 2 + s * 3e-4} for s in (1 << 10, 1 << 20, 1 << 24)]
    copy, alloc = sim_calibrate.memory_rates(rows)
    assert copy == pytest.approx(1e-10, rel=1e-6)
    assert alloc == pytest.approx(2e-10, rel=1e-6)
    assert sim_calibrate.memory_rates([]) == (0.0, 0.0)


def test_a_calibrated_spec_is_a_valid_local_topology():
    rows = []
    for n in (2, 4):
        for s in (4, 4096, 1 << 20):
            rows.append({"world_size": n, "size": s, "pingpong_oneway_us": 50 + s * 3e-4,
                         "ring_exchange_us": 50 * n + s * 6e-4, "reduce_us": 1 + s * 1e-4,
                         "copy_us": 1 + s * 1e-4, "fresh_copy_us": 1 + s * 2e-4,
                         "api_us": 200.0 * n, "api_ring_us": 300.0 * n})
    # python=0: the fit's programs without the host time of this machine's own run of them,
    # which makes each Nelder-Mead step's loss noisy and the fit slow to settle (120 s in a
    # quiet whole-suite run with it; 84 s without, with two other jobs on the two cores)
    spec = sim_calibrate.spec_from_p2p(rows, cores=2, python=0.0)
    validate(dict(spec, name="local"))
    assert spec["host_bandwidth"] >= spec["bandwidth"] / 2
    assert all(math.isfinite(spec[f]) and spec[f] >= 0 for f in sim_calibrate.LATENCY_FIELDS)
    simulate("all_reduce", "ring", 4, 1 << 20, dict(spec, name="local"))


def test_the_simulator_predicts_the_recorded_lab_run():
    """docs/benchmarks.md's run F (4 lab hosts at 1 Gbit/s, every all_reduce algorithm, 64K-64M):
    simulated with the lab's topology, median |error| at >= 1 MiB within the issue's 10%."""
    import json
    import pathlib

    from benchmarks import lab_vs_sim
    path = pathlib.Path(__file__).parent.parent / "docs" / "bench" / "lab" / "run_F_results.json"
    rows, median = lab_vs_sim.compare(json.loads(path.read_text()))
    assert len(rows) == 48
    assert median <= 0.10


# 400 cells replayed, up to 32 calls each, with max-min sharing: 335 s at falling load here,
# past pyproject's 420 s once under a heavier one
@pytest.mark.timeout(900)
def test_the_recorded_accuracy_run_is_still_predicted(capsys):
    """docs/benchmarks.md's accuracy run (N=2 and 4, 4K-64M, every algorithm of four
    collectives, measured here 2026-11-25), calibrated and simulated again by today's model,
    meets the issue's goals: median |error| <= 15%, p90 <= 35%, the fastest agreeing in >= 85%
    of the cells. Without ``python`` (the host time of the algorithms' own code), so that the
    replay is exact and does not depend on how busy the machine running the tests is; the
    benchmark itself charges it. (The first model, without the machine's figures, scored
    39% / 59% on such runs.)"""
    import json
    import pathlib

    from benchmarks import sim_accuracy
    path = pathlib.Path(__file__).parent.parent / "docs" / "bench" / "sim_accuracy_2cpu.json"
    d = json.loads(path.read_text())
    median, p90, agree, cells = sim_accuracy.report(d["rows"], d["p2p"], d["batch"], 2, d["meta"], python=0.0)
    capsys.readouterr()
    assert median <= 0.15 and p90 <= 0.35
    assert agree >= 0.85 * cells
