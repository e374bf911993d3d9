"""collectives.tools.plot draws from trace records; checked on traces built from the ring's schedule.

No processes: the records are what ``collectives.trace()`` yields on each rank
of a 4-rank ring all_reduce (each message once as a send, once as a recv).
The same functions run on real traces in the notebooks and tutorials/make_figures.py.
"""
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from collectives.tools import perfetto, plot  # noqa: E402
from collectives.observers import Message  # noqa: E402


def ring_messages(n, chunk_bytes=16, algorithm="ring"):
    """Records of a ring all_reduce on n ranks: step s, rank r sends to r+1, 1 ms per step."""
    out = []
    for s in range(2 * (n - 1)):
        for r in range(n):
            dst = (r + 1) % n
            for kind in ("send", "recv"):
                out.append(Message("all_reduce", algorithm, s, kind, r, dst, chunk_bytes,
                                   start=s * 1e-3 + r * 1e-5, end=(s + 1) * 1e-3))
    return out


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_ring_ownership_reaches_n_everywhere(n):
    fig, states = plot.ring_ownership(ring_messages(n))
    assert len(states) == 2 * (n - 1)
    after_reduce_scatter = states[n - 2]
    for r in range(n):
        assert after_reduce_scatter[r][r] == n          # rank r owns finished chunk r
        assert sum(v == n for v in after_reduce_scatter[r]) == 1
    assert all(v == n for row in states[-1] for v in row)
    assert len(fig.axes) >= 2 * n - 1
    plt.close(fig)


def test_ring_ownership_first_step_adds_one_rank():
    _, states = plot.ring_ownership(ring_messages(4))
    # Step 0: rank r receives chunk (r-2) mod 4 from r-1 and adds it to its own copy.
    assert states[0] == [[1, 1, 2, 1], [1, 1, 1, 2], [2, 1, 1, 1], [1, 2, 1, 1]]


def test_pair_messages_matches_every_send_to_its_recv():
    pairs = perfetto.pair_messages(ring_messages(4))
    assert len(pairs) == 6 * 4
    for send, recv in pairs:
        assert (send.kind, recv.kind) == ("send", "recv")
        assert (send.step, send.src, send.dst) == (recv.step, recv.src, recv.dst)


def test_timeline_draws_one_arrow_per_message_and_one_lane_per_rank(tmp_path):
    messages = ring_messages(4)
    events = [(r, 5e-3, "backward returns") for r in range(4)]
    ax = plot.timeline(messages, title="ring", events=events)
    arrows = [c for c in ax.texts if getattr(c, "arrow_patch", None) is not None]
    assert len(arrows) == 24
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"rank {r}" for r in range(4)]
    assert ax.get_xlim()[1] >= 6.0            # 6 steps of 1 ms
    ax.figure.savefig(tmp_path / "t.png")
    assert (tmp_path / "t.png").stat().st_size > 1000
    plt.close(ax.figure)


def test_timeline_of_nothing_is_an_empty_plot():
    ax = plot.timeline([])
    assert ax.get_title() == "no messages"
    plt.close(ax.figure)


def test_bytes_per_rank_bar_heights_are_the_bytes_sent():
    traces = {"ring": ring_messages(4, chunk_bytes=16), "naive": ring_messages(4, chunk_bytes=64)}
    ax = plot.bytes_per_rank(traces)
    heights = sorted({round(b.get_height()) for b in ax.patches})
    assert heights == [6 * 16, 6 * 64]
    assert len(ax.patches) == 2 * 4
    plt.close(ax.figure)


def test_every_committed_figure_is_shown_and_regenerated():
    import tutorials.make_figures as make_figures
    root = Path(make_figures.__file__).parent
    shown = {name for chapter in root.glob("[0-9][0-9]_*.md")
             for name in re.findall(r"figures/([\w.]+\.png)", chapter.read_text())}
    source = Path(make_figures.__file__).read_text()
    for png in (root / "figures").glob("*.png"):
        assert png.name in shown, f"{png.name} is committed but no chapter shows it"
        assert f'"{png.name}"' in source, f"{png.name} is not drawn by make_figures.py"


def test_cost_model_figure_draws_every_algorithm_at_two_sizes():
    import tutorials.make_figures as make_figures
    fig = make_figures.cost_model_figure()
    assert [len(ax.get_lines()) for ax in fig.axes] == [len(make_figures.ALGORITHMS)] * 2
    plt.close(fig)


def test_timeline_draws_a_perfetto_trace_file_the_same_way(tmp_path):
    """timeline reads the trace JSON perfetto writes: same arrows, lanes, and the program's spans."""
    messages = ring_messages(4)
    spans = [(r, "backward", -1e-3, 5e-3) for r in range(4)]
    path = perfetto.export_chrome_trace(messages, str(tmp_path / "t.json"), spans=spans)
    ax = plot.timeline(path)
    arrows = [c for c in ax.texts if getattr(c, "arrow_patch", None) is not None]
    assert len(arrows) == 24
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"rank {r}" for r in range(4)]
    labels = [t.get_text() for t in ax.texts if getattr(t, "arrow_patch", None) is None]
    assert labels.count("backward") == 4
    assert ax.get_xlim()[0] <= 0.0 and ax.get_xlim()[1] >= 7.0   # spans start 1 ms before the first message
    plt.close(ax.figure)


def test_call_records_in_a_trace_are_drawn_or_ignored():
    """trace() also yields Call records: every function takes the mixed list."""
    from collectives.observers import CallRecord
    messages = ring_messages(4)
    mixed = messages + [CallRecord("all_reduce", "ring", 0, (0, 1, 2, 3), r, 64, 0.0, 6e-3) for r in range(4)]
    _, states = plot.ring_ownership(mixed)
    assert states == plot.ring_ownership(messages)[1]
    assert len(perfetto.pair_messages(mixed)) == 24 and plot.ranks_of(mixed) == [0, 1, 2, 3]
    ax = plot.bytes_per_rank({"ring": mixed})
    assert sorted(round(b.get_height()) for b in ax.patches) == [6 * 16] * 4
    ax = plot.timeline(mixed)
    assert len([c for c in ax.texts if getattr(c, "arrow_patch", None) is not None]) == 24
    plt.close("all")
