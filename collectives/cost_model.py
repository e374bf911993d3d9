"""The alpha-beta-gamma cost model: predict an algorithm's time from its card.

A message of S bytes costs ``alpha + beta * S`` (alpha: per-message latency,
beta: seconds per byte, 1/bandwidth); reducing S bytes costs ``gamma * S``.
Each algorithm's card states its steps and bytes; :func:`predict` turns them
into seconds (Thakur, Rabenseifner and Gropp, IJHPCA 2005; Chan et al.,
"Collective communication: theory, practice, and experience", 2007).

Sizes follow nccl-tests (and ``collectives.bench``): ``size`` is the tensor
for all_reduce, broadcast and reduce, the whole output for all_gather and
gather, the whole input for reduce_scatter, scatter and all_to_all; one rank's
piece is m = size / N. P is the largest power of two <= N, E = N - P ranks
fold into it, L = ceil(log2 N). A root that posts N-1 messages at once
("linear") still pays N-1 alphas: alpha is mostly the sender's CPU time per
message, and one rank's messages queue behind each other.

:func:`fit` gets alpha and beta from ping-pong and gamma from a local
reduction, as ``collectives.bench`` measures them. Where it breaks (see
docs/benchmarks.md): more ranks than cores (a rank waiting for the CPU looks
like latency), links used in both directions at once (the ring exchange's beta
is not ping-pong's), and reductions that overlap with transfers (pipelined
algorithms hide most of gamma).
"""
import math

from .algorithms import all_reduce_ring_pipelined, broadcast_pipeline
from .algorithms._util import fold


def fit_line(xs, ys):
    """(a, b) minimising the relative error of ``a + b * x`` (small and large sizes count alike)."""
    sw = swx = swxx = swy = swxy = 0.0
    for x, y in zip(xs, ys):
        w = 1.0 / (y * y)
        sw, swx, swxx = sw + w, swx + w * x, swxx + w * x * x
        swy, swxy = swy + w * y, swxy + w * x * y
    det = sw * swxx - swx * swx
    if det <= 0:
        return max(ys[0], 0.0), 0.0
    a = (swxx * swy - swx * swxy) / det
    b = (sw * swxy - swx * swy) / det
    return max(a, 0.0), max(b, 1e-15)


def fit(p2p_rows):
    """alpha, beta (ping-pong), alpha_ring, beta_ring (ring exchange), gamma (local reduce), in seconds."""
    sizes = [r["size"] for r in p2p_rows]
    alpha, beta = fit_line(sizes, [r["pingpong_oneway_us"] * 1e-6 for r in p2p_rows])
    alpha_ring, beta_ring = fit_line(sizes, [r["ring_exchange_us"] * 1e-6 for r in p2p_rows])
    _, gamma = fit_line(sizes, [r["reduce_us"] * 1e-6 for r in p2p_rows])
    return {"alpha": alpha, "beta": beta, "alpha_ring": alpha_ring, "beta_ring": beta_ring,
            "gamma": gamma}


def predict(collective, algorithm, n, size, params):
    """Predicted seconds for ``algorithm`` of ``collective`` on ``n`` ranks and ``size`` bytes."""
    a, b, g = params["alpha"], params["beta"], params["gamma"]
    s = float(size)
    m = s / n
    p, e = fold(n)
    lp = p.bit_length() - 1          # log2 P
    lg = math.ceil(math.log2(n)) if n > 1 else 0
    if n == 1:
        return 0.0
    key = (collective, algorithm)
    if key == ("all_reduce", "ring"):
        return 2 * (n - 1) * a + 2 * (n - 1) * m * b + (n - 1) * m * g
    if key == ("all_reduce", "ring_pipelined"):
        k = max(1, min(all_reduce_ring_pipelined.MAX_SEGMENTS,
                       math.ceil(m / all_reduce_ring_pipelined.SEGMENT_BYTES)))
        seg = m / k
        # Reduction of segment j overlaps with the transfer of j+1: per step, the slower of the two.
        return (2 * (n - 1) * k * a + (n - 1) * m * max(b, g) + seg * min(b, g)
                + (n - 1) * m * b)
    if key == ("all_reduce", "naive_ring"):
        return (n - 1) * (a + s * b + s * g)
    if key == ("all_reduce", "recursive_doubling"):
        fold_cost = (2 * (a + s * b) + s * g) if e else 0.0
        return lp * (a + s * b + s * g) + fold_cost
    if key == ("all_reduce", "rabenseifner"):
        fold_cost = (2 * (a + s * b) + s * g) if e else 0.0
        return 2 * lp * a + 2 * (p - 1) / p * s * b + (p - 1) / p * s * g + fold_cost
    if key == ("all_reduce", "tree"):
        return lg * (a + s * b + s * g) + lg * (a + s * b)
    if collective == "broadcast":
        if algorithm == "linear":
            return (n - 1) * (a + s * b)
        if algorithm == "binomial_tree":
            return lg * (a + s * b)
        if algorithm == "pipeline":
            k = max(1, math.ceil(s / broadcast_pipeline.SEGMENT_BYTES))
            return (n - 2 + k) * (a + s / k * b)
        if algorithm == "scatter_allgather":
            return lg * a + (n - 1) * m * b + (n - 1) * (a + m * b)
    if collective == "reduce":
        if algorithm == "linear":
            return (n - 1) * (a + s * (b + g))
        if algorithm == "binomial_tree":
            return lg * (a + s * b + s * g)
    if collective == "all_gather":
        if algorithm == "ring":
            return (n - 1) * (a + m * b)
        if algorithm == "recursive_doubling":
            fold_cost = (2 * a + m * b + s * b) if e else 0.0
            return lp * a + (p - 1) * m * b + fold_cost
    if collective == "reduce_scatter":
        if algorithm == "ring":
            return (n - 1) * (a + m * b + m * g)
        if algorithm == "recursive_halving":
            fold_cost = (2 * a + s * (b + g) + m * b) if e else 0.0
            return lp * a + (p - 1) / p * s * (b + g) + fold_cost
    if collective == "all_to_all":
        if algorithm == "linear":
            return (n - 1) * (a + m * b)
        if algorithm == "pairwise":
            return (n - 1) * (a + m * b)
    if collective in ("gather", "scatter"):
        if algorithm == "linear":
            return (n - 1) * (a + m * b)
        if algorithm == "binomial_tree":
            return lg * a + (n - 1) * m * b
    if collective == "barrier":
        return lg * a
    return float("nan")


def best(collective, algorithms, n, size, params):
    """The algorithm with the smallest predicted time."""
    times = {name: predict(collective, name, n, size, params) for name in algorithms}
    times = {k: v for k, v in times.items() if not math.isnan(v)}
    return min(times, key=times.get) if times else None
