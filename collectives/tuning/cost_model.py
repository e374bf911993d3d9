"""The alpha-beta-gamma cost model: predict an algorithm's time from its stated cost.

A message of S bytes costs ``alpha + beta * S`` (alpha: per-message latency,
beta: seconds per byte, 1/bandwidth); reducing S bytes costs ``gamma * S``.
Each algorithm module states its cost as code (``cost(n, s)``, a
:class:`~collectives.algorithms._cost.Cost`: steps, messages, bytes);
:func:`predict` turns it into seconds (Thakur, Rabenseifner and Gropp, IJHPCA
2005; Chan et al., "Collective communication: theory, practice, and
experience", 2007):

    alpha * max(steps, messages)
      + beta * max(critical_bytes, sent_bytes, recv_bytes)
      + gamma * reduced_bytes

Steps run one after another, each as long as its largest message (the
critical bytes); a rank that sends or receives many messages in one step (a
linear root) pays an alpha and its bytes for each, since one rank's messages
queue behind each other. A module whose time does not follow from that (the
pipelined ring overlaps reductions with transfers) states ``time(n, s, alpha,
beta, gamma)`` beside its cost, and that is used instead.

The simulator (``collectives.sim``) plays the same model out message by message, on
topologies with shared links; on a flat, uncontended switch, for every algorithm whose
steps wait for one another, its time equals :func:`predict`'s (``tests/test_sim.py``
holds the two equal), so ``algorithm=None`` and the simulator use one model of cost.

``size`` is the size of the call as ``collectives.algorithms._cost.SIZE_OF_CALL``
defines it for each collective (nccl-tests' convention).

:func:`fit` gets alpha and beta from ping-pong and gamma from a local
reduction, as the benchmarks measure them. Where it breaks (see
docs/benchmarks.md): more ranks than cores (a rank waiting for the CPU looks
like latency), links used in both directions at once (the ring exchange's beta
is not ping-pong's), and reductions that overlap with transfers.
"""
from ..algorithms import ALGORITHMS, MODULES, cost

# beta where a fit found none (seconds a byte): a floor, not a figure, so that 1 / beta exists.
# A report says the figure was dropped rather than print it as a bandwidth (a million GB/s).
NO_BETA = 1e-15


def rate(per_byte, digits=3):
    """A fitted beta or gamma (seconds a byte) as a rate, ``"2.500 GB/s"``, or, where the fit
    found no slope and left the floor :data:`NO_BETA`, says so instead of printing the floor
    as a million GB/s."""
    if per_byte <= NO_BETA:
        return "none fitted (no slope in these timings)"
    return f"{1e-9 / per_byte:.{digits}f} GB/s"


def fit_line(xs, ys):
    """(a, b) minimising the relative error of ``a + b * x`` (small and large sizes count alike)."""
    sw = swx = swxx = swy = swxy = 0.0
    for x, y in zip(xs, ys):
        w = 1.0 / (y * y)
        sw, swx, swxx = sw + w, swx + w * x, swxx + w * x * x
        swy, swxy = swy + w * y, swxy + w * x * y
    det = sw * swxx - swx * swx
    if det <= 0:                      # one size only: a level, no slope (the floor, as below)
        return max(ys[0], 0.0), NO_BETA
    a = (swxx * swy - swx * swxy) / det
    b = (sw * swxy - swx * swy) / det
    return max(a, 0.0), max(b, NO_BETA)


def fit(p2p_rows):
    """alpha, beta (ping-pong), alpha_ring, beta_ring (ring exchange), gamma (local reduce), in seconds."""
    sizes = [r["size"] for r in p2p_rows]
    alpha, beta = fit_line(sizes, [r["pingpong_oneway_us"] * 1e-6 for r in p2p_rows])
    alpha_ring, beta_ring = fit_line(sizes, [r["ring_exchange_us"] * 1e-6 for r in p2p_rows])
    _, gamma = fit_line(sizes, [r["reduce_us"] * 1e-6 for r in p2p_rows])
    return {"alpha": alpha, "beta": beta, "alpha_ring": alpha_ring, "beta_ring": beta_ring,
            "gamma": gamma}


def predict(collective, algorithm, n, size, params):
    """Predicted seconds for ``algorithm`` of ``collective`` on ``n`` ranks and ``size`` bytes.

    ``params`` holds ``alpha``, ``beta`` and ``gamma`` (seconds, seconds per byte).
    Raises ValueError for an algorithm that is not registered or states no cost.
    """
    a, b, g = params["alpha"], params["beta"], params["gamma"]
    c = cost(collective, algorithm, n, int(size))
    if n == 1:
        return 0.0
    # "call": seconds every call pays whatever it moves (the Python around the messages,
    # waking ranks that share cores), fitted by fit_calls; absent in ping-pong's figures
    call = params.get("call", 0.0)
    own_time = getattr(MODULES[collective][algorithm], "time", None)
    if own_time is not None:
        return call + own_time(n, int(size), a, b, g)
    messages, nbytes, reduced = _counts(c)
    return call + (a * messages + b * nbytes + g * reduced)


def _counts(c):
    """What :func:`predict` multiplies by alpha, beta and gamma in a :class:`Cost`."""
    return max(c.steps, c.messages), max(c.critical_bytes, c.sent_bytes, c.recv_bytes), c.reduced_bytes


def _terms(collective, algorithm, n, size):
    """The counts ``predict`` multiplies by call, alpha, beta and gamma (None where the
    module states its own ``time``, which is not linear in them)."""
    if getattr(MODULES[collective][algorithm], "time", None) is not None:
        return None
    return (1.0, *map(float, _counts(cost(collective, algorithm, n, int(size)))))


def _timed(rows):
    """The rows of ``rows`` that timed a registered algorithm (not a label such as the tune's
    "untuned") and took some time."""
    return [r for r in rows if r["algorithm"] in MODULES.get(r["collective"], {}) and r["time_us"] > 0]


def fit_calls(rows):
    """call, alpha, beta, gamma (seconds) that make :func:`predict` best match whole calls.

    ``rows``: measured calls of one world size, ``{"collective", "algorithm", "world_size",
    "size", "time_us"}`` (what ``benchmarks.tune`` times at every point). Ping-pong's
    figures (:func:`fit`) price a message between two ranks with the rest idle; a call of
    N ranks on fewer cores also waits for ranks to be scheduled, and pays Python per call
    and per message, so those figures under-predict it (3-10x at N = 3, 4 on 2 cores). Here
    the four figures are fitted to the calls themselves, least squares of the relative
    error, none negative (a figure that would be is dropped and the rest fitted again).
    Rows of algorithms that state their own ``time`` are left out. Returns None with fewer
    than 4 usable rows.
    """
    import numpy as np
    xs, ys = [], []
    for r in _timed(rows):
        t = _terms(r["collective"], r["algorithm"], r["world_size"], r["size"])
        if t is not None:
            xs.append(t)
            ys.append(r["time_us"] * 1e-6)
    if len(xs) < 4:
        return None
    x, y = np.array(xs), np.array(ys)
    w = 1.0 / y
    keep = [0, 1, 2, 3]
    while True:
        sol, *_ = np.linalg.lstsq(x[:, keep] * w[:, None], y * w, rcond=None)
        if (sol >= 0).all() or len(keep) == 1:
            break
        keep = [k for k, v in zip(keep, sol) if v > 0] or [0]
    found = dict.fromkeys(("call", "alpha", "beta", "gamma"), 0.0)
    for k, v in zip(keep, sol):
        found[("call", "alpha", "beta", "gamma")[k]] = max(float(v), 0.0)
    found["beta"] = max(found["beta"], NO_BETA)
    return found


def fit_algorithms(rows, calls):
    """Each algorithm's own figures: ``{collective: {algorithm: {call, alpha, beta, gamma}}}``.

    ``rows``: measured calls of one world size, as :func:`fit_calls` takes them; ``calls``:
    the figures :func:`fit_calls` found for all of them together. One set of figures for every
    algorithm is a compromise: at N = 4 on 2 cores it priced a 4 KiB call of the Bine tree
    (4 messages) at 761 us where the tune timed 472 us, and the ring (6 messages) at 1,047 us
    where it timed 1,248, because a message's cost is not the same in every algorithm (how
    many ranks wake at once, whether a reduction waits on a copy). So, as NCCL keeps a
    latency and a bandwidth per algorithm and protocol, each algorithm timed at two sizes or
    more gets its own: a cost per call ``c`` and a factor ``k`` on the rest of ``calls``,
    ``time = c + k * predict(calls without its per-call cost)``, least squares of the relative
    error, neither negative (a ``c`` that would be is 0 and ``k`` fitted alone). Returned as
    whole figure sets (``alpha = k * calls["alpha"]``, ...), so :func:`predict` prices an
    algorithm with its own set as it prices any other.
    """
    import numpy as np
    rest = dict(calls, call=0.0)
    found = {}
    by_algorithm = {}
    for r in _timed(rows):
        by_algorithm.setdefault((r["collective"], r["algorithm"]), []).append(r)
    for (collective, algorithm), rs in by_algorithm.items():
        if len({r["size"] for r in rs}) < 2:
            continue
        x = np.array([predict(collective, algorithm, r["world_size"], r["size"], rest) for r in rs])
        y = np.array([r["time_us"] * 1e-6 for r in rs])
        w = 1.0 / y
        (c, k), *_ = np.linalg.lstsq(np.stack([np.ones_like(x), x], 1) * w[:, None], y * w, rcond=None)
        if c < 0 or k <= 0:
            c, k = 0.0, float(np.sum(w * w * x * y) / np.sum(w * w * x * x))
        if not (k > 0 and np.isfinite(k)):
            continue
        found.setdefault(collective, {})[algorithm] = {
            "call": float(c), "alpha": k * calls["alpha"], "beta": k * calls["beta"],
            "gamma": k * calls["gamma"]}
    return found


def best(collective, algorithms, n, size, params):
    """The algorithm with the smallest predicted time."""
    times = {name: predict(collective, name, n, size, params) for name in algorithms}
    return min(times, key=times.get) if times else None


def table(collective, n, size, notes=None):
    """A markdown table of every algorithm's stated cost for ``n`` ranks and ``size`` bytes.

    Bytes are given as multiples of S = ``size``; ``notes`` ({algorithm: text})
    adds a last column. Chapter 5's table is this one (tests/test_cost.py checks).

    Example::

        >>> print(table("all_reduce", 4, 1 << 20))
        | algorithm | steps | messages per rank | bytes sent per rank | bytes on the critical path | extra memory |
        |---|---|---|---|---|---|
        | `naive_ring` | 3 | 3 | 3 S | 3 S | 4 S |
        ...
    """

    head = ["algorithm", "steps", "messages per rank", "bytes sent per rank",
            "bytes on the critical path", "extra memory"] + (["wins when"] if notes else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    times_s = lambda b: f"{b / size:g} S" if b else "0"  # noqa: E731
    for name in ALGORITHMS[collective]:
        c = cost(collective, name, n, size)
        row = [f"`{name}`", str(c.steps), str(c.messages), times_s(c.sent_bytes),
               times_s(c.critical_bytes), times_s(c.extra_memory)]
        if notes:
            row.append(notes.get(name, ""))
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)

