"""Traces as Chrome/Perfetto trace JSON: open them in ui.perfetto.dev or chrome://tracing.

:func:`collectives.trace` records, on each rank, every message it sent or
received (and, where the door records them, every collective call). This
module turns the records of *all* ranks into the Trace Event Format that both
viewers read (a JSON object with a ``traceEvents`` list):

* one process per rank (``pid`` = rank, named "rank r"), so each rank is one
  track group, in rank order;
* one thread track "collectives" with a slice per collective call
  (``collective (algorithm)``, args: collective, algorithm, seq, group ranks,
  bytes, messages), and thread tracks "messages" with a slice per message
  (``send 4096 B -> 1``, args: bytes, peer, step, collective, algorithm).
  Slices that overlap in time go to extra tracks ("messages 2", ...), because
  slices on one track must nest;
* an arrow (a flow event) from each send to its matching receive;
* optionally, a "program" track with spans the caller marks (forward,
  backward, optimizer step), so the messages show against the work around them.

Slices are complete events (``"ph": "X"``) with ``ts`` and ``dur`` in
microseconds, measured from the first record. Ranks on one machine share
their clock (records hold ``time.time()``); across machines the tracks are
only as aligned as the machines' clocks.

Call slices come from the ``Call`` records :func:`collectives.trace` keeps
(one per collective call on each rank, with its sequence number on the group).
For records without them (older traces, hand-built message lists) call slices
are *derived* from the messages of each rank: consecutive messages of the same
collective and algorithm form one call, and a new call starts where a (kind,
peer, step) repeats. Calls that overlap on one rank (async work on two groups)
can then merge; their args say ``"derived": true``.

Example::

    >>> with collectives.trace() as records:
    ...     collectives.all_reduce(x, algorithm="ring")
    >>> perfetto.export_all(records, "ring.json")     # every rank calls it; rank 0 writes
    'ring.json'                                        # Rank 0 (None on the others)
"""
import json
import math

import torch.distributed as dist

from ..observers import Message

SPAN_TID = 0          # the "program" track: spans the caller marks (forward, backward, ...)
CALL_TID = 1          # first thread id of the call tracks
MESSAGE_TID = 101     # first thread id of the message tracks


def _owner(msg):
    """The rank that recorded ``msg``: the sender of a send, the receiver of a recv."""
    return msg.src if msg.kind == "send" else msg.dst


def _flatten(records):
    """[(rank or None, record)] from a list of records or a {rank: records} mapping."""
    if isinstance(records, dict):
        return [(rank, r) for rank, recs in records.items() for r in recs]
    return [(None, r) for r in records]


def _is_message(r):
    return isinstance(r, Message) or (hasattr(r, "kind") and hasattr(r, "src") and hasattr(r, "dst"))


def messages_only(records):
    """The :class:`Message` records among ``records`` (a trace also holds ``Call`` records)."""
    return [r for r in records if _is_message(r)]


def pair_messages(messages):
    """Match each send with its receive: list of (send, recv) records, in send order.

    Records match on (collective, algorithm, step, src, dst, nbytes); repeated
    keys (the same collective twice) pair up in order of start time. Records
    other than messages are ignored.
    """
    messages = messages_only(messages)
    recvs = {}
    for m in sorted(messages, key=lambda m: m.start):
        if m.kind == "recv":
            recvs.setdefault((m.collective, m.algorithm, m.step, m.src, m.dst, m.nbytes), []).append(m)
    pairs = []
    for m in sorted(messages, key=lambda m: m.start):
        if m.kind == "send":
            waiting = recvs.get((m.collective, m.algorithm, m.step, m.src, m.dst, m.nbytes))
            if waiting:
                pairs.append((m, waiting.pop(0)))
    return pairs


def derive_calls(messages):
    """Call slices from one rank's messages, for traces without call records.

    Returns a list of dicts: collective, algorithm, start, end, messages (the records).
    """
    calls = []
    for m in sorted(messages_only(messages), key=lambda m: m.start):
        cur = calls[-1] if calls else None
        key = (m.kind, m.dst if m.kind == "send" else m.src, m.step)
        # Not "the step fell back": algorithms post some receives of later steps early.
        if (cur is None or (cur["collective"], cur["algorithm"]) != (m.collective, m.algorithm)
                or key in cur["seen"]):
            cur = {"collective": m.collective, "algorithm": m.algorithm, "start": m.start,
                   "end": m.start, "messages": [], "seen": set()}
            calls.append(cur)
        cur["messages"].append(m)
        cur["seen"].add(key)
        cur["end"] = max(cur["end"], m.end if not math.isnan(m.end) else m.start)
    for c in calls:
        del c["seen"]
    return calls


def _lanes(slices):
    """Give each (start, end, payload) a lane so that slices on one lane never overlap."""
    ends, out = [], []
    for start, end, payload in sorted(slices, key=lambda s: (s[0], -s[1])):
        lane = next((i for i, e in enumerate(ends) if e <= start), None)
        if lane is None:
            lane = len(ends)
            ends.append(end)
        ends[lane] = end
        out.append((lane, start, end, payload))
    return out


def _start_time(records):
    """The earliest start among ``records`` (seconds, ``time.time()``), or None if there is none."""
    starts = [r.start for _, r in _flatten(records) if not math.isnan(r.start)]
    return min(starts) if starts else None


def trace_events(records, t0=None):
    """The Trace Event Format events for ``records`` from every rank.

    Args:
        records: Message (and call) records of all ranks, as one list, or a
            {rank: records} mapping (as :func:`gather_records` returns).
        t0 (float, optional): The time (``time.time()`` seconds) that ``ts`` counts
            from; the earliest record's start by default.

    Returns:
        list[dict]: metadata events (``"ph": "M"``: process and thread names),
        complete events (``"ph": "X"``: calls and messages) and flow events
        (``"ph": "s"``/``"f"``: send to receive).
    """
    items = _flatten(records)
    messages = {}
    calls = {}
    for rank, r in items:
        if _is_message(r):
            messages.setdefault(_owner(r), []).append(r)
        else:
            # A Call's rank is its group rank; its ranks list maps that to the global rank.
            owner, group = getattr(r, "rank", None), getattr(r, "ranks", None)
            if owner is not None and group and 0 <= owner < len(group):
                owner = group[owner]
            owner = rank if owner is None else owner
            if owner is None:
                raise ValueError("a call record without a rank: pass {rank: records} (gather_records does)")
            calls.setdefault(owner, []).append(r)
    if t0 is None:
        t0 = _start_time(records)
    if t0 is None:
        return []

    def us(t):
        return (t - t0) * 1e6

    events = []
    slice_of = {}       # id(message record) -> its complete event, for the arrows
    ranks = sorted(set(messages) | set(calls))
    for rank in ranks:
        events.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}})
        if rank in calls:
            call_slices = []
            for c in calls[rank]:
                group = getattr(c, "ranks", None) or getattr(c, "group_ranks", None)
                args = {"collective": c.collective, "algorithm": c.algorithm, "seq": getattr(c, "seq", None),
                        "bytes": getattr(c, "nbytes", None), "group ranks": list(group) if group else None}
                call_slices.append((c.start, c.end if not math.isnan(c.end) else c.start,
                                    (f"{c.collective} ({c.algorithm})", args)))
        else:
            call_slices = []
            for c in derive_calls(messages.get(rank, [])):
                sent = sum(m.nbytes for m in c["messages"] if m.kind == "send")
                recvd = sum(m.nbytes for m in c["messages"] if m.kind == "recv")
                args = {"collective": c["collective"], "algorithm": c["algorithm"], "bytes sent": sent,
                        "bytes received": recvd, "messages": len(c["messages"]), "derived": True}
                call_slices.append((c["start"], c["end"], (f"{c['collective']} ({c['algorithm']})", args)))
        message_slices = []
        for m in messages.get(rank, []):
            peer = m.dst if m.kind == "send" else m.src
            end = m.end if not math.isnan(m.end) else m.start
            arrow = f"-> {peer}" if m.kind == "send" else f"<- {peer}"
            args = {"bytes": m.nbytes, "peer": peer, "step": m.step, "collective": m.collective,
                    "algorithm": m.algorithm, "src": m.src, "dst": m.dst}
            if math.isnan(m.end):
                args["unfinished"] = True
            message_slices.append((m.start, end, (f"{m.kind} {m.nbytes} B {arrow}", args, m)))
        for first_tid, slices, label, cat in ((CALL_TID, call_slices, "collectives", "collective"),
                                             (MESSAGE_TID, message_slices, "messages", "message")):
            placed = _lanes(slices)
            for lane in sorted({p[0] for p in placed}):
                name = label if lane == 0 else f"{label} {lane + 1}"
                events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": first_tid + lane,
                               "args": {"name": name}})
                events.append({"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": first_tid + lane,
                               "args": {"sort_index": first_tid + lane}})
            for lane, start, end, payload in placed:
                ev = {"ph": "X", "name": payload[0], "cat": cat if cat == "collective" else payload[2].kind,
                      "pid": rank, "tid": first_tid + lane, "ts": us(start), "dur": max(us(end) - us(start), 0.0),
                      "args": payload[1]}
                events.append(ev)
                if cat == "message":
                    slice_of[id(payload[2])] = ev
    all_messages = [m for msgs in messages.values() for m in msgs]
    for i, (send, recv) in enumerate(pair_messages(all_messages)):
        s_ev, r_ev = slice_of.get(id(send)), slice_of.get(id(recv))
        if s_ev is None or r_ev is None:
            continue
        # The arrow leaves when the send was posted and lands inside the receive's slice,
        # just before it completes (a flow end binds to the slice enclosing its timestamp).
        land = r_ev["ts"] + max(r_ev["dur"] - min(1.0, r_ev["dur"] / 2), 0.0)
        events.append({"ph": "s", "name": "message", "cat": "message", "id": i, "pid": s_ev["pid"],
                       "tid": s_ev["tid"], "ts": s_ev["ts"]})
        events.append({"ph": "f", "bp": "e", "name": "message", "cat": "message", "id": i,
                       "pid": r_ev["pid"], "tid": r_ev["tid"], "ts": land})
    return events


def span_events(spans, t0):
    """Complete events on each rank's "program" track for ``spans`` of (rank, name, start, end).

    Spans are what the program around the collectives did (forward, backward,
    optimizer step), in ``time.time()`` seconds; ``t0`` as in :func:`trace_events`.
    """
    events = []
    for rank in sorted({s[0] for s in spans}):
        events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": SPAN_TID, "args": {"name": "program"}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": SPAN_TID,
                       "args": {"sort_index": SPAN_TID}})
    for rank, name, start, end in spans:
        events.append({"ph": "X", "name": name, "cat": "program", "pid": rank, "tid": SPAN_TID,
                       "ts": (start - t0) * 1e6, "dur": max(end - start, 0.0) * 1e6, "args": {}})
    return events


def to_chrome_trace(records, spans=()):
    """The JSON object (a dict) of :func:`export_chrome_trace`, without writing it.

    ``otherData.t0_unix_s`` is the wall-clock time that ``ts`` 0 stands for.
    """
    starts = [s[2] for s in spans]
    first = _start_time(records)
    t0 = min(starts + ([first] if first is not None else [])) if (starts or first is not None) else None
    events = trace_events(records, t0) if first is not None else []
    events += span_events(spans, t0) if spans else []
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"producer": "collectives.tools.perfetto", "t0_unix_s": t0}}


def export_chrome_trace(records, path, spans=()):
    """Write the records of every rank as Chrome/Perfetto trace JSON.

    Args:
        records: Message (and call) records of all ranks: one list (each
            message names its rank) or a {rank: records} mapping.
        path (str): The ``.json`` file to write; open it in ui.perfetto.dev
            or chrome://tracing.
        spans (list): Optional (rank, name, start, end) marks of what the
            program did around the collectives (e.g. forward, backward), drawn
            on each rank's "program" track.

    Returns:
        str: ``path``.

    Example::

        >>> export_chrome_trace(everyone, "step.json")   # everyone: records of all ranks
        'step.json'
    """
    with open(path, "w") as f:
        json.dump(to_chrome_trace(records, spans), f)
    return path


def gather_records(records, group=None, dst=0):
    """Gather every rank's trace records to ``dst`` (a collective: every rank of ``group`` calls it).

    Uses the built-in ``gather_object`` (a trace is a debugging aid, not a
    collective this package teaches).

    Returns:
        dict[int, list] on ``dst``: global rank -> its records; None on the other ranks.
    """
    me = dist.get_rank()
    n = dist.get_world_size(group)
    everyone = [None] * n if me == dst else None
    dist.gather_object((me, list(records)), everyone, dst=dst, group=group)
    if me != dst:
        return None
    return dict(everyone)


def export_all(records, path, group=None, dst=0):
    """:func:`gather_records` then, on ``dst``, :func:`export_chrome_trace`; every rank calls it.

    Returns:
        str on ``dst`` (the path written), None on the other ranks.
    """
    gathered = gather_records(records, group=group, dst=dst)
    return None if gathered is None else export_chrome_trace(gathered, path)


def check_trace(obj):
    """Raise ValueError unless ``obj`` (a dict, or a path to JSON) is a well-formed trace of this kind.

    Checks what both viewers rely on: a ``traceEvents`` list; every event has
    ``ph``, ``pid`` and ``tid``; complete events have a name, numeric ``ts``
    and ``dur`` >= 0 (microseconds); complete events on one track nest (none
    overlaps another partly); every flow start has a matching end.

    Returns:
        dict: {"slices": count of complete events, "flows": count of flow pairs, "tracks": count of tracks}.
    """
    if isinstance(obj, str):
        with open(obj) as f:
            obj = json.load(f)
    if not isinstance(obj, dict) or not isinstance(obj.get("traceEvents"), list):
        raise ValueError("a trace is a JSON object with a 'traceEvents' list")
    tracks, flows = {}, {}
    for ev in obj["traceEvents"]:
        missing = {"ph", "pid", "tid"} - set(ev)
        if missing:
            raise ValueError(f"event without {sorted(missing)}: {ev}")
        if ev["ph"] == "X":
            if not isinstance(ev.get("name"), str):
                raise ValueError(f"complete event without a name: {ev}")
            if not all(isinstance(ev.get(k), (int, float)) and math.isfinite(ev[k]) for k in ("ts", "dur")):
                raise ValueError(f"complete event needs numeric ts and dur (microseconds): {ev}")
            if ev["dur"] < 0:
                raise ValueError(f"negative duration: {ev}")
            tracks.setdefault((ev["pid"], ev["tid"]), []).append((ev["ts"], ev["ts"] + ev["dur"]))
        elif ev["ph"] in ("s", "f"):
            flows.setdefault(ev["id"], set()).add(ev["ph"])
        elif ev["ph"] != "M":
            raise ValueError(f"unexpected event phase {ev['ph']!r}")
    for key, spans in tracks.items():
        stack = []
        for start, end in sorted(spans, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1] <= start:
                stack.pop()
            if stack and end > stack[-1]:
                raise ValueError(f"slices on track pid={key[0]} tid={key[1]} overlap without nesting")
            stack.append(end)
    unpaired = [i for i, phases in flows.items() if phases != {"s", "f"}]
    if unpaired:
        raise ValueError(f"flow events without both ends: ids {unpaired[:5]}")
    return {"slices": sum(len(s) for s in tracks.values()), "flows": len(flows), "tracks": len(tracks)}
