"""collectives.tools.perfetto writes traces that ui.perfetto.dev and chrome://tracing load.

Neither viewer runs here, so the tests check the Trace Event Format they both
read: a ``traceEvents`` list of complete events (``"ph": "X"``, ``ts`` and
``dur`` in microseconds) that nest on every track, named processes (one per
rank) and threads, and flow events that pair every send with its receive.
"""
import json

import pytest
import torch

import collectives
from collectives.tools import perfetto
from collectives.observers import CallRecord, Message
from tests.worlds import run_world


def ring_messages(n, calls=1, chunk_bytes=16):
    """What ``trace()`` records on every rank for ``calls`` back-to-back ring all_reduces."""
    out = []
    for c in range(calls):
        base = c * 2 * (n - 1) * 1e-3
        for s in range(2 * (n - 1)):
            for r in range(n):
                for kind in ("send", "recv"):
                    out.append(Message("all_reduce", "ring", s, kind, r, (r + 1) % n, chunk_bytes,
                                       start=100.0 + base + s * 1e-3 + r * 1e-5,
                                       end=100.0 + base + (s + 1) * 1e-3 - 1e-6))
    return out


def by_phase(trace, ph):
    return [e for e in trace["traceEvents"] if e["ph"] == ph]


def test_one_process_per_rank_a_slice_per_message_and_per_call():
    trace = perfetto.to_chrome_trace(ring_messages(4, calls=2))
    counts = perfetto.check_trace(trace)
    names = {e["pid"]: e["args"]["name"] for e in by_phase(trace, "M") if e["name"] == "process_name"}
    assert names == {r: f"rank {r}" for r in range(4)}
    slices = by_phase(trace, "X")
    messages = [e for e in slices if e["cat"] in ("send", "recv")]
    calls = [e for e in slices if e["cat"] == "collective"]
    assert len(messages) == 2 * 4 * 2 * 6                   # 2 calls x 4 ranks x (send + recv) x 6 steps
    assert len(calls) == 2 * 4                              # derived: two calls on each rank
    assert counts == {"slices": len(slices), "flows": 2 * 4 * 6, "tracks": counts["tracks"]}
    send = next(e for e in messages if e["pid"] == 2 and e["cat"] == "send")
    assert send["name"] == "send 16 B -> 3"
    assert send["args"]["bytes"] == 16 and send["args"]["peer"] == 3
    recv = next(e for e in messages if e["pid"] == 2 and e["cat"] == "recv")
    assert recv["args"]["peer"] == 1
    for call in calls:
        assert call["name"] == "all_reduce (ring)"
        assert call["args"]["derived"] is True
        assert call["args"]["bytes sent"] == call["args"]["bytes received"] == 6 * 16
    first = min(calls, key=lambda e: e["ts"])
    assert first["ts"] == 0.0
    assert first["dur"] == pytest.approx(6e3 - 1, abs=1e-3)  # microseconds: 6 steps of 1 ms
    assert trace["otherData"]["t0_unix_s"] == 100.0


def test_overlapping_messages_get_their_own_tracks():
    """A linear broadcast posts its sends together: they overlap, so they cannot share a track."""
    msgs = [Message("broadcast", "linear", 0, "send", 0, d, 8, 1.0, 1.5) for d in (1, 2, 3)]
    msgs += [Message("broadcast", "linear", 0, "recv", 0, d, 8, 1.0 + d * 0.01, 1.6) for d in (1, 2, 3)]
    trace = perfetto.to_chrome_trace(msgs)
    perfetto.check_trace(trace)
    rank0_sends = [e for e in by_phase(trace, "X") if e["pid"] == 0 and e["cat"] == "send"]
    assert len({e["tid"] for e in rank0_sends}) == 3
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in by_phase(trace, "M") if e["name"] == "thread_name"}
    assert sorted(v for (pid, _), v in threads.items() if pid == 0) == [
        "collectives", "messages", "messages 2", "messages 3"]
    # Every flow starts on its send's track and ends on its receive's.
    for s, f in zip(sorted(by_phase(trace, "s"), key=lambda e: e["id"]),
                    sorted(by_phase(trace, "f"), key=lambda e: e["id"])):
        assert s["pid"] == 0 and f["pid"] in (1, 2, 3) and f["bp"] == "e" and f["ts"] >= s["ts"]


def test_back_to_back_single_step_calls_are_separate_slices():
    """N=2 recursive doubling is one step; two calls in a row must give two call slices."""
    msgs = []
    for c in range(2):
        for r in range(2):
            for kind in ("send", "recv"):
                msgs.append(Message("all_reduce", "recursive_doubling", 0, kind, r, 1 - r, 4,
                                    10.0 + c, 10.5 + c) if kind == "send" else
                            Message("all_reduce", "recursive_doubling", 0, kind, 1 - r, r, 4, 10.0 + c, 10.5 + c))
    calls = [e for e in by_phase(perfetto.to_chrome_trace(msgs), "X") if e["cat"] == "collective"]
    assert len(calls) == 4


def test_call_records_are_used_when_present():
    # A group of global ranks (2, 5): group rank 0 is global rank 2.
    records = [CallRecord("all_reduce", "ring", 0, (2, 5), 0, 64, 1.0, 1.2),
               Message("all_reduce", "ring", 0, "send", 2, 5, 32, 1.0, 1.1),
               CallRecord("all_reduce", "ring", 0, (2, 5), 1, 64, 1.0, 1.3),
               Message("all_reduce", "ring", 0, "recv", 2, 5, 32, 1.05, 1.1)]
    trace = perfetto.to_chrome_trace(records)
    perfetto.check_trace(trace)
    calls = [e for e in by_phase(trace, "X") if e["cat"] == "collective"]
    assert sorted((e["pid"], e["dur"]) for e in calls) == [(2, pytest.approx(2e5)), (5, pytest.approx(3e5))]
    assert calls[0]["args"]["seq"] == 0 and calls[0]["args"]["group ranks"] == [2, 5]
    assert "derived" not in calls[0]["args"]

    class Bare:                      # a call record that does not say whose it is
        collective, algorithm, start, end = "all_reduce", "ring", 1.0, 1.2
    with pytest.raises(ValueError, match="without a rank"):
        perfetto.to_chrome_trace([Bare()])
    assert perfetto.to_chrome_trace({3: [Bare()]})["traceEvents"][-1]["pid"] == 3


@pytest.mark.parametrize("bad, match", [
    ({"events": []}, "traceEvents"),
    ({"traceEvents": [{"ph": "X", "pid": 0, "tid": 1, "name": "a", "ts": 0, "dur": -1}]}, "negative"),
    ({"traceEvents": [{"ph": "X", "pid": 0, "tid": 1, "name": "a", "ts": 0}]}, "numeric ts and dur"),
    ({"traceEvents": [{"ph": "X", "pid": 0, "tid": 1, "name": "a", "ts": 0, "dur": 10},
                      {"ph": "X", "pid": 0, "tid": 1, "name": "b", "ts": 5, "dur": 10}]}, "overlap"),
    ({"traceEvents": [{"ph": "s", "pid": 0, "tid": 1, "id": 3, "ts": 0}]}, "both ends"),
    ({"traceEvents": [{"ph": "X", "name": "a", "ts": 0, "dur": 1}]}, "without"),
])
def test_check_trace_rejects_what_the_viewers_would_not_show(bad, match):
    with pytest.raises(ValueError, match=match):
        perfetto.check_trace(bad)


def _traced_world(rank, n, path):
    x = torch.arange(8.0) + rank
    with collectives.trace() as records:
        collectives.all_reduce(x, algorithm="ring")
        collectives.broadcast(x, src=1, algorithm="binomial_tree")
    return perfetto.export_all(records, path)


def test_export_all_gathers_every_rank_to_rank_0(tmp_path):
    """Three real ranks: rank 0 writes one file holding every rank's calls and messages."""
    path = str(tmp_path / "trace.json")
    results = run_world(_traced_world, 3, path, timeout=120)
    assert results[0] == path and results[1] is None and results[2] is None
    with open(path) as f:
        trace = json.load(f)
    counts = perfetto.check_trace(trace)
    slices = by_phase(trace, "X")
    assert {e["pid"] for e in slices} == {0, 1, 2}
    for rank in range(3):
        calls = sorted((e for e in slices if e["pid"] == rank and e["cat"] == "collective"), key=lambda e: e["ts"])
        assert [e["args"]["collective"] for e in calls] == ["all_reduce", "broadcast"]
        assert [e["args"]["seq"] for e in calls] == [calls[0]["args"]["seq"], calls[0]["args"]["seq"] + 1]
        assert all("derived" not in e["args"] for e in calls)      # the door's Call records
    ring = [e for e in slices if e["cat"] == "send" and e["args"]["collective"] == "all_reduce"]
    assert len(ring) == 3 * 2 * (3 - 1)                    # 2(N-1) sends per rank
    assert counts["flows"] == len([e for e in slices if e["cat"] == "send"])


def test_receives_posted_early_stay_in_their_call():
    """Tree all_reduce posts the broadcast-phase receive (step 3) before its step-0 send: one call."""
    msgs = [Message("all_reduce", "tree", 3, "recv", 0, 1, 64, 1.000, 1.050),
            Message("all_reduce", "tree", 0, "send", 1, 0, 64, 1.001, 1.020),
            Message("all_reduce", "tree", 3, "recv", 0, 1, 64, 2.000, 2.050),   # the next call
            Message("all_reduce", "tree", 0, "send", 1, 0, 64, 2.001, 2.020)]
    calls = perfetto.derive_calls(msgs)
    assert [len(c["messages"]) for c in calls] == [2, 2]
    assert calls[0]["end"] == 1.050 and calls[1]["start"] == 2.000


def test_one_training_step_trace(tmp_path):
    """benchmarks.data_parallel --trace: one DataParallel step on 2 ranks, a valid trace and its picture."""
    from benchmarks import data_parallel
    path = tmp_path / "step.json"
    data_parallel.main(["--world-size", "2", "--trace", str(path), "--batch-size", "4"])
    trace = json.loads(path.read_text())
    perfetto.check_trace(trace)
    slices = by_phase(trace, "X")
    for rank in (0, 1):
        program = [e["name"] for e in sorted(slices, key=lambda e: e["ts"])
                   if e["pid"] == rank and e["cat"] == "program"]
        assert program == ["forward", "backward (gradients averaged)", "optimizer step"]
        assert any(e["cat"] == "collective" and e["args"]["collective"] == "all_reduce"
                   for e in slices if e["pid"] == rank)
    assert (tmp_path / "step.png").stat().st_size > 1000
