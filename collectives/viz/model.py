"""From a recorded run to the page's data: frames, provenance, counters, links, questions.

A *frame* is one logical step (the ``step`` the algorithm gave its messages): the buffers as
each rank held them when it posted that step, and the step's messages in flight. The last
frame is the end (or, on a deadlock, where the ranks froze). Counters at frame f count the
messages of steps up to f, so the last frame's are exactly ``count_traffic``'s.
"""
from .questions import collective_questions


def _frames(rec):
    n = rec["n"]
    steps = sorted({m["step"] for m in rec["messages"]} | {s for snaps in rec["snapshots"] for _, s, _ in snaps})
    index = {s: i for i, s in enumerate(steps)}
    frames = len(steps)
    # rank r at frame f shows its latest post (in its own order) among those of steps up to f, else
    # its first post's buffers, else its final ones: one pass per rank, not one per frame and rank
    columns = []
    for r in range(n):
        snaps = rec["snapshots"][r]
        latest = [-1] * frames          # per frame: the last post made at that frame's step
        for i, (_, s, _) in enumerate(snaps):
            latest[index[s]] = i
        column, best = [], -1
        for f in range(frames):
            best = max(best, latest[f])
            column.append(snaps[best][2] if best >= 0 else (snaps[0][2] if snaps else rec["final"][r]))
        columns.append(column)
    states = [[columns[r][f] for r in range(n)] for f in range(frames)]
    states.append(rec["final"])
    return steps, index, states


def _concurrency(msgs, links):
    """Per link: the most messages on it at once."""
    edges = {link: [] for link in links}
    for m in msgs:
        for link in m["links"]:
            if link in edges:
                edges[link] += [(m["start"], 1), (m["end"], -1)]
    most = {}
    for link, marks in edges.items():
        now = best = 0
        for _, d in sorted(marks):     # at one instant an end (-1) before a start: back to back is not at once
            now += d
            best = max(best, now)
        most[link] = best
    return most


def _wrong(rec, steps, index, decode):
    """The first chunk whose provenance went wrong: dict(text, frame, rank, cell), or None.

    First in simulated time: a contribution arriving twice (in a buffer, or in a message on
    its way); else, at the end, a cell whose contributions are not the ones promised."""
    n = rec["n"]
    if rec["mode"] is None or rec["failure"]:
        return None
    seen = {}

    def twice(v):
        if v not in seen:
            seen[v] = [(q, k) for q, k in decode(v).items() if k > 1]
        return seen[v]
    events = []
    for t, r, cell, cells, step, values in rec["notes"]:
        if cells:
            c = cell + cells[0] if cell is not None else -1
            many = twice(values[cells[0]]) if rec["mode"] == "nibbles" else []
            who = f"rank {many[0][0]}'s contribution is counted {many[0][1]} times" if many else \
                f"rank {min(decode(values[cells[0]]))}'s contribution arrives a second time"
            where = f"cell {c} of its output" if cell is not None else "a buffer of its own (not its output)"
            events.append((t, index.get(step, 0), r, c, f"rank {r}, {where}: {who} here"))
    if rec["mode"] == "nibbles":     # a sum shows a second arrival as a digit of 2
        for r in range(n):
            for t, s, values in rec["snapshots"][r]:
                for c, v in enumerate(values):
                    if twice(v):
                        q, k = twice(v)[0]
                        events.append((t, index[s], r, c, f"rank {r}, cell {c}: rank {q}'s contribution is "
                                                              f"counted {k} times here"))
                        break
        for m in rec["messages"]:
            for v in m["values"] or ():
                if twice(v):
                    q, k = twice(v)[0]
                    events.append((m["start"], index[m["step"]], m["src"], m["src_cell"] or 0,
                                   f"the message rank {m['src']} sends rank {m['dst']} at step {m['step']} counts "
                                   f"rank {q}'s contribution {k} times"))
                    break
    if events:
        # a simulated clock orders every rank's events; a measured one only up to each process's
        # scheduling, so there the step the ranks agree on comes first, then the rank
        first = (lambda e: (e[1], e[2], e[0], e[3])) if rec.get("clock") == "measured" else None
        t, f, r, c, text = min(events, key=first)
        return dict(text=text, frame=f, rank=r, cell=c)
    for r in range(n):
        for c, (v, w) in enumerate(zip(rec["final"][r], rec["want"][r])):
            if w is None:
                continue
            got = decode(v)
            if set(got) != w or any(k != 1 for k in got.values()):
                missing, extra = sorted(w - set(got)), sorted(set(got) - w)
                many = [(q, k) for q, k in got.items() if k > 1]
                what = (f"rank {missing[0]}'s contribution is missing" if missing else
                        f"rank {extra[0]}'s contribution should not be here" if extra else
                        f"rank {many[0][0]}'s contribution is counted {many[0][1]} times")
                return dict(text=f"rank {r}, cell {c}: {what} at the end", frame=len(steps), rank=r, cell=c)
    return None


def build(rec):
    """The page's data (plain JSON values) for a recording from :func:`record.record`."""
    from .record import decode, key
    n, fabric = rec["n"], rec["fabric"]
    steps, index, states = _frames(rec)
    dec = lambda v: decode(v, rec["mode"], n)  # noqa: E731
    provs, pid = [], {}

    def prov(v):
        k = key(v)
        if k not in pid:
            pid[k] = len(provs)
            provs.append(k)
        return pid[k]
    init = [[prov(v) for v in row] for row in states[0]]
    changes = []
    for f in range(1, len(states)):
        ch = []
        for r in range(n):
            before, now = states[f - 1][r], states[f][r]
            for c, v in enumerate(now):
                if c >= len(before) or before[c] != v:
                    ch += [r, c, prov(v)]
        changes.append(ch)
    link_ids = sorted({link for m in rec["messages"] for link in m["links"]})
    flows = _concurrency(rec["messages"], link_ids)
    msgs = []
    for m in rec["messages"]:
        carried = m["values"]
        p = prov(carried[0]) if carried else -1
        msgs.append([m["src"], m["dst"], index[m["step"]], m["nbytes"], m["start"], m["end"], p,
                     -1 if m["src_cell"] is None else m["src_cell"], -1 if m["dst_cell"] is None else m["dst_cell"],
                     m["cells"], [link_ids.index(x) for x in m["links"]]])
    from .layout import draw
    places, ends = draw(fabric, link_ids)
    links = [dict(name=name, flows=flows[x], a=a, b=b, wrap=wrap) for x, (name, a, b, wrap) in zip(link_ids, ends)]
    from .record import STRIDE
    names = rec.get("names")
    labels = [f"{names[s // STRIDE]}, step {s % STRIDE}" if names else str(s) for s in steps]
    clock = rec.get("clock", "simulated")     # "measured": record.record_real's processes
    title = rec.get("title") or f"{rec['collective']} / {rec['algorithm']} on {n} ranks"
    data = dict(kind="collective", title=title, labels=labels,
                collective=rec["collective"], algorithm=rec["algorithm"], n=n, root=rec["root"], mode=rec["mode"],
                topology=dict(kind=rec["topology"]["kind"], text=fabric.describe() if clock == "simulated" else
                              f"measured: {n} gloo processes on one host, one thread each; the time axis is "
                              f"wall-clock microseconds after the ranks left a barrier together",
                              per=rec["topology"].get("ranks_per_node") or rec["topology"].get("ranks_per_leaf") or n),
                steps=steps, provs=provs, init=init, changes=changes, msgs=msgs, links=links, places=places,
                time=rec["time"],
                failure=rec["failure"], wrong=None, summary=rec["mode"] is None, clock=clock)
    data["wrong"] = _wrong(rec, steps, index, dec)
    # a real run's posts never waited on (record.record_real): the simulator calls an unmatched
    # post a deadlock; a real one may finish unseen, or leave a buffer read before it lands
    data["unwaited"] = [dict(rank=r, kind=kind, peer=peer, step=step, nbytes=nb)
                        for r, edges in enumerate(rec.get("unwaited") or []) for kind, peer, step, nb in edges]
    data["questions"] = collective_questions(data)
    if rec["failure"] and rec["failure"]["kind"] == "deadlock":
        from .questions import deadlock_questions
        data["questions"] += deadlock_questions(data)
    return data
