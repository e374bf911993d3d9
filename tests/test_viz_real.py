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
    with pytest.raises(ValueError, match="top level of a .py file"):
        record.record_real("all_reduce", lambda comm, t, op: None, 2)
    with pytest.raises(ValueError, match="whole number"):
        record.record_real("all_reduce", "ring", 0)
    with pytest.raises(ValueError, match="unknown"):
        record.record_real("all_reduce", "no_such_algorithm", 2)
    assert cli.main(["all_reduce", "--function", "no_such_file.py:f", "--real", "-n", "2"]) == 2
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


# ---- the learner's own function, for real (issue 35) ------------------------------------------

LEARNER = """
import torch


def ring(comm, tensor, op):
    n, r = comm.size, comm.rank
    right, left = (r + 1) % n, (r - 1) % n
    chunks = tensor.tensor_split(n)
    inbox = tensor.new_empty(chunks[0].numel())
    for s in range(n - 1):                  # reduce-scatter
        send_i, recv_i = (r - s - 1) % n, (r - s - 2) % n
        got = inbox[:chunks[recv_i].numel()]
        comm.sendrecv(chunks[send_i], right, got, left, s)
        op.combine(chunks[recv_i], got)
    for s in range(n - 1):                  # all-gather
        send_i, recv_i = (r - s) % n, (r - s - 1) % n
        comm.sendrecv(chunks[send_i], right, chunks[recv_i], left, n - 1 + s)


def rank_1_twice(comm, tensor, op):
    if comm.rank == 1:                      # rank 1 folds its own contribution in a second time
        op.combine(tensor, tensor.clone())
    ring(comm, tensor, op)


def everyone_twice(comm, tensor, op):
    n, r = comm.size, comm.rank
    acc, send, buf = tensor.clone(), tensor.clone(), torch.empty_like(tensor)
    for step in range(n - 1):
        comm.sendrecv(send, (r + 1) % n, buf, (r - 1) % n, step)
        op.combine(acc, buf)
        send = buf.clone()
    op.combine(acc, tensor)                 # every rank adds its own input again
    tensor.copy_(acc)


def blocking(comm, tensor, op):
    buf = torch.empty_like(tensor)
    for step in range(comm.size - 1):       # a blocking send first on every rank
        comm.send(tensor, (comm.rank + 1) % comm.size, step)
        comm.recv(buf, (comm.rank - 1) % comm.size, step)
        op.combine(tensor, buf)


def receives_first(comm, tensor, op):
    buf = torch.empty_like(tensor)
    comm.recv(buf, (comm.rank - 1) % comm.size, 0)
    comm.send(tensor, (comm.rank + 1) % comm.size, 0)
"""
HANG = 2.0      # seconds a rank waits at the door before the run is drawn as hung


@pytest.fixture
def learner(tmp_path):
    """The file of a learner's functions, loaded as --function loads it."""
    from collectives.sim.cli import load_function
    path = tmp_path / "mine.py"
    path.write_text(LEARNER)
    return lambda name: load_function(f"{path}:{name}", "all_reduce")


@pytest.mark.parametrize("n", [2, 4])
def test_a_learners_ring_run_for_real_is_its_simulated_recording(learner, n):
    fn = learner("ring")
    real = record.record_real("all_reduce", fn, n, timeout=TIMEOUT, hang=30)
    sim = record.record("all_reduce", fn, n)
    assert sorted(map(shape, real["messages"])) == sorted(map(shape, sim["messages"]))
    assert len(real["messages"]) == 2 * (n - 1) * n
    assert real["final"] == sim["final"] and real["failure"] is None and real["notes"] == []
    for r in range(n):
        assert [(s, v) for _, s, v in real["snapshots"][r]] == [(s, v) for _, s, v in sim["snapshots"][r]]
        assert real["traffic"][r][2] == 2 * (n - 1)          # its own count_traffic: sent messages
    d = model.build(real)
    assert d["wrong"] is None and d["failure"] is None and d["algorithm"] == "ring"


def test_a_wrong_learners_real_page_marks_the_simulated_pages_first_wrong_chunk(learner):
    for name in ("rank_1_twice", "everyone_twice"):
        fn = learner(name)
        real = model.build(record.record_real("all_reduce", fn, 3, timeout=TIMEOUT, hang=30))
        sim = model.build(record.record("all_reduce", fn, 3))
        assert real["wrong"] is not None and real["wrong"] == sim["wrong"], (name, real["wrong"], sim["wrong"])
        assert real["failure"] is None
    assert real["wrong"]["rank"] == 0 and "rank 0's contribution is counted 2 times" in real["wrong"]["text"]


@pytest.mark.parametrize("name,kind", [("blocking", "send-send"), ("receives_first", "recv-recv")])
def test_a_real_hang_is_drawn_as_the_simulators_deadlock(learner, name, kind):
    fn = learner(name)
    real = record.record_real("all_reduce", fn, 3, timeout=TIMEOUT, hang=HANG)
    sim = record.record("all_reduce", fn, 3)
    assert real["failure"]["kind"] == sim["failure"]["kind"] == "deadlock"
    assert real["failure"]["type"] == sim["failure"]["type"] == kind
    assert real["failure"]["cycle"] == sim["failure"]["cycle"]
    assert "a real run" in real["failure"]["report"]
    # frozen where the simulator froze: the messages finished, the buffers, the posts
    assert sorted(map(shape, real["messages"])) == sorted(map(shape, sim["messages"]))
    assert real["final"] == sim["final"]
    for r in range(3):
        assert [(s, v) for _, s, v in real["snapshots"][r]] == [(s, v) for _, s, v in sim["snapshots"][r]]
    d = model.build(real)
    assert d["failure"] == real["failure"] and d["wrong"] is None


def test_the_cli_draws_a_learners_real_hang_and_exits_3(learner, tmp_path, capsys):
    out = tmp_path / "hang.html"
    mine = tmp_path / "mine.py"
    assert cli.main(["all_reduce", "--function", f"{mine}:blocking", "-n", "2", "--real",
                     "--hang-seconds", str(HANG), "-o", str(out)]) == 3
    text = out.read_text()
    assert "send-send" in text and "a real run" in text
    assert "deadlock: 2 rank(s) wait for each other in a send-send cycle: 0 -> 1 -> 0" in capsys.readouterr().out


def test_a_real_world_that_fails_writes_nothing_and_exits_1(tmp_path, capsys):
    mine = tmp_path / "mine.py"
    mine.write_text("def boom(comm, tensor, op):\n    if comm.rank == 1:\n        raise KeyError('mine')\n"
                    "    comm.recv(tensor.clone(), 1, 0)\n")
    out = tmp_path / "boom.html"
    assert cli.main(["all_reduce", "--function", f"{mine}:boom", "-n", "2", "--real", "--hang-seconds", "20",
                     "-o", str(out)]) == 1
    assert not out.exists()
    err = capsys.readouterr().err
    assert "nothing written" in err and "rank 1 of 2 failed" in err and "KeyError" in err


def test_bad_input_to_a_learners_real_run_is_refused_before_any_process(learner, monkeypatch, tmp_path, capsys):
    from collectives.tools import launch

    def no_world(*args, **kwargs):
        raise AssertionError("a process was started")
    monkeypatch.setattr(launch, "run_in_group", no_world)
    fn = learner("ring")
    with pytest.raises(ValueError, match="whole number"):
        record.record_real("all_reduce", fn, 0)
    with pytest.raises(ValueError, match="hang"):
        record.record_real("all_reduce", fn, 2, hang=0)

    def nested(comm, tensor, op):
        pass
    with pytest.raises(ValueError, match="top level of a .py file"):
        record.record_real("all_reduce", nested, 2)
    mine = tmp_path / "mine.py"
    assert cli.main(["all_reduce", "--function", f"{tmp_path}/nope.py:ring", "-n", "2", "--real"]) == 2
    assert cli.main(["all_reduce", "--function", f"{mine}:no_such_name", "-n", "2", "--real"]) == 2
    assert cli.main(["all_reduce", "--function", f"{mine}:ring", "-n", "0", "--real"]) == 2
    assert cli.main(["all_reduce", "--function", f"{mine}:ring", "-n", "2", "--real", "--hang-seconds", "-1"]) == 2
    err = capsys.readouterr().err
    assert "no file" in err and "no function 'no_such_name'" in err and "-n must be 1 or more" in err
    assert err.count("collectives.viz:") == 4


def test_the_graders_html_draws_both_runs_for_real(tmp_path):
    from tutorials.exercises import grade
    here = grade.HERE
    text = grade.draw("sim_all_reduce", str(here / "wrong" / "sim_all_reduce_blocking.py"), tmp_path / "g.html",
                      world_size=3, real=True, hang_seconds=HANG)
    page = (tmp_path / "g.html").read_text()
    assert "real processes (gloo)" in text and "send-send" in text
    assert "yours: all_reduce / sim_all_reduce on 3 ranks: a real run" in page
    assert "reference: all_reduce / naive_ring on 3 ranks: a real run" in page
    with pytest.raises(SystemExit):
        grade.main(["sim_all_reduce", "--real"])        # --real says how --html draws


# ---- the course's exercises written against torch's API, drawn for real (issue 35) -------------

def test_the_exercises_torch_api_ring_moves_the_registered_rings_messages():
    """The reference solution of ``grade all_reduce`` (dist.batch_isend_irecv, tag 0) drawn from
    real processes: its messages, numbered by their place in their direction, are exactly the
    registered ring's simulated ones, and its buffers at each step the same."""
    from tutorials.exercises.solutions.all_reduce import all_reduce
    for n in (2, 3):
        real = record.record_real("all_reduce", all_reduce, n, timeout=TIMEOUT, hang=30, calls="torch")
        sim = record.record("all_reduce", "ring", n)
        assert sorted(map(shape, real["messages"])) == sorted(map(shape, sim["messages"]))
        assert real["final"] == sim["final"] and real["failure"] is None and real["unwaited"] == [[]] * n
        for r in range(n):
            assert sorted({(s, tuple(v)) for _, s, v in real["snapshots"][r]}) == \
                sorted({(s, tuple(v)) for _, s, v in sim["snapshots"][r]})
            # its own count_traffic, counted in its process: 2(N-1) messages of one element each way
            assert real["traffic"][r] == [16 * (n - 1), 16 * (n - 1), 2 * (n - 1), 2 * (n - 1)]
        d = model.build(real)
        assert d["wrong"] is None and d["unwaited"] == [] and len(d["steps"]) == 2 * (n - 1)


TORCH_LEARNER = """
import torch
import torch.distributed as dist


def all_gather(tensor_list, tensor, group=None):
    r, n = dist.get_rank(), dist.get_world_size()
    for q in range(n):
        if q != r:
            dist.isend(tensor, q)           # the handle is dropped: never waited on
    for q in range(n):
        if q == r:
            tensor_list[q].copy_(tensor)
        else:
            dist.recv(tensor_list[q], q)


def all_reduce(tensor, group=None):
    r, n = dist.get_rank(), dist.get_world_size()
    got = torch.empty_like(tensor)
    dist.recv(got, (r - 1) % n)             # every rank receives first: nobody sends
    dist.send(tensor, (r + 1) % n)
"""


def test_a_torch_api_learners_wrong_sum_hang_and_unwaited_sends_are_drawn(tmp_path):
    from tutorials.exercises import grade
    from tutorials.exercises._common import load
    wrong = grade.HERE / "wrong"
    twice = load("all_reduce", str(wrong / "all_reduce_counts_own_twice.py"))
    d = model.build(record.record_real("all_reduce", twice, 3, timeout=TIMEOUT, hang=30, calls="torch"))
    assert d["failure"] is None and "rank 0's contribution is counted 2 times" in d["wrong"]["text"]

    blocking = load("all_reduce", str(wrong / "all_reduce_deadlock.py"))
    rec = record.record_real("all_reduce", blocking, 3, timeout=TIMEOUT, hang=HANG, calls="torch")
    assert rec["failure"]["type"] == "send-send" and rec["messages"] == []
    assert [c["rank"] for c in rec["failure"]["cycle"]] == [0, 1, 2]
    assert "isend + irecv, or batch_isend_irecv" in rec["failure"]["report"] and "comm.sendrecv" not in rec["failure"]["report"]

    mine = tmp_path / "mine.py"
    mine.write_text(TORCH_LEARNER)
    fn = load("all_gather", str(mine))
    d = model.build(record.record_real("all_gather", fn, 3, timeout=TIMEOUT, hang=30, calls="torch"))
    assert d["failure"] is None and d["wrong"] is None        # right, but two sends per rank never waited on
    assert sorted((u["rank"], u["kind"], u["peer"]) for u in d["unwaited"]) == \
        [(r, "send", q) for r in range(3) for q in range(3) if q != r]

    rec = record.record_real("all_reduce", load("all_reduce", str(mine)), 3, timeout=TIMEOUT, hang=HANG, calls="torch")
    assert rec["failure"]["type"] == "recv-recv" and [c["kind"] for c in rec["failure"]["cycle"]] == ["recv"] * 3


def test_grade_html_draws_a_torch_api_exercise_beside_its_reference(tmp_path, capsys):
    """The issue's command, literally: ``grade all_reduce --solution mine.py --html out.html``."""
    from tutorials.exercises import grade
    out = tmp_path / "out.html"
    assert grade.main(["all_reduce", "--solution", str(grade.HERE / "wrong" / "all_reduce_counts_own_twice.py"),
                       "--worlds", "2", "--html", str(out), "--html-ranks", "3"]) == 1
    text = capsys.readouterr().out
    assert "through our door" in text and "counted 2 times" in text
    page = out.read_text()
    assert "yours: all_reduce / all_reduce on 3 ranks: a real run" in page
    assert "reference: all_reduce / all_reduce on 3 ranks: a real run" in page and "WRONG RESULT" in page
    with pytest.raises(SystemExit):
        grade.main(["send_recv_ring", "--html", str(out)])      # not a collective's exercise


def test_a_browser_shows_a_real_hang_as_its_cycle(tmp_path):
    """A real run that hangs (torch's blocking sends, every rank first), in Chromium: the banner
    names the cycle, the page is frozen at the end, and its screenshot is not blank."""
    from tests.test_viz_browser import BROWSER, chromium
    if BROWSER is None:
        pytest.skip("no Chromium (apt-get install chromium)")
    import html as _html

    import matplotlib.image

    from collectives.viz import render
    from tutorials.exercises import grade
    from tutorials.exercises._common import load
    blocking = load("all_reduce", str(grade.HERE / "wrong" / "all_reduce_deadlock.py"))
    d = model.build(record.record_real("all_reduce", blocking, 4, timeout=TIMEOUT, hang=HANG, calls="torch"))
    path = render.write(d, tmp_path / "hang.html")
    dom = chromium("--dump-dom", f"file://{path}")
    banner = re.search(r'<div class="banner dead" id="deadlock">(.*?)</div>', dom, re.S).group(1)
    assert "send-send cycle: 0 \u2192 1 \u2192 2 \u2192 3 \u2192 0" in _html.unescape(banner)
    assert "a real run" in _html.unescape(banner) and "frozen" in dom
    chromium("--window-size=1200,900", f"--screenshot={tmp_path / 'shot.png'}", f"file://{path}")
    img = matplotlib.image.imread(tmp_path / "shot.png")[..., :3]
    colours = {tuple((px * 255).astype(int)) for px in img[::7, ::7].reshape(-1, 3)}
    assert img.shape[0] == 900 and len(colours) > 20


@pytest.mark.parametrize("collective", ["broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all"])
def test_every_torch_api_exercises_reference_is_drawn_right_for_real(collective):
    import importlib
    fn = getattr(importlib.import_module(f"tutorials.exercises.solutions.{collective}"), collective)
    rec = record.record_real(collective, fn, 3, root=1, timeout=TIMEOUT, hang=30, calls="torch")
    for r in range(3):      # every cell holds what the collective promises, each rank once
        for v, want in zip(rec["final"][r], rec["want"][r]):
            if want is not None:
                assert record.decode(v, "nibbles", 3) == {q: 1 for q in want}
    d = model.build(rec)
    assert d["wrong"] is None and d["failure"] is None and d["unwaited"] == []
    # the page's counters at the end are each process's own count_traffic
    assert [[sum(m[3] for m in d["msgs"] if m[0] == r), sum(m[3] for m in d["msgs"] if m[1] == r),
             sum(1 for m in d["msgs"] if m[0] == r), sum(1 for m in d["msgs"] if m[1] == r)]
            for r in range(3)] == rec["traffic"]


def test_the_cli_draws_a_torch_api_function_for_real(tmp_path, capsys):
    from tutorials.exercises import grade
    out = tmp_path / "mine.html"
    ref = grade.HERE / "solutions" / "all_reduce.py"
    assert cli.main(["all_reduce", "--function", f"{ref}:all_reduce", "--torch", "-n", "3", "-o", str(out)]) == 0
    assert "torch.distributed point-to-point calls through our door" in out.read_text()
    mine = tmp_path / "door.py"
    mine.write_text("def all_reduce(comm, tensor, op):\n    pass\n")
    assert cli.main(["all_reduce", "--function", f"{mine}:all_reduce", "--torch", "-n", "2"]) == 2
    assert cli.main(["all_reduce", "ring", "--torch", "-n", "2"]) == 2
    err = capsys.readouterr().err
    assert "does not take the arguments of the all_reduce of torch.distributed: all_reduce(tensor)" in err
    assert "--torch says how your --function is written" in err


def test_a_notebook_shows_a_real_run_inline_without_a_warning():
    import warnings

    from collectives import viz
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # IPython warns about HTML that starts with an iframe
        shown = viz.show("all_reduce", "ring", 2, real=True)
    assert shown.data.startswith("<div><iframe") and "a real run" in shown.data
