"""The browser lab's pages from real runs (``record.record_real``, ``python -m collectives.viz --real``).

A real run (gloo processes, the real door) of an unchanged algorithm must move exactly the
messages the simulator's run moves: same source, destination, step, bytes, cells and
provenance carried; only the times differ (measured, not modelled). Each case starts one small
world with a hard timeout; no browser is needed.
"""
import json
import re

import pytest

from collectives.viz import cli, model, record

TIMEOUT = 120.0


def shape(m):
    """A message without its times and links (the real run's links are one host's)."""
    return (m["src"], m["dst"], m["step"], m["nbytes"], tuple(m["values"]), m["src_cell"], m["dst_cell"], m["cells"])


@pytest.mark.parametrize("algorithm", ["ring", "recursive_doubling"])
@pytest.mark.parametrize("n", [2, 3, 4])
def test_a_real_run_moves_the_simulated_runs_messages(algorithm, n):
    real = record.record_real("all_reduce", algorithm, n, timeout=TIMEOUT)
    sim = record.record("all_reduce", algorithm, n)
    assert sorted(map(shape, real["messages"])) == sorted(map(shape, sim["messages"]))
    assert len(real["messages"]) > 0
    for r in range(n):
        assert len(real["final"][r]) == n       # all_reduce's input has N elements
        for v in real["final"][r]:
            assert record.decode(v, real["mode"], n) == {q: 1 for q in range(n)}, (r, hex(v))
    assert real["notes"] == []
    for m in real["messages"]:
        assert 0 <= m["start"] <= m["end"] <= real["time"]
    # every post's buffers, as the simulator saw them at the same step
    for r in range(n):
        assert [(s, v) for _, s, v in real["snapshots"][r]] == [(s, v) for _, s, v in sim["snapshots"][r]]


@pytest.mark.parametrize("collective", ["broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all",
                                        "gather", "scatter"])
def test_every_collective_moves_the_same_messages_for_real(collective):
    from collectives.algorithms import REGISTRY
    algorithm = next(iter(REGISTRY[collective]))
    real = record.record_real(collective, algorithm, 3, root=1, timeout=TIMEOUT)
    sim = record.record(collective, algorithm, 3, root=1)
    assert sorted(map(shape, real["messages"])) == sorted(map(shape, sim["messages"]))
    assert real["final"] == sim["final"]
    for r in range(3):      # every cell holds what the collective promises, each rank once
        for v, want in zip(real["final"][r], real["want"][r]):
            if want is not None:
                assert record.decode(v, "nibbles", 3) == {q: 1 for q in want}


def test_a_world_of_one_sends_nothing_and_keeps_its_own_contribution():
    real = record.record_real("all_reduce", "ring", 1, timeout=TIMEOUT)
    assert real["messages"] == []
    assert [record.decode(v, "nibbles", 1) for v in real["final"][0]] == [{0: 1}]


def test_the_page_of_a_real_run_counts_its_messages_and_says_its_clock_is_measured(tmp_path, capsys):
    path = tmp_path / "real.html"
    assert cli.main(["all_reduce", "ring", "-n", "3", "--real", "-o", str(path)]) == 0
    text = path.read_text()
    d = json.loads(re.search(r'<script id="data" type="application/json">(.*?)</script>', text, re.S).group(1)
                   .replace("<\\/", "</"))
    assert d["clock"] == "measured" and "measured" in d["topology"]["text"]
    sim = model.build(record.record("all_reduce", "ring", 3))
    assert sorted(m[:4] + m[6:10] for m in d["msgs"]) == sorted(m[:4] + m[6:10] for m in sim["msgs"])
    assert not any("microseconds" in q["ask"] for q in d["questions"])   # a measured time is not a prediction
    assert d["wrong"] is None and d["failure"] is None


def test_bad_input_to_a_real_run_is_refused_before_any_process_starts(capsys):
    with pytest.raises(record.TooLarge, match="at most 15"):
        record.record_real("all_reduce", "ring", 16)
    with pytest.raises(ValueError, match="registered algorithms only"):
        record.record_real("all_reduce", lambda comm, t, op: None, 2)
    with pytest.raises(ValueError, match="whole number"):
        record.record_real("all_reduce", "ring", 0)
    with pytest.raises(ValueError, match="unknown"):
        record.record_real("all_reduce", "no_such_algorithm", 2)
    assert cli.main(["all_reduce", "--function", "x.py:f", "--real", "-n", "2"]) == 2
    assert cli.main(["pipeline", "--real", "-n", "2"]) == 2
    assert "--real" in capsys.readouterr().err


def test_a_browser_shows_a_real_runs_own_counts_and_a_measured_clock(tmp_path):
    from tests.test_viz_browser import BROWSER, chromium, table
    if BROWSER is None:
        pytest.skip("no Chromium (apt-get install chromium)")
    from collectives.viz import render
    n = 4
    rec = record.record_real("all_reduce", "recursive_doubling", n, timeout=TIMEOUT)
    d = model.build(rec)
    path = render.write(d, tmp_path / "real.html")
    last = len(d["steps"])
    dom = chromium("--dump-dom", f"file://{path}#frame={last}")
    assert f'data-frame="{last}"' in dom
    # each rank's count_traffic, counted in its own process during the real run
    assert [[int(x) for x in row[1:]] for row in table(dom, "counters")] == rec["traffic"]
    assert "Measured time" in dom
