"""Pictures of traced messages (matplotlib): who sent what to whom, and when.

Every function takes the records of :func:`collectives.trace` from *all* ranks
(gather them, e.g. with ``torch.distributed.gather_object``, and concatenate):
a message appears twice, as a ``send`` on its source and a ``recv`` on its
destination. :func:`timeline` draws from the same data as the Perfetto trace
(:mod:`collectives.tools.perfetto`), and also takes such a trace. Each function draws on a given ``ax`` (or a new figure) and
returns what it drew on, so notebooks show it and scripts save it.

Example::

    >>> with collectives.trace() as messages:
    ...     collectives.all_reduce(x, algorithm="ring")
    >>> everyone = [None] * world_size
    >>> dist.all_gather_object(everyone, list(messages))
    >>> ax = collectives.tools.plot.timeline(sum(everyone, []))          # on rank 0
    >>> ax.figure.savefig("ring.png")
"""
import json

import matplotlib.pyplot as plt
from matplotlib.colors import ListedColormap

from . import perfetto


def _axes(ax, figsize):
    if ax is None:
        _, ax = plt.subplots(figsize=figsize, constrained_layout=True)
    return ax


def ranks_of(messages):
    """Every rank that sent or received one of ``messages`` (other records are ignored)."""
    messages = perfetto.messages_only(messages)
    return sorted({m.src for m in messages} | {m.dst for m in messages})


def _as_trace(data):
    """A Chrome trace dict from records, a {rank: records} mapping, a trace dict or a path to one."""
    if isinstance(data, str):
        with open(data) as f:
            return json.load(f)
    if isinstance(data, dict) and "traceEvents" in data:
        return data
    return perfetto.to_chrome_trace(data)


def timeline(messages, ax=None, title=None, color_by="step", events=()):
    """Sequence diagram: one lane per rank, one arrow per message, from send to arrival.

    Drawn from the same data a Perfetto trace holds (:mod:`collectives.tools.perfetto`):
    thin bars on a lane show how long that rank's send (above the lane) or
    receive (below) was outstanding, grey boxes behind them the collective
    calls, outlined boxes at the top of a lane the spans the program marked
    (forward, backward, ...), and arrows the flows from each send to its receive. Bars and arrows
    are coloured by ``color_by`` ("step" or "collective").

    Args:
        messages: Trace records from all ranks (a list, or {rank: records}), or a
            trace written by :func:`collectives.tools.perfetto.export_chrome_trace`
            (its dict, or the path to the JSON file).
        ax (matplotlib Axes, optional): Where to draw; a new figure if None.
        title (str, optional): Axes title.
        color_by (str): "step" (one colour per algorithm step) or "collective".
        events (list[tuple]): Optional ``(rank, time, label)`` marks drawn on the
            lanes, e.g. when backward ended (``time`` in ``time.time()`` seconds).

    Returns:
        The Axes.
    """
    ax = _axes(ax, (9, 3.5))
    trace = _as_trace(messages)
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    sends_recvs = [e for e in slices if e["cat"] in ("send", "recv")]
    if not sends_recvs:
        ax.set_title(title or "no messages")
        return ax
    t0_unix = trace.get("otherData", {}).get("t0_unix_s") or 0.0
    shift = min([0.0] + [(e[1] - t0_unix) * 1e3 for e in events])

    def ms(ts_us):
        return ts_us / 1e3 - shift
    ranks = sorted({e["pid"] for e in slices})
    lane = {r: i for i, r in enumerate(ranks)}
    keys = sorted({e["args"][color_by] for e in sends_recvs}, key=str)
    cmap = plt.get_cmap("tab10" if len(keys) <= 10 else "tab20")
    colour = {k: cmap(i % cmap.N) for i, k in enumerate(keys)}
    for e in slices:
        if e["cat"] == "collective":
            ax.add_patch(plt.Rectangle((ms(e["ts"]), lane[e["pid"]] - 0.3), e["dur"] / 1e3, 0.6,
                                       color="0.85", zorder=0, lw=0))
        elif e["cat"] == "program":      # spans the program marked (perfetto.span_events)
            ax.add_patch(plt.Rectangle((ms(e["ts"]), lane[e["pid"]] - 0.45), e["dur"] / 1e3, 0.12,
                                       facecolor="none", edgecolor="0.4", lw=0.8, zorder=1))
            ax.text(ms(e["ts"]) + e["dur"] / 2e3, lane[e["pid"]] - 0.39, e["name"].split(" (")[0],
                    ha="center", va="center", fontsize=6, color="0.3", clip_on=True)
    for e in sends_recvs:
        y = lane[e["pid"]] + (0.08 if e["cat"] == "send" else -0.08)
        ax.plot([ms(e["ts"]), ms(e["ts"] + e["dur"])], [y, y], color=colour[e["args"][color_by]],
                lw=3, alpha=0.35, solid_capstyle="butt")
    flows = {}
    for e in trace["traceEvents"]:
        if e["ph"] in ("s", "f"):
            flows.setdefault(e["id"], {})[e["ph"]] = e
    send_at = {(e["pid"], e["tid"], e["ts"]): e for e in sends_recvs if e["cat"] == "send"}
    for flow in flows.values():
        start, end = flow["s"], flow["f"]
        send = send_at.get((start["pid"], start["tid"], start["ts"]))
        colour_key = send["args"][color_by] if send else keys[0]
        ax.annotate("", xy=(ms(end["ts"]), lane[end["pid"]]), xytext=(ms(start["ts"]), lane[start["pid"]]),
                    arrowprops=dict(arrowstyle="->", color=colour[colour_key], lw=1.2))
    handles = [plt.Line2D([], [], color=colour[k], lw=3) for k in keys]
    labels = [f"{color_by} {k}" for k in keys]
    markers = dict(zip(sorted({e[2] for e in events}), "^vsDo*"))
    for label, marker in markers.items():
        pts = [((t - t0_unix) * 1e3 - shift, lane[r]) for r, t, lab in events if lab == label and r in lane]
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker=marker, color="black", s=40, zorder=3)
        handles.append(plt.Line2D([], [], marker=marker, color="black", ls=""))
        labels.append(label)
    ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small",
              frameon=False)
    ax.set_yticks(range(len(ranks)), [f"rank {r}" for r in ranks])
    ax.set_ylim(len(ranks) - 0.5, -0.5)
    ax.set_xlabel("time (ms)")
    ax.set_title(title or "messages per rank")
    ax.grid(axis="x", alpha=0.3)
    ax.autoscale_view()
    return ax


def ring_schedule(n, step, src):
    """Chunk that rank ``src`` sends at ``step`` of ring all_reduce (see all_reduce_ring's card)."""
    if step < n - 1:
        return (src - step - 1) % n          # reduce-scatter
    return (src - (step - (n - 1))) % n      # all-gather


def ring_ownership(messages, fig=None):
    """Grid per step of ring all_reduce: how many ranks' data each rank's copy of each chunk holds.

    Rows are ranks, columns chunks; a cell reads k when that copy is the sum of k
    ranks' inputs (N: finished). The outlined cell in each row is the chunk that
    rank sends in that step. Built from the trace's ring all_reduce sends: who
    sent to whom at each step; which chunk follows from the ring's schedule.

    Args:
        messages (list[Message]): Trace records from all ranks of one ring all_reduce.
        fig (matplotlib Figure, optional): Where to draw.

    Returns:
        (fig, states): the figure and, per step, the N x N grid of counts after it.
    """
    sends = [m for m in perfetto.messages_only(messages) if m.kind == "send" and m.collective == "all_reduce"
             and m.algorithm == "ring"]
    n = len(ranks_of(sends))
    steps = sorted({m.step for m in sends})
    holds = [[{r} for _ in range(n)] for r in range(n)]          # holds[rank][chunk]
    states = [[[len(h) for h in row] for row in holds]]
    sent_by_step = []
    for step in steps:
        moved = [(m.src, m.dst, ring_schedule(n, step, m.src)) for m in sends if m.step == step]
        snapshot = [[set(h) for h in row] for row in holds]
        for src, dst, chunk in moved:
            holds[dst][chunk] |= snapshot[src][chunk]
        states.append([[len(h) for h in row] for row in holds])
        sent_by_step.append({src: chunk for src, _, chunk in moved})
    panels = len(states)
    cols = min(panels, 4)
    rows = (panels + cols - 1) // cols
    if fig is None:
        fig = plt.figure(figsize=(2.3 * cols, 2.3 * rows + 0.4), constrained_layout=True)
    cmap = ListedColormap(plt.get_cmap("Blues")([0.15 + 0.8 * i / max(n - 1, 1) for i in range(n)]))
    axes = fig.subplots(rows, cols, squeeze=False)
    for i, ax in enumerate(axes.flat):
        if i >= panels:
            ax.axis("off")
            continue
        grid = states[i]
        ax.imshow(grid, cmap=cmap, vmin=0.5, vmax=n + 0.5)
        for r in range(n):
            for c in range(n):
                ax.text(c, r, grid[r][c], ha="center", va="center",
                        color="white" if grid[r][c] > n / 2 else "black", fontsize=9)
        if i == 0:
            ax.set_title("start", fontsize=9)
        else:
            phase = "reduce-scatter" if steps[i - 1] < n - 1 else "all-gather"
            ax.set_title(f"after step {steps[i - 1]} ({phase})", fontsize=9)
            for r, c in sent_by_step[i - 1].items():
                ax.add_patch(plt.Rectangle((c - 0.5, r - 0.5), 1, 1, fill=False, ec="orange", lw=2))
        ax.set_xticks(range(n), ["abcdefghijklmnop"[c] if c < 16 else str(c) for c in range(n)],
                      fontsize=8)
        ax.set_yticks(range(n), [f"r{r}" for r in range(n)], fontsize=8)
    fig.suptitle(f"ring all_reduce on {n} ranks: ranks' inputs summed into each copy of each chunk "
                 f"(outlined: chunk sent in that step)", fontsize=9)
    return fig, states[1:]


def bytes_per_rank(traces, ax=None, title=None):
    """Grouped bars: bytes each rank sent, per algorithm.

    Args:
        traces (dict[str, list[Message]]): Label (e.g. algorithm) -> trace records from all ranks.
        ax (matplotlib Axes, optional): Where to draw.
        title (str, optional): Axes title.

    Returns:
        The Axes.
    """
    ax = _axes(ax, (8, 3.2))
    labels = list(traces)
    ranks = sorted({r for msgs in traces.values() for r in ranks_of(msgs)})
    width = 0.8 / max(len(ranks), 1)
    cmap = plt.get_cmap("viridis")
    for j, r in enumerate(ranks):
        sent = [sum(m.nbytes for m in perfetto.messages_only(traces[label]) if m.kind == "send" and m.src == r)
                for label in labels]
        ax.bar([i + (j - (len(ranks) - 1) / 2) * width for i in range(len(labels))], sent, width,
               label=f"rank {r}", color=cmap(j / max(len(ranks) - 1, 1)))
    ax.set_xticks(range(len(labels)), labels)
    ax.set_ylabel("bytes sent")
    ax.legend(fontsize="small", ncol=len(ranks), frameon=False)
    ax.set_title(title or "bytes sent per rank")
    ax.grid(axis="y", alpha=0.3)
    return ax
