"""``python -m collectives.viz --all -n 2-64``: every registered algorithm, and every parallelism's
schedule, drawn at every N, checked.

The issue's promise is that any algorithm renders for any world of 2 to 64 ranks in a page a
browser opens at once. This draws each page (the simulator's run, the page's data, the HTML
text) and checks what can be checked without a browser:

* the page is at most :data:`collectives.viz.render.MAX_PAGE_BYTES` (2 MB) up to 64 ranks;
* the run ended right: no deadlock, no wrong chunk (a registered algorithm's page that says
  otherwise is a bug of the lab or of the algorithm);
* the page's bytes and messages per rank are exactly ``count_traffic``'s, each rank's counter
  listening to the same run.

The parallelisms' pages (:mod:`.schedules`: FSDP's gathers and reduce-scatters, MoE's uneven
all_to_all, ring attention's rotation, and GPipe and 1F1B on N stages of ``max(4, N)``
micro-batches) are checked the same way; a pipeline's page is drawn from the schedule itself
(no simulator, so no counter listens), so it is checked against its closed forms instead: each
stage sends m activations down and m gradients up (the first and last stage one of them), and
the bubble it counts from the slots is (p-1)/(m+p-1).

It reports how many pages, the slowest and the largest, and the total time; the browser tests
(``tests/test_viz_browser.py``) check that a browser shows those counters.
"""
import contextlib
import time

from .. import observers
from ..algorithms import REGISTRY
from . import model, record, render, schedules

# the parallelisms' pages, as (what, variant): the name --all takes, and the schedule for pipeline
PARALLEL = {"fsdp": ("ring",), "moe": ("uneven_all_to_all",), "ring_attention": ("rotation",),
            "pipeline": ("gpipe", "1f1b")}


def cases(sizes, collective=None, algorithm=None):
    """(collective, algorithm, N) for every registered algorithm (or the one named) at each N,
    then every parallelism's schedule (:data:`PARALLEL`) when no collective is named, or the one named."""
    for c, algs in [*REGISTRY.items(), *PARALLEL.items()]:
        if collective not in (None, c):
            continue
        for a in algs:
            if algorithm not in (None, a):
                continue
            for n in sizes:
                yield c, a, n


def micro_batches(n):
    """The micro-batches of the pipeline drawn on ``n`` stages: at least as many as stages (1F1B's
    steady state), so the bubble is the formula's."""
    return max(4, n)


def pipeline_problems(d, p, m):
    """What is wrong with a pipeline page, against the closed forms of :mod:`collectives.parallel.pipeline`."""
    from ..parallel.pipeline import bubble_fraction
    problems = []
    want = [((m if s < p - 1 else 0) + (m if s > 0 else 0)) for s in range(p)]
    sent = [sum(1 for x in d["msgs"] if x[0] == s) for s in range(p)]
    received = [sum(1 for x in d["msgs"] if x[1] == s) for s in range(p)]
    if sent != want or received != want:
        problems.append(f"messages per stage sent {sent} and received {received}, not {want}")
    if abs(d["bubble"] - bubble_fraction(p, m)) > 1e-12:
        problems.append(f"bubble counted {d['bubble']:.6f}, the formula's {bubble_fraction(p, m):.6f}")
    return problems


def shown_counters(d):
    """Per rank, (sent bytes, received bytes, sent messages, received messages) as the page's
    last frame shows them (the page sums its messages, as this does)."""
    out = [[0, 0, 0, 0] for _ in range(d["n"])]
    for m in d["msgs"]:
        src, dst, nbytes = m[0], m[1], m[3]
        out[src][0] += nbytes
        out[src][2] += 1
        out[dst][1] += nbytes
        out[dst][3] += 1
    return [tuple(row) for row in out]


def check(collective, algorithm, n, topology="ethernet-100g"):
    """Draw one page and check it.

    Returns:
        (row, html text): ``row`` holds ``collective``, ``algorithm``, ``n``, ``seconds`` (to
        record, build and render, the counters listening), ``bytes`` (the page's, UTF-8) and
        ``problems`` (what is wrong with it, in words; empty for a good page).
    """
    start = time.perf_counter()
    with contextlib.ExitStack() as stack:
        counters = [stack.enter_context(observers.count_traffic(rank=r)) for r in range(n)]
        if collective == "pipeline":
            d = schedules.pipeline(n, micro_batches(n), algorithm)
        elif collective in PARALLEL:
            d = schedules.PARALLELISMS[collective](n, topology=topology)
        else:
            d = model.build(record.record(collective, algorithm, n, topology))
    text = render.html(d)
    seconds = time.perf_counter() - start
    size = len(text.encode())
    problems = []
    if n <= record.DETAIL_RANKS and size > render.MAX_PAGE_BYTES:
        problems.append(f"{size} bytes, more than {render.MAX_PAGE_BYTES}")
    if d["failure"]:
        problems.append(f"the run failed: {d['failure']['report'].splitlines()[0]}")
    if d["wrong"]:
        problems.append(f"a wrong chunk: {d['wrong']['text']}")
    counted = [(c.sent_bytes, c.recv_bytes, c.sent_messages, c.recv_messages) for c in counters]
    if collective == "pipeline":
        problems += pipeline_problems(d, n, micro_batches(n))
    elif shown_counters(d) != counted:
        problems.append("the page's counters differ from count_traffic's")
    return dict(collective=collective, algorithm=algorithm, n=n, seconds=seconds, bytes=size,
                problems=problems), text


def span(sizes):
    """``2..64`` for a run of consecutive sizes, else the list."""
    sizes = sorted(set(sizes))
    if len(sizes) > 2 and sizes == list(range(sizes[0], sizes[-1] + 1)):
        return f"{sizes[0]}..{sizes[-1]}"
    return ",".join(map(str, sizes))


def run(sizes, collective=None, algorithm=None, topology="ethernet-100g", out=None, say=print):
    """Check every page of :func:`cases`; write each into the folder ``out`` when given.

    Returns:
        (rows, summary text): one row per page (:func:`check`'s), and what to print at the end:
        the count, the slowest and the largest page, the total time, and every problem.
    """
    from pathlib import Path
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
    rows, start = [], time.perf_counter()
    current, mine = None, []

    def close(group):
        if group:
            big = max(group, key=lambda r: r["bytes"])
            bad = sum(1 for r in group if r["problems"])
            say(f"{group[0]['collective']}/{group[0]['algorithm']}: N = {span(r['n'] for r in group)}, "
                f"{len(group)} pages in {sum(r['seconds'] for r in group):.1f} s, largest {big['bytes']} bytes "
                f"(N={big['n']})" + (f", {bad} with problems" if bad else ""))
    for c, a, n in cases(sizes, collective, algorithm):
        if (c, a) != current:
            close(mine)
            current, mine = (c, a), []
        row, text = check(c, a, n, topology)
        if out is not None:
            (Path(out) / f"{c}_{a}_{n}.html").write_text(text, encoding="utf-8")
        rows.append(row)
        mine.append(row)
    close(mine)
    total = time.perf_counter() - start
    if not rows:
        return rows, "no page: nothing matched"
    slow = max(rows, key=lambda r: r["seconds"])
    big = max(rows, key=lambda r: r["bytes"])
    bad = [r for r in rows if r["problems"]]
    kinds = {(r["collective"], r["algorithm"]) for r in rows}
    lines = [f"checked {len(rows)} pages ({len(kinds)} algorithms and schedules of {len({c for c, _ in kinds})} "
             f"collectives and parallelisms "
             f"x N = {span(r['n'] for r in rows)}) in {total:.1f} s" +
             (f", written to {out}" if out is not None else ", none written (-o FOLDER writes them)"),
             f"  slowest: {slow['collective']}/{slow['algorithm']} N={slow['n']}, {slow['seconds']:.2f} s",
             f"  largest: {big['collective']}/{big['algorithm']} N={big['n']}, {big['bytes']} bytes "
             f"(bound {render.MAX_PAGE_BYTES} up to {record.DETAIL_RANKS} ranks)"]
    if bad:
        lines.append(f"  {len(bad)} page(s) with problems:")
        lines += [f"    {r['collective']}/{r['algorithm']} N={r['n']}: {'; '.join(r['problems'])}" for r in bad[:20]]
    else:
        lines.append("  every page: at most the bound, ended right, its counters equal to count_traffic's "
                     "(a pipeline's: to its closed forms, its bubble to (p-1)/(m+p-1))")
    return rows, "\n".join(lines)
