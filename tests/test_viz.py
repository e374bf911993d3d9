"""collectives.viz: the pages are drawn from the recorded run, and say what the run did.

Every figure a page shows is checked here against ``count_traffic`` and ``trace`` of the same
run, and the provenance of every output cell against the collective's meaning; the browser
tests (tests/test_viz_browser.py) check that the page shows them.
"""
import contextlib
import json
import re

import pytest

import collectives
from collectives import observers, viz
from collectives.parallel import pipeline as pp
from collectives.viz import cli, model, record, render, schedules
from collectives.viz.questions import ranks_in

ALL = [(c, a) for c, algs in collectives.ALGORITHMS.items() for a in algs]


def traced(collective, algorithm, n, **kw):
    """(page data, per-rank Traffic) of one run, the counters listening to the same run."""
    with contextlib.ExitStack() as stack:
        counters = [stack.enter_context(observers.count_traffic(rank=r)) for r in range(n)]
        d = model.build(record.record(collective, algorithm, n, **kw))
    return d, counters


def totals(d, upto=None):
    n = d["n"]
    out = {k: [0] * n for k in ("sb", "rb", "sm", "rm")}
    for m in d["msgs"]:
        if upto is None or m[2] <= upto:
            out["sb"][m[0]] += m[3]
            out["sm"][m[0]] += 1
            out["rb"][m[1]] += m[3]
            out["rm"][m[1]] += 1
    return out


def final_cells(d):
    state = [row[:] for row in d["init"]]
    for ch in d["changes"]:
        for i in range(0, len(ch), 3):
            state[ch[i]][ch[i + 1]] = ch[i + 2]
    return state


@pytest.mark.parametrize("collective,algorithm", ALL)
@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_every_algorithm_renders_with_the_runs_traffic_and_provenance(collective, algorithm, n):
    d, counters = traced(collective, algorithm, n)
    t = totals(d)
    assert t["sb"] == [c.sent_bytes for c in counters]
    assert t["rb"] == [c.recv_bytes for c in counters]
    assert t["sm"] == [c.sent_messages for c in counters]
    assert t["rm"] == [c.recv_messages for c in counters]
    assert d["failure"] is None and d["wrong"] is None
    # the last frame's cells: every output holds exactly the contributions the collective promises
    rec = record.record(collective, algorithm, n)
    for r, (cells, want) in enumerate(zip(final_cells(d), rec["want"])):
        for c, w in zip(cells, want):
            if w is not None:
                got = record.decode(int(d["provs"][c], 16), d["mode"], n)
                assert set(got) == w and set(got.values()) <= {1}, (r, c, got, w)
    page = render.html(d)
    assert not re.search(r"<script[^>]+src=|<link[^>]+href=|https?://", page)


@pytest.mark.parametrize("collective,algorithm", [("all_reduce", "ring"), ("all_to_all", "linear"),
                                                  ("all_reduce", "recursive_doubling"), ("all_gather", "bruck")])
def test_a_page_at_64_ranks_stays_under_2_mb(collective, algorithm):
    d, counters = traced(collective, algorithm, 64)
    assert totals(d)["sb"] == [c.sent_bytes for c in counters]
    assert d["wrong"] is None
    assert len(render.html(d).encode()) <= render.MAX_PAGE_BYTES


def test_partial_sums_look_different_from_the_finished_sum():
    d = model.build(record.record("all_reduce", "ring", 4))
    held = {ranks_in(k, d["mode"], 4) for k in d["provs"]}
    assert held == {1, 2, 3, 4}       # one rank, partial sums of 2 and 3, the finished sum


def test_above_64_ranks_a_summary_with_the_traffic():
    d, counters = traced("broadcast", "binomial_tree", 100)
    assert d["summary"] and totals(d)["sb"] == [c.sent_bytes for c in counters]


@pytest.mark.parametrize("collective,algorithm,n", [("all_reduce", "ring", 65), ("all_reduce", "recursive_doubling", 128),
                                                    ("reduce_scatter", "ring", 100), ("reduce", "binomial_tree", 256)])
def test_a_reduction_above_64_ranks_is_summarised_not_failed(collective, algorithm, n):
    """Above 64 ranks the run is on meta tensors: the reduction has no provenance to check there."""
    d, counters = traced(collective, algorithm, n)
    assert d["failure"] is None and d["summary"] and d["wrong"] is None
    assert totals(d)["sb"] == [c.sent_bytes for c in counters]


def deadlocking(comm, tensor, op):
    import torch
    buf = torch.empty_like(tensor)
    for step in range(comm.size - 1):      # blocking send first on every rank: a send-send cycle
        comm.send(tensor, (comm.rank + 1) % comm.size, step)
        comm.recv(buf, (comm.rank - 1) % comm.size, step)
        op.combine(tensor, buf)


def counts_itself_twice(comm, tensor, op):
    import torch
    n, r = comm.size, comm.rank
    acc, send, buf = tensor.clone(), tensor.clone(), torch.empty_like(tensor)
    for step in range(n - 1):
        comm.sendrecv(send, (r + 1) % n, buf, (r - 1) % n, step)
        op.combine(acc, buf)
        send = buf.clone()
    op.combine(acc, tensor)
    tensor.copy_(acc)


@pytest.mark.parametrize("n", [2, 3, 5])
def test_a_deadlock_page_names_the_cycle(n):
    d = model.build(record.record("all_reduce", deadlocking, n))
    assert d["failure"]["kind"] == "deadlock" and d["failure"]["type"] == "send-send"
    assert [c["rank"] for c in d["failure"]["cycle"]] == list(range(n))
    assert [c["peer"] for c in d["failure"]["cycle"]] == [(r + 1) % n for r in range(n)]
    assert any(q["answer"] == n for q in d["questions"])


@pytest.mark.parametrize("n", [3, 20])
def test_a_wrong_result_page_marks_the_first_double_count(n):
    d = model.build(record.record("all_reduce", counts_itself_twice, n))
    assert d["wrong"] is not None and d["wrong"]["rank"] == 0
    assert "rank 0's contribution" in d["wrong"]["text"]


def test_bad_input_is_a_clear_error(capsys):
    with pytest.raises(ValueError, match="unknown algorithm"):
        record.record("all_reduce", "nope", 4)
    with pytest.raises(ValueError, match="unknown collective"):
        record.record("allreduce", "ring", 4)
    with pytest.raises(ValueError, match=">= 1"):
        record.record("all_reduce", "ring", 0)
    with pytest.raises(record.TooLarge, match="256"):
        record.record("all_reduce", "ring", 257)
    assert cli.main(["all_reduce", "nope", "-o", "/dev/null"]) == 2
    assert cli.main(["all_reduce", "ring", "-n", "0"]) == 2
    assert cli.main(["all_reduce", "ring", "-n", "300"]) == 2
    err = capsys.readouterr().err
    assert err.count("collectives.viz:") == 3


def test_too_many_messages_is_refused_before_a_page(monkeypatch):
    monkeypatch.setattr(record, "MAX_MESSAGES", 10)
    with pytest.raises(record.TooLarge, match="more than 10 messages"):
        record.record("all_to_all", "linear", 8)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(1, 1), (2, 1), (3, 5), (4, 8)])
def test_the_pipeline_bubble_is_counted_from_the_schedule(schedule, p, m):
    d = schedules.pipeline(p, m, schedule)
    assert d["bubble"] == pytest.approx(pp.bubble_fraction(p, m))
    assert sorted((w[0], w[2], w[3]) for w in d["work"]) == sorted(
        (s, k, i) for s in range(p) for k, i in pp.SCHEDULES[schedule](p, m, s))
    if schedule == "1f1b":
        assert d["peak"] == [min(p - s, m) for s in range(p)]


@pytest.mark.parametrize("n", [1, 3, 4])
def test_the_parallelism_pages_end_right(n):
    for build in schedules.PARALLELISMS.values():
        d = build(n)
        assert d["failure"] is None and d["wrong"] is None, d["title"]
        assert len(render.html(d).encode()) <= render.MAX_PAGE_BYTES


def test_moe_moves_the_routers_counts():
    counts = schedules.moe_counts(4)
    d = schedules.moe(4)
    got = totals(d)
    assert got["sb"] == [sum(c for j, c in enumerate(counts[r]) if j != r) * 8 for r in range(4)]


def test_at_least_twelve_questions_with_answers_from_the_run():
    pages = [model.build(record.record(c, a, 4)) for c, a in
             [("all_reduce", "ring"), ("all_reduce", "recursive_doubling"), ("broadcast", "binomial_tree")]]
    pages += [schedules.pipeline(4, 8, "1f1b"), schedules.fsdp(4), schedules.moe(4), schedules.ring_attention(4),
              model.build(record.record("all_reduce", deadlocking, 3))]
    asks = {re.sub(r"\d+", "#", q["ask"]) for d in pages for q in d["questions"]}
    assert len(asks) >= 12, asks
    ring = pages[0]
    busiest = max(sum(m[3] for m in ring["msgs"] if i in m[10]) for i in range(len(ring["links"])))
    q = next(q for q in ring["questions"] if "busiest link" in q["ask"])
    assert q["answer"] == busiest
    json.dumps([d["questions"] for d in pages])


def test_page_writes_a_file_and_the_cli_draws_a_function(tmp_path):
    path = viz.page("reduce_scatter", "ring", 3, path=tmp_path / "rs.html")
    assert path.stat().st_size > 0
    mine = tmp_path / "mine.py"
    mine.write_text("from tests.test_viz import deadlocking as all_reduce\n")
    assert cli.main(["all_reduce", "--function", f"{mine}:all_reduce", "-n", "3", "-o", str(tmp_path / "d.html")]) == 3
    assert "send-send" in (tmp_path / "d.html").read_text()


def test_the_simulators_html_flag_draws_the_first_point(tmp_path):
    from collectives.sim import cli as sim_cli
    out = tmp_path / "sim.html"
    assert sim_cli.main(["--collective", "broadcast", "--algorithm", "binomial_tree", "--world-size", "6",
                         "-b", "4K", "-e", "4K", "--root", "2", "--html", str(out)]) == 0
    assert "broadcast / binomial_tree on 6 ranks" in out.read_text()


def test_the_graders_page_sets_the_learners_run_beside_the_reference(tmp_path):
    path, mine = viz.side_by_side("all_reduce", deadlocking, 3, tmp_path / "g.html")
    text = path.read_text()
    assert mine["failure"]["type"] == "send-send"
    assert "yours: all_reduce / deadlocking on 3 ranks" in text and "reference: all_reduce / naive_ring" in text


SAMPLE_N = [2, 3, 5, 8, 13, 64]
SAMPLE = [("all_reduce", "rabenseifner"), ("all_to_all", "bruck")]


@pytest.mark.parametrize("collective,algorithm", SAMPLE)
def test_a_sample_of_worlds_up_to_64_stays_under_2_mb_with_the_runs_counters(collective, algorithm):
    """A sample of what ``--all -n 2-64`` checks for every algorithm (docs: chapter 5)."""
    for n in SAMPLE_N:
        d, counters = traced(collective, algorithm, n)
        t = totals(d)
        assert [t["sb"], t["rb"], t["sm"], t["rm"]] == [[c.sent_bytes for c in counters],
                                                        [c.recv_bytes for c in counters],
                                                        [c.sent_messages for c in counters],
                                                        [c.recv_messages for c in counters]], n
        assert len(render.html(d).encode()) <= render.MAX_PAGE_BYTES, n
        assert d["failure"] is None and d["wrong"] is None


def test_the_all_checker_counts_its_pages_and_fails_on_a_page_too_large(capsys, monkeypatch, tmp_path):
    from collectives.viz import check
    assert cli.sizes_of("2-5,8,13") == [2, 3, 4, 5, 8, 13]
    assert cli.main(["--all", "all_reduce", "rabenseifner", "-n", "2,3,5", "-o", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    sizes = {n: (tmp_path / f"all_reduce_rabenseifner_{n}.html").stat().st_size for n in (2, 3, 5)}
    assert "checked 3 pages (1 algorithms and schedules of 1 collectives and parallelisms x N = 2,3,5)" in out
    assert f"largest: all_reduce/rabenseifner N={max(sizes, key=sizes.get)}, {max(sizes.values())} bytes" in out
    assert "every page: at most the bound, ended right, its counters equal to count_traffic's" in out
    rows, _ = check.run([2, 3], "broadcast", None, say=lambda line: None)
    assert len(rows) == 2 * len(collectives.ALGORITHMS["broadcast"]) and not any(r["problems"] for r in rows)
    monkeypatch.setattr(render, "MAX_PAGE_BYTES", 1000)
    assert cli.main(["--all", "barrier", "-n", "2-3"]) == 1
    assert "2 page(s) with problems" in capsys.readouterr().out
    assert cli.main(["--all", "all_reduce", "nope", "-n", "2"]) == 2
    assert cli.main(["--all", "-n", "4-2"]) == 2


def test_the_all_checker_draws_every_parallelisms_schedule_and_holds_a_pipeline_to_its_formulas():
    """``--all`` checks the parallelisms too: FSDP, MoE and ring attention against count_traffic,
    GPipe and 1F1B against their closed forms (messages per stage, bubble (p-1)/(m+p-1))."""
    from collectives.parallel.pipeline import bubble_fraction
    from collectives.viz import check, schedules
    rows, summary = check.run([2, 3, 5, 8], say=lambda line: None, collective="pipeline")
    rows2, _ = check.run([2, 3, 5], say=lambda line: None, collective="fsdp")
    rows3, _ = check.run([2, 5], say=lambda line: None, collective="moe")
    rows4, _ = check.run([3, 8], say=lambda line: None, collective="ring_attention")
    assert [(r["algorithm"], r["n"]) for r in rows] == [(a, n) for a in ("gpipe", "1f1b") for n in (2, 3, 5, 8)]
    assert len(rows2) == 3 and len(rows3) == 2 and len(rows4) == 2
    assert not any(r["problems"] for r in rows + rows2 + rows3 + rows4), [r for r in rows + rows2 + rows3 + rows4
                                                                          if r["problems"]]
    assert "algorithms and schedules of 1 collectives and parallelisms" in summary
    d = schedules.pipeline(5, check.micro_batches(5), "1f1b")
    assert d["bubble"] == pytest.approx(bubble_fraction(5, 5), abs=1e-12) and check.pipeline_problems(d, 5, 5) == []
    d["bubble"] += 0.01         # a page that counted its bubble wrong is named
    d["msgs"].pop()             # and one that lost a message
    problems = check.pipeline_problems(d, 5, 5)
    assert len(problems) == 2 and "bubble counted" in problems[1] and "messages per stage" in problems[0]
    assert cli.main(["--all", "pipeline", "interleaved", "-n", "2"]) == 2


TOPOLOGIES = [("ethernet-100g", 6), ("h100-cluster", 20), ("fat-tree", 70), ("torus", 64), ("dragonfly", 40),
              ("h100-rail", 24)]


@pytest.mark.parametrize("topology,n", TOPOLOGIES)
def test_every_route_is_drawn_as_a_connected_path_on_its_topology(topology, n):
    """Each link the simulator routes a message over is drawn between two places, and a
    message's links join end to end: from its sender (or the switch that holds it) to its
    receiver, so the topology view draws the network the simulator times."""
    import random

    from collectives.sim import topology as topologies
    from collectives.viz import layout
    fabric = topologies.build(topologies.load(topology), n)
    rng = random.Random(0)
    names = {}
    for _ in range(300):
        src, dst = rng.sample(range(n), 2)
        ids, _ = fabric.route(src, dst)
        hops = [layout.link(fabric, x) for x in ids]
        for x, (name, a, b, _) in zip(ids, hops):
            assert names.setdefault(name, x) == x, f"two links named {name!r}"
        for (_, _, b, _), (_, a, _, _) in zip(hops, hops[1:]):
            assert b == a, (topology, src, dst, hops)
        hub = layout.link(fabric, 2 * src)[2] if fabric.spec["kind"] != "torus" else None
        assert hops[0][1] in (("rank", src), hub), (topology, src, hops)
        into = layout.link(fabric, 2 * dst + 1)[1] if fabric.spec["kind"] != "torus" else None
        assert hops[-1][2] in (("rank", dst), into), (topology, dst, hops)
    d = model.build(record.record("all_reduce", "ring", n, topology))
    assert all(0 <= link["a"] < len(d["places"]) and 0 <= link["b"] < len(d["places"]) for link in d["links"])
    assert sorted(p[3] for p in d["places"] if p[2] == "rank") == list(range(n))
    if fabric.spec["kind"] != "fat_tree":
        assert not any("leaf" in link["name"] for link in d["links"])


def test_a_torus_ring_draws_its_wrap_around_links_as_stubs():
    d = model.build(record.record("all_reduce", "ring", 64, "torus"))      # 8x8
    wraps = sorted(link["name"] for link in d["links"] if link["wrap"])
    # each row's 7 -> 0 (x+), and the ring's way back from rank 63 to rank 0 (y+ from row 7 to row 0)
    assert wraps == sorted([f"rank {8 * row + 7} -> rank {8 * row} (x+)" for row in range(8)] + ["rank 56 -> rank 0 (y+)"])
