"""Stragglers, late ranks, jitter and progress in the simulator (``collectives/sim/world.py``,
``collectives/sim/cli.py``).

The closed forms use the ``ethernet-100g`` preset's own figures (alpha, overhead, bandwidth,
gamma) on 2 ranks, where recursive doubling is one message each way and one reduction: each
rank posts its send and its receive at once, o each, so a message starts 2 o after the call;
a rank of factor F makes that 2 F o, its message's latency F alpha and its reduction F gamma S,
a late rank adds its delay, and jitter adds the larger of the two messages' draws, which the test draws itself
from the same ``random.Random(seed)``.
"""
import io
import json
import random
import re

import pytest
import torch

from collectives import count_traffic
from collectives.sim import simulate, topology
from collectives.sim import cli

S = 4096
PRESET = topology.load("ethernet-100g")
ALPHA, BETA, GAMMA = PRESET["alpha"], 1 / PRESET["bandwidth"], PRESET["gamma"]
POST = 2 * PRESET["overhead"]          # a rank's two ends (send, receive) posted, o each


def times(result):
    return [r["time"] for r in result.ranks]


@pytest.mark.parametrize("algorithm, n", [("ring", 5), ("tree", 7), ("recursive_doubling", 1)])
def test_factor_one_delay_zero_and_jitter_zero_change_nothing(algorithm, n):
    base = simulate("all_reduce", algorithm, n, S, "h100-cluster")
    for kw in (dict(stragglers={n - 1: 1}), dict(stragglers={0: 1.0}, delays={n - 1: 0.0}),
               dict(jitter=0.0, seed=5)):
        same = simulate("all_reduce", algorithm, n, S, "h100-cluster", **kw)
        assert same.time == base.time and times(same) == times(base)


@pytest.mark.parametrize("factor", [2.0, 3.5, 0.5])
@pytest.mark.parametrize("slow", [0, 1])
def test_a_slow_rank_on_two_ranks_costs_its_factor_of_latency_and_reduction(slow, factor):
    t = simulate("all_reduce", "recursive_doubling", 2, S, "ethernet-100g", stragglers={slow: factor}).time
    assert t == pytest.approx(max(factor, 1) * (POST + ALPHA) + S * BETA + max(factor, 1) * GAMMA * S, rel=1e-12)
    assert simulate("all_reduce", "recursive_doubling", 2, S, "ethernet-100g").time == \
        pytest.approx(POST + ALPHA + S * BETA + GAMMA * S, rel=1e-12)


def test_a_late_rank_delays_the_call_by_its_delay_every_call():
    d = 7e-6
    one = simulate("all_reduce", "recursive_doubling", 2, S, "ethernet-100g", delays={1: d})
    assert one.time == pytest.approx(d + POST + ALPHA + S * BETA + GAMMA * S, rel=1e-12)
    # time is per call: each of 3 calls waits d for the late rank
    three = simulate("all_reduce", "recursive_doubling", 2, S, "ethernet-100g", delays={1: d}, calls=3)
    assert three.time == pytest.approx(one.time, rel=1e-12)


def test_jitter_is_each_messages_exponential_draw_from_the_seed():
    j = 3e-6
    for seed in (0, 1, 12345):
        rng = random.Random(seed)
        x = [rng.expovariate(1 / j) for _ in range(2)]          # one per message, as they meet
        t = simulate("all_reduce", "recursive_doubling", 2, S, "ethernet-100g", jitter=j, seed=seed).time
        assert t == pytest.approx(POST + ALPHA + max(x) + S * BETA + GAMMA * S, rel=1e-12)


def test_the_same_seed_gives_the_same_times_and_another_seed_others():
    run = lambda seed: simulate("all_reduce", "ring", 6, S, "ethernet-100g", jitter=2e-6, seed=seed)  # noqa: E731
    a, b, c = run(3), run(3), run(4)
    assert times(a) == times(b)
    assert times(a) != times(c)
    assert a.time > simulate("all_reduce", "ring", 6, S, "ethernet-100g").time


def test_one_slow_rank_slows_every_step_of_a_ring_and_one_leaf_of_a_tree():
    """The point of stragglers: a ring's 2(N-1) steps each wait for the slow rank, a binomial
    tree waits for it only where it is on the path (rank 1 is a leaf's first hop)."""
    n = 16
    base = {a: simulate("all_reduce", a, n, S, "ethernet-100g").time for a in ("ring", "tree")}
    slow = {a: simulate("all_reduce", a, n, S, "ethernet-100g", stragglers={1: 2.0}).time for a in base}
    assert slow["ring"] - base["ring"] > 5 * (slow["tree"] - base["tree"]) > 0


@pytest.mark.parametrize("kw, match", [
    (dict(stragglers={4: 2.0}), r"rank 4 is not a rank of 0\.\.3"),
    (dict(stragglers={-1: 2.0}), r"rank -1 is not a rank"),
    (dict(stragglers={1: -2.0}), r"not a slowdown factor > 0"),
    (dict(stragglers={1: 0}), r"not a slowdown factor > 0"),
    (dict(stragglers={True: 2.0}), r"rank True is not a rank"),
    (dict(stragglers=[1, 2.0]), r"stragglers must be a dict"),
    (dict(delays={1: -1e-6}), r"not a delay in seconds >= 0"),
    (dict(delays={1: float("nan")}), r"not a delay in seconds >= 0"),
    (dict(jitter=-1e-6), r"jitter must be seconds >= 0"),
    (dict(jitter="1us"), r"jitter must be seconds >= 0"),
    (dict(seed=1.5), r"seed must be a whole number"),
])
def test_bad_noise_raises_before_any_rank_runs(kw, match):
    ran = []

    def fn(comm, tensor, op):
        ran.append(comm.rank)

    with pytest.raises(ValueError, match=match):
        simulate("all_reduce", fn, 4, S, "ethernet-100g", **kw)
    assert ran == []


def test_the_command_line_takes_stragglers_and_jitter_and_refuses_bad_ones(capsys, tmp_path):
    path = str(tmp_path / "rows.json")
    argv = ["--algorithm", "ring", "--world-size", "4", "-b", "4K", "-e", "4K", "--json", path]
    rows = []
    for extra in ([], ["--straggler", "1:2"], ["--straggler", "1:+0.001"], ["--jitter", "1e-6", "--seed", "2"]):
        assert cli.main(argv + extra) == 0
        with open(path) as f:
            rows.append(json.load(f)[0]["time_us"] * 1e-6)
    want = [simulate("all_reduce", "ring", 4, 4096, "ethernet-100g", **kw).time
            for kw in ({}, dict(stragglers={1: 2.0}), dict(delays={1: 1e-3}), dict(jitter=1e-6, seed=2))]
    assert rows == pytest.approx(want, rel=1e-9)
    capsys.readouterr()
    assert cli.main(["--world-size", "4,8", "--straggler", "5:2"]) == 2
    assert "--straggler names rank 5, but --world-size 4 has ranks 0..3" in capsys.readouterr().err
    for bad in (["--straggler", "1:-2"], ["--straggler", "1"], ["--straggler", "1:+-3"], ["--jitter", "-1"]):
        with pytest.raises(SystemExit) as exc:
            cli.main(["--world-size", "4"] + bad)
        assert exc.value.code == 2
        assert "--straggler" in capsys.readouterr().err or bad[0] == "--jitter"


def test_a_world_reports_its_progress_every_thousand_events():
    n, seen = 32, []
    simulate("all_reduce", "ring", n, S, "ethernet-100g", progress=lambda *a: seen.append(a))
    assert seen, "2 N (N-1) = 1,984 messages take more than 1,024 events"
    assert all(w == n and 0 <= f <= n for _, f, w in seen)
    done = [m for m, _, _ in seen]
    assert done == sorted(done)
    assert seen[-1] == (2 * n * (n - 1), n, n), "the last word: every message, every rank"


ARGV = ["--algorithm", "ring,tree", "--world-size", "2,16", "-b", "1K", "-e", "4K"]


def test_progress_on_stderr_for_a_long_run_and_none_for_a_short_one(capsys):
    assert cli.main(ARGV, progress_after=0.0, progress_every=0.0) == 0
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert len(lines) >= 8 and "\r" not in err           # not a terminal: plain lines
    assert lines[0].startswith("collectives.sim: point 1 of 8, all_reduce/ring, 2 ranks, 1K: ")
    assert any(line.startswith("collectives.sim: point 8 of 8, all_reduce/tree, 16 ranks, 4K: ") for line in lines)
    assert "messages 0 of " in err and "at most" not in err and "ranks finished" in err
    assert "progress" not in out and "point 1" not in out
    assert cli.main(ARGV) == 0                                      # under 2 s: nothing
    short_out, short_err = capsys.readouterr()
    assert short_err == "" and short_out == out
    assert cli.main(ARGV + ["--quiet"], progress_after=0.0, progress_every=0.0) == 0
    assert capsys.readouterr().err == ""


def test_on_a_terminal_progress_is_one_line_rewritten_in_place():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    stream = Tty()
    p = cli.Progress(stream, 2, after=0.0, every=0.0)
    p.point("all_reduce/ring, 8 ranks, 4K", 8, lambda: 112)
    p.tick(10, 0, 8)
    p.clear()
    text = stream.getvalue()
    assert text.count("\r") == 3 and "\n" not in text and text.endswith("\r\x1b[K")
    assert "point 1 of 2, all_reduce/ring, 8 ranks, 4K: messages 10 of 112, 0/8 ranks finished" in text
    quiet = Tty()
    cli.Progress(quiet, 2, after=60.0).point("x", 8)            # before `after`: nothing
    assert quiet.getvalue() == ""


@pytest.mark.parametrize("collective, algorithm, n", [
    ("all_reduce", "ring", 5), ("all_to_all", "linear", 3), ("all_reduce", "ring", 1),
    ("all_reduce", "tree", 6), ("broadcast", "linear", 4), ("gather", "binomial_tree", 7)])
def test_progress_says_how_many_messages_a_point_sends(capsys, tmp_path, collective, algorithm, n):
    """The last line of a point counts every message it sent, counted apart here by
    ``count_traffic``, of the total cost() states (``total_messages``): the same count, where
    the ranks send alike (a ring) and where they do not (a tree, a linear root)."""
    argv = ["--collective", collective, "--algorithm", algorithm, "--world-size", str(n), "-b", "4K", "-e", "4K"]
    with count_traffic() as traffic:
        assert cli.main(argv, progress_after=0.0, progress_every=0.0) == 0
    last = capsys.readouterr().err.splitlines()[-1]
    done, total = (int(x.replace(",", "")) for x in re.search(r"messages ([\d,]+) of ([\d,]+),", last).groups())
    assert done == traffic.sent_messages and f"{n}/{n} ranks finished" in last
    assert total == done
    with count_traffic() as again:        # a learner's function has no cost(): the count alone
        mine = tmp_path / "mine.py"
        mine.write_text(f"from collectives.algorithms.{collective}_{algorithm} import {collective}\n")
        assert cli.main(argv[:2] + ["--function", str(mine)] + argv[4:], progress_after=0.0, progress_every=0.0) == 0
    last = capsys.readouterr().err.splitlines()[-1]
    assert f": {again.sent_messages:,} messages done, {n}/{n} ranks finished" in last


def swap(comm, tensor, op):
    """One message each way between ranks 0 and 1, nothing else: the time is one message's."""
    other = torch.empty_like(tensor)
    comm.sendrecv(tensor, 1 - comm.rank, other, 1 - comm.rank, 0)


@pytest.mark.parametrize("preset, latency, bandwidth", [
    ("ethernet-100g", "alpha", "bandwidth"), ("h100-cluster", "intra_alpha", "intra_bandwidth"),
    ("torus-2x1", "alpha+hop", "bandwidth")])
@pytest.mark.parametrize("factor", [1.0, 4.0, 2.5])
@pytest.mark.parametrize("slow", [0, 1])
def test_a_slow_link_divides_the_bandwidth_of_a_message_and_not_its_latency(preset, latency, bandwidth,
                                                                           factor, slow):
    spec = topology.load(preset)
    alpha = sum(spec[k] for k in latency.split("+"))
    t = simulate("all_reduce", swap, 2, S, preset, slow_links={slow: factor}).time
    # each rank posts its send and its receive, o each (inside an h100 node the NVLink o,
    # intra_overhead): the message starts 2 o after the call
    o = spec.get("intra_overhead", spec["overhead"]) if latency == "intra_alpha" else spec["overhead"]
    assert t == pytest.approx(2 * o + alpha + S * factor / spec[bandwidth], rel=1e-12)


@pytest.mark.parametrize("algorithm, n, preset", [("ring", 5, "h100-cluster"), ("tree", 7, "fat-tree"),
                                                   ("recursive_doubling", 4, "torus-2x2")])
def test_a_slow_link_of_factor_one_changes_nothing(algorithm, n, preset):
    base = simulate("all_reduce", algorithm, n, 1 << 20, preset)
    same = simulate("all_reduce", algorithm, n, 1 << 20, preset, slow_links={n - 1: 1.0, 0: 1})
    assert same.time == base.time and times(same) == times(base)
    slower = simulate("all_reduce", algorithm, n, 1 << 20, preset, slow_links={n - 1: 2.0})
    assert slower.time > base.time


def test_a_slow_link_slows_bytes_where_a_straggler_slows_messages():
    """At 4 KiB a ring's time is its 2(N-1) latencies: a straggler of factor 4 on one rank
    multiplies them, a NIC 4x slower hardly shows; at 16 MiB it is the bytes, the other way round
    (the straggler still multiplies its o, 3 us a message on this preset: 1.28x, the NIC 3.7x)."""
    n, f = 8, 4.0
    base = {s: simulate("all_reduce", "ring", n, s, "ethernet-100g").time for s in (S, 16 << 20)}
    nic = {s: simulate("all_reduce", "ring", n, s, "ethernet-100g", slow_links={3: f}).time for s in base}
    host = {s: simulate("all_reduce", "ring", n, s, "ethernet-100g", stragglers={3: f}).time for s in base}
    assert nic[S] / base[S] < 1.2 < 2 < host[S] / base[S]
    assert host[16 << 20] / base[16 << 20] < 1.5 < 2 < nic[16 << 20] / base[16 << 20]


@pytest.mark.parametrize("kw, match", [
    (dict(slow_links={4: 2.0}), r"slow_links: rank 4 is not a rank of 0\.\.3"),
    (dict(slow_links={1: 0.5}), r"slow_links: rank 1's 0.5 is not a bandwidth divisor >= 1"),
    (dict(slow_links={1: float("inf")}), r"rank 1's inf is not a bandwidth divisor >= 1"),
    (dict(slow_links={1: float("nan")}), r"rank 1's nan is not a bandwidth divisor >= 1"),
    (dict(slow_links={1: "2"}), r"rank 1's '2' is not a bandwidth divisor"),
    (dict(slow_links=[(1, 2.0)]), r"slow_links must be a dict"),
])
def test_a_bad_slow_link_raises_before_any_rank_runs(kw, match):
    test_bad_noise_raises_before_any_rank_runs(kw, match)


def test_the_command_line_takes_slow_links_and_refuses_bad_ones(capsys, tmp_path):
    path = str(tmp_path / "rows.json")
    argv = ["--algorithm", "ring", "--world-size", "4", "-b", "1M", "-e", "1M", "--json", path]
    assert cli.main(argv + ["--slow-link", "1:4", "--slow-link", "2:2"]) == 0
    with open(path) as f:
        got = json.load(f)[0]["time_us"] * 1e-6
    assert got == pytest.approx(simulate("all_reduce", "ring", 4, 1 << 20, "ethernet-100g",
                                         slow_links={1: 4.0, 2: 2.0}).time, rel=1e-9)
    capsys.readouterr()
    assert cli.main(["--world-size", "4,8", "--slow-link", "5:2"]) == 2
    assert "--slow-link names rank 5, but --world-size 4 has ranks 0..3" in capsys.readouterr().err
    for bad in (["--slow-link", "1:0.5"], ["--slow-link", "1"], ["--slow-link", "1:inf"], ["--slow-link", "-1:2"]):
        with pytest.raises(SystemExit) as exc:
            cli.main(["--world-size", "4"] + bad)
        assert exc.value.code == 2
        assert "--slow-link" in capsys.readouterr().err
