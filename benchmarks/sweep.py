"""Every algorithm of every collective against the built-in, nccl-tests style.

Usage::

    python -m benchmarks.sweep                                   # 4 collectives, N=2, 4K..16M
    python -m benchmarks.sweep -b 16M -e 64M -f 4 --collective all_reduce --world-size 2,4 -n 20
    python -m benchmarks.sweep --collective all_reduce --algorithm ring,builtin -b 4K -e 4K --world-size 8
    python -m benchmarks.sweep --model ...                       # also fit alpha-beta-gamma, predict each row
    torchrun --nproc-per-node 4 -m benchmarks.sweep -b 1M -e 1M  # the world torchrun started
    python -m benchmarks.sweep --lab hosts=4,rate=1gbit --collective all_reduce --world-size 4 -b 64K -e 64M

Flags as in nccl-tests: ``-b``/``-e`` smallest/largest size, ``-f`` step
factor (``-i`` step increment when ``-f 1``), ``-n`` timed iterations, ``-w``
warmup iterations, ``-c 0/1`` check results, ``-o`` reduction op, ``-d``
datatype. Ours: ``--collective``, ``--algorithm`` (names, ``builtin``,
``default`` = ``algorithm=None``, or ``all``), ``--world-size``, ``--transport``
(``gloo``, ``shm`` or ``auto``: how our messages travel between ranks of one host).

One row per (collective, size, algorithm), like nccl-tests' columns:
``size`` and ``count`` as nccl-tests counts them (all_gather, gather: the whole
output; reduce_scatter, scatter, all_to_all: the whole input), ``type``,
``redop`` (``none`` where nothing is reduced), ``root`` (-1 where there is
none), ``time`` (us: median over iterations of the slowest rank's time per
call), ``algbw`` = size / time, ``busbw`` = algbw times nccl-tests' factor
(all_reduce 2(N-1)/N; all_gather, reduce_scatter, all_to_all, gather, scatter
(N-1)/N; broadcast, reduce 1), ``#wrong`` (elements that differ from the
closed form, summed over ranks; ``N/A`` with ``-c 0``). Then the built-in
timed in the same run and ``vs_bi``, our time over the built-in's: the median
over rounds of the two times of a round (:func:`benchmarks.common.paired_ratio`);
``cpu_bi`` is the same ratio of CPU per call, every thread of the process counted
(the built-in's work runs on gloo's threads): where ``vs_bi`` misses and the ranks
outnumber the cores, a ``cpu_bi`` as large says the call is as slow as the CPU it burns.
The candidates of one size are interleaved (see
:func:`benchmarks.common.time_samples`): a round runs every candidate once, so
load from elsewhere on the machine slows both sides of a ratio alike.
The ``default`` row names what ``algorithm=None`` chose and its time over the
fastest algorithm's at that point. ``default_again`` is ``algorithm=None``
timed a second time, as its own candidate: its ``vs_bi`` against the
``default`` row's shows how far the same code timed against itself strays in
this run (its ratio to ``default`` is ``self_ratio``), the noise within which
"the default is never slower than the built-in" is judged (:func:`summarize`).

``--out DIR`` (default ``bench_out/sweep``) gets results.csv, results.json,
report.md and a plot per (collective, N).

For other benchmarks (``benchmarks.tune``): :func:`measure_point` times a list
of candidates at one (collective, size) inside a world, and :func:`run_sweep`
runs a whole sweep from flags and returns its rows.
"""
import argparse
import functools
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from benchmarks import common
from collectives import settings
from collectives import tuning
from collectives.tuning import cost_model
from collectives.algorithms import ALGORITHMS

COLLECTIVES = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter",
               "all_to_all", "gather", "scatter")
DEFAULT_COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "reduce_scatter")
REDUCING = ("all_reduce", "reduce", "reduce_scatter")
ROOTED = ("broadcast", "reduce", "gather", "scatter")


def busbw_factor(collective, n):
    """nccl-tests' bus-bandwidth factor: busbw = algbw * factor (docs/PERFORMANCE.md there)."""
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    if collective in ("broadcast", "reduce"):
        return 1.0
    return (n - 1) / n


# ---------------------------------------------------------------- one collective, one size

def _value(rank, j, numel, dtype, op):
    """Rank r's input piece j: small integers, so every reduction is exact in every dtype."""
    i = torch.arange(numel, dtype=torch.int64)
    if op == ReduceOp.PRODUCT:
        v = 1 + (i + rank + j) % 2
    else:
        v = 1 + (i + 3 * j) % 5 + rank % 3
    return v.to(dtype)


def _reduce_closed_form(pieces, op, n):
    fn = {ReduceOp.SUM: torch.add, ReduceOp.AVG: torch.add, ReduceOp.PRODUCT: torch.mul,
          ReduceOp.MIN: torch.minimum, ReduceOp.MAX: torch.maximum}[op]
    out = functools.reduce(fn, pieces)
    return out / n if op == ReduceOp.AVG else out


class Case:
    """Buffers and calls for one (collective, size) on this rank.

    ``size`` is nccl-tests' size; for the list collectives each rank's piece is
    size / N bytes (rounded down to whole elements, at least one).
    """

    def __init__(self, collective, size, dtype, op, device, rank, n):
        self.collective, self.dtype, self.op, self.device = collective, dtype, op, device
        self.rank, self.n = rank, n
        es = torch.empty((), dtype=dtype).element_size()
        listy = collective not in ("all_reduce", "broadcast", "reduce")
        self.piece = max(size // es // n, 1) if listy else max(size // es, 1)
        self.count = self.piece * n if listy else self.piece
        self.size = self.count * es
        # Timing inputs stay fixed under repeated reduction (0+0, 1*1): no inf, no denormals.
        self.fill = 1 if op == ReduceOp.PRODUCT else 0

    def _buf(self, value=None, j=0):
        if value is None:
            return torch.full((self.piece,), self.fill, dtype=self.dtype, device=self.device)
        return _value(self.rank, j, self.piece, self.dtype, self.op).to(self.device)

    def buffers(self, encoded):
        """Fresh buffers: rank-encoded (``encoded``) for the check, constant for timing."""
        n, c = self.n, self.collective
        v = (lambda j=0: self._buf(True, j)) if encoded else (lambda j=0: self._buf())
        if c in ("all_reduce", "broadcast", "reduce"):
            return {"t": v()}
        if c == "all_gather":
            return {"t": v(), "outs": [self._buf() for _ in range(n)]}
        if c == "reduce_scatter":
            return {"out": self._buf(), "ins": [v(j) for j in range(n)]}
        if c == "all_to_all":
            return {"outs": [self._buf() for _ in range(n)], "ins": [v(j) for j in range(n)]}
        if c == "gather":
            return {"t": v(), "outs": [self._buf() for _ in range(n)] if self.rank == 0 else None}
        return {"out": self._buf(), "ins": [v(j) for j in range(n)] if self.rank == 0 else None}

    def call(self, lib, b, **kw):
        """Run the collective once with ``lib`` (torch.distributed or collectives)."""
        c, op = self.collective, self.op
        if c == "all_reduce":
            return lib.all_reduce(b["t"], op=op, **kw)
        if c == "broadcast":
            return lib.broadcast(b["t"], src=0, **kw)
        if c == "reduce":
            return lib.reduce(b["t"], dst=0, op=op, **kw)
        if c == "all_gather":
            return lib.all_gather(b["outs"], b["t"], **kw)
        if c == "reduce_scatter":
            return lib.reduce_scatter(b["out"], b["ins"], op=op, **kw)
        if c == "all_to_all":
            return lib.all_to_all(b["outs"], b["ins"], **kw)
        if c == "gather":
            return lib.gather(b["t"], b["outs"], dst=0, **kw)
        return lib.scatter(b["out"], b["ins"], src=0, **kw)

    def expected(self):
        """(name of the result buffer, expected value(s)) on this rank, or None if unchecked."""
        n, r, c = self.n, self.rank, self.collective
        val = functools.partial(_value, numel=self.piece, dtype=self.dtype, op=self.op)
        if c == "all_reduce":
            return "t", _reduce_closed_form([val(q, 0) for q in range(n)], self.op, n)
        if c == "reduce":
            return ("t", _reduce_closed_form([val(q, 0) for q in range(n)], self.op, n)) if r == 0 else None
        if c == "broadcast":
            return "t", val(0, 0)
        if c == "all_gather":
            return "outs", [val(q, 0) for q in range(n)]
        if c == "reduce_scatter":
            return "out", _reduce_closed_form([val(q, r) for q in range(n)], self.op, n)
        if c == "all_to_all":
            return "outs", [val(q, r) for q in range(n)]
        if c == "gather":
            return ("outs", [val(q, 0) for q in range(n)]) if r == 0 else None
        return "out", val(0, r)

    def wrong(self, lib, **kw):
        """Run once on rank-encoded inputs; return how many elements on this rank differ from
        the closed form (nccl-tests' #wrong, before the sum over ranks)."""
        b = self.buffers(encoded=True)
        self.call(lib, b, **kw)
        want = self.expected()
        if want is None:
            return 0
        got, want = b[want[0]], want[1]
        got, want = (got, want) if isinstance(got, list) else ([got], [want])
        tol = 1e-2 if self.dtype in (torch.float16, torch.bfloat16) else 1e-5
        bad = 0
        for g, w in zip(got, want):
            g = g.cpu()
            if g.is_floating_point():
                ok = torch.isclose(g.double(), w.double(), rtol=tol, atol=tol)
            else:
                ok = g == w
            bad += int((~ok).sum())
        return bad


# ---------------------------------------------------------------- candidates

SELF = "default_again"


def candidates_for(collective, algorithms, builtin=True, self_check=False):
    """[(label, algorithm or None, library)] for one collective.

    ``algorithms`` is a list of names, ``builtin`` (torch.distributed), ``default``
    (``algorithm=None``) or ``all``; names another collective lacks are skipped.
    ``self_check``: with ``default``, time ``algorithm=None`` a second time as
    ``default_again`` (the noise of the same code against itself).
    """
    import collectives
    every = algorithms in (None, ["all"]) or "all" in algorithms
    ours = [a for a in ALGORITHMS[collective] if every or a in algorithms]
    out = [("builtin", None, dist)] if builtin and (every or "builtin" in algorithms) else []
    out += [(a, a, collectives) for a in ours]
    if every or "default" in algorithms:
        out.append(("default", None, collectives))
        if self_check:
            out.append((SELF, None, collectives))
    return out


def _sum_over_ranks(counts, device):
    t = torch.tensor(counts, dtype=torch.int64)
    if "nccl" in str(dist.get_backend()):
        t = t.to(device)
    dist.all_reduce(t)
    return t.cpu().tolist()


def measure_point(collective, size, candidates, rank, n, device, *, dtype="float", op="sum",
                  iters=20, warmup=2, batch=0, check=True):
    """Check and time ``candidates`` at one (collective, size); rows identical on every rank.

    Call it inside a world (every rank at once), e.g. from a worker started by
    :func:`benchmarks.common.run_worlds`.

    Args:
        collective (str): One of :data:`COLLECTIVES`.
        size (int): Bytes, as nccl-tests counts them.
        candidates (list): From :func:`candidates_for`: (label, algorithm, library).
        rank, n (int): This rank and the world size.
        device (torch.device): Where the buffers live.
        dtype (str), op (str): Keys of :data:`benchmarks.common.DTYPES` and ``OPS``.
        iters, warmup (int): Timed and untimed iterations (nccl-tests' -n, -w).
        batch (int): Calls per iteration; 0 picks more for small sizes.
        check (bool): Count wrong elements first (nccl-tests' -c 1).

    Returns:
        list[dict]: one row per candidate: collective, world_size, algorithm, size,
        count, type, redop, root, time_us, algbw_GBps, busbw_GBps, wrong, builtin_us,
        vs_builtin (the median over rounds of time / the built-in's time in the same
        round), cpu_us (CPU seconds of every thread of the process per call, the slowest
        rank's, median over rounds) and cpu_vs_builtin (round by round, as vs_builtin), chosen and default_over_best (``default`` row only), self_ratio
        (``default_again`` row only: its time over ``default``'s, round by round),
        samples_us (the time of each round, in round order: rounds ran the candidates
        side by side).

    Example::

        >>> cands = candidates_for("all_reduce", ["builtin", "ring"])
        >>> rows = measure_point("all_reduce", 4096, cands, rank, n, torch.device("cpu"), iters=5)
        >>> [(r["algorithm"], r["wrong"]) for r in rows]
        [('builtin', 0), ('ring', 0)]       # Rank 0
    """
    import collectives
    case = Case(collective, size, common.DTYPES[dtype], common.OPS[op], device, rank, n)
    cands = list(candidates)
    wrong = {}
    if any(lib is dist for _, _, lib in cands):
        try:
            wrong["builtin"] = case.wrong(dist)
        except (RuntimeError, ValueError):
            # The built-in lacks this dtype or op on this backend (gloo has no AVG): skip it.
            cands = [c for c in cands if c[2] is not dist]
    if check:
        for label, algo, lib in cands:
            if lib is collectives:
                wrong[label] = case.wrong(lib, algorithm=algo)
        labels = [label for label, _, _ in cands]
        wrong = dict(zip(labels, _sum_over_ranks([wrong[label] for label in labels], device)))
    fns = {}
    for label, algo, lib in cands:
        b = case.buffers(encoded=False)
        kw = {} if lib is dist else {"algorithm": algo}
        fns[label] = functools.partial(case.call, lib, b, **kw)
    # CPU of the whole process (the built-in works on gloo's threads, ours on the caller's)
    samples, cpu = common.time_samples(fns, iters, warmup, common.batch_for(case.size, batch), device,
                                       cpu_clock=time.process_time)
    times = common.medians(samples)
    chosen = tuning.choose(collective, case.size, n) if "default" in times else None
    ours = [label for label in times if label not in ("builtin", SELF)]
    best = min(ours, key=times.get) if ours else None
    base = times.get("builtin")
    rows = []
    for label, t in times.items():
        algbw = case.size / t / 1e9
        default = label in ("default", SELF)
        rows.append({
            "collective": collective, "world_size": n, "algorithm": label, "size": case.size,
            "count": case.count, "type": dtype, "redop": op if collective in REDUCING else "none",
            "root": 0 if collective in ROOTED else -1, "time_us": t * 1e6, "algbw_GBps": algbw,
            "busbw_GBps": algbw * busbw_factor(collective, n),
            "wrong": wrong.get(label) if check else None,
            "builtin_us": base * 1e6 if base else None,
            "vs_builtin": common.paired_ratio(samples[label], samples["builtin"]) if base else None,
            "chosen": chosen if default else None,
            "default_over_best": (common.paired_ratio(samples[label], samples[best])
                                  if label == "default" and best else None),
            "self_ratio": (common.paired_ratio(samples[label], samples["default"])
                           if label == SELF else None),
            "cpu_us": statistics.median(cpu[label]) * 1e6,
            "cpu_vs_builtin": (common.paired_ratio(cpu[label], cpu["builtin"])
                               if base and min(cpu["builtin"]) > 0 else None),
            "algorithm_run": chosen if default else label,
            "samples_us": [x * 1e6 for x in samples[label]],
        })
    return rows


# ---------------------------------------------------------------- the table

HEADER = (f"#{'collective':>14} {'N':>3} {'size(B)':>11} {'count':>10} {'type':>8} {'redop':>5} "
          f"{'root':>4} {'algorithm':>20} {'time(us)':>10} {'algbw':>7} {'busbw':>7} {'#wrong':>6} "
          f"{'builtin(us)':>11} {'vs_bi':>6} {'cpu_bi':>6}")


def format_row(row):
    """One line of the table, in :data:`HEADER`'s columns."""
    extra = ""
    if row["chosen"]:
        extra = f"  chose {row['chosen']}" + (f", {row['default_over_best']:.2f}x best"
                                              if row["default_over_best"] else "")
    if row.get("self_ratio"):
        extra += f", {row['self_ratio']:.2f}x default"
    if row.get("predicted_us"):
        extra += f"  predicted {row['predicted_us']:.1f} us"
    wrong = "N/A" if row["wrong"] is None else row["wrong"]
    return (f" {row['collective']:>14} {row['world_size']:>3} {row['size']:>11} {row['count']:>10} "
            f"{row['type']:>8} {row['redop']:>5} {row['root']:>4} {row['algorithm']:>20} "
            f"{row['time_us']:>10.1f} {row['algbw_GBps']:>7.3f} {row['busbw_GBps']:>7.3f} {wrong:>6} "
            f"{common.fmt(row['builtin_us'], '11.1f'):>11} {common.fmt(row['vs_builtin'], '6.2f'):>6} "
            f"{common.fmt(row.get('cpu_vs_builtin'), '6.2f'):>6}{extra}")


def _worker(args, rank, n, device):
    from benchmarks import pingpong
    out = {"rows": [], "p2p": []}
    if args.model and n >= 2:
        out["p2p"] = pingpong.measure(rank, n, device, sorted({4, 64, 1024, *args.sizes}),
                                      args.iters, args.warmup_iters, args.batch)
    points = [(c, s) for c in args.collective for s in args.sizes]
    progress = common.Progress(len(points), f"sweep N={n}")
    if rank == 0:
        print(f"# N={n}, {args.backend}/{args.device}, -n {args.iters} -w {args.warmup_iters}, "
              f"time = median over iterations of the slowest rank", flush=True)
        print(HEADER, flush=True)
    for collective, size in points:
        progress.step(f"{collective} {common.human(size)}")
        cands = candidates_for(collective, args.algorithm, builtin=not args.no_builtin,
                               self_check=not args.no_self)
        rows = measure_point(collective, size, cands, rank, n, device, dtype=args.datatype, op=args.op,
                             iters=args.iters, warmup=args.warmup_iters, batch=args.batch,
                             check=bool(args.check))
        bad = [r for r in rows if r["wrong"]]
        if rank == 0:
            for row in rows:
                print(format_row(row), flush=True)
        if bad:
            raise AssertionError(f"{collective} {size} B on {n} ranks: wrong results from "
                                 f"{', '.join(r['algorithm'] for r in bad)}")
        out["rows"] += rows
    progress.close()
    return out


# ---------------------------------------------------------------- outputs

def predict(rows, p2p):
    """Fit the cost model per world size from ``p2p`` rows; add ``predicted_us`` to ``rows``.

    Returns {N: fitted parameters}.
    """
    model = {n: cost_model.fit([r for r in p2p if r["world_size"] == n])
             for n in sorted({r["world_size"] for r in p2p})}
    for r in rows:
        params = model.get(r["world_size"])
        if params and r["algorithm"] != "builtin":
            r["predicted_us"] = 1e6 * cost_model.predict(r["collective"], r["algorithm_run"],
                                                         r["world_size"], r["size"], params)
    return model


def model_text(model):
    """The line of a report that gives the cost model fitted in the run, ``{n: figures}``."""
    return "Cost model fitted in the same run: " + "; ".join(
        f"N={n}: alpha {p['alpha'] * 1e6:.1f} us, beta {cost_model.rate(p['beta'], 2)}, "
        f"gamma {cost_model.rate(p['gamma'], 2)}" for n, p in model.items())


def report_markdown(meta, rows, model):
    """The tables docs/benchmarks.md shows: one per (collective, N), the command above."""
    lines = [f"Measured {meta['date_utc']} on {meta['host']} ({meta['cores']} cores, {meta['cpu']}), "
             f"load average {meta['loadavg']}, torch {meta['torch']}, {meta['backend']}/{meta['device']}, "
             f"{meta['threads_per_rank']} thread(s) per rank.", "", f"Command: `{meta['command']}`", ""]
    if model:
        lines += [model_text(model), ""]
    for collective, n in dict.fromkeys((r["collective"], r["world_size"]) for r in rows):
        sel = [r for r in rows if r["collective"] == collective and r["world_size"] == n]
        names = list(dict.fromkeys(r["algorithm"] for r in sel))
        sizes = list(dict.fromkeys(r["size"] for r in sel))
        time = {(r["algorithm"], r["size"]): r for r in sel}
        lines += [f"{collective}, N={n}: busbw (GB/s), our time over the built-in's in brackets "
                  f"(the median over rounds of the two times of a round), and what algorithm=None chose", "", "| size | " + " | ".join(names) + " |",
                  "|---:|" + "---:|" * len(names)]
        for s in sizes:
            cells = []
            for a in names:
                r = time.get((a, s))
                cells.append("-" if r is None else f"{r['busbw_GBps']:.3f}" + (
                    f" ({r['vs_builtin']:.2f})" if r["vs_builtin"] and a != "builtin" else "")
                    + (f" {r['chosen']}" if r["chosen"] and a == "default" else ""))
            lines.append(f"| {common.human(s)} | " + " | ".join(cells) + " |")
        lines.append("")
    goal_lines, misses = goals(rows)
    lines += [line.lstrip("# ") for line in goal_lines]
    if misses:
        lines += ["", "Misses: " + "; ".join(misses)]
    return "\n".join(lines) + "\n"


def plot(rows, out_dir):
    """busbw and time against size, one figure per (collective, N); the model's fit if predicted."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    paths = []
    for collective, n in dict.fromkeys((r["collective"], r["world_size"]) for r in rows):
        sel = [r for r in rows if r["collective"] == collective and r["world_size"] == n]
        fig, (ax_bw, ax_t) = plt.subplots(1, 2, figsize=(12, 4.5))
        for label in dict.fromkeys(r["algorithm"] for r in sel):
            pts = sorted((r["size"], r["busbw_GBps"], r["time_us"]) for r in sel if r["algorithm"] == label)
            style = {"color": "black", "linewidth": 2.5} if label == "builtin" else {}
            ax_bw.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label, **style)
            ax_t.plot([p[0] for p in pts], [p[2] for p in pts], marker="o", label=label, **style)
        ax_bw.set(xscale="log", xlabel="size (bytes)", ylabel="busbw (GB/s)", title=f"{collective}, N={n}")
        ax_t.set(xscale="log", yscale="log", xlabel="size (bytes)", ylabel="time (us)",
                 title=f"{collective}, N={n}")
        ax_bw.legend(fontsize=7)
        fig.tight_layout()
        paths.append(os.path.join(out_dir, f"{collective}_n{n}.png"))
        fig.savefig(paths[-1], dpi=90)
        plt.close(fig)
    pred = [r for r in rows if r.get("predicted_us")]
    if pred:
        fig, ax = plt.subplots(figsize=(6, 6))
        for collective in dict.fromkeys(r["collective"] for r in pred):
            sel = [r for r in pred if r["collective"] == collective]
            ax.scatter([r["predicted_us"] for r in sel], [r["time_us"] for r in sel], s=12, label=collective)
        lo = min(min(r["predicted_us"], r["time_us"]) for r in pred)
        hi = max(max(r["predicted_us"], r["time_us"]) for r in pred)
        ax.plot([lo, hi], [lo, hi], "k--", linewidth=1)
        ax.set(xscale="log", yscale="log", xlabel="predicted (us)", ylabel="measured (us)",
               title="alpha-beta-gamma model vs measurement")
        ax.legend(fontsize=7)
        fig.tight_layout()
        paths.append(os.path.join(out_dir, "model_vs_measured.png"))
        fig.savefig(paths[-1], dpi=90)
        plt.close(fig)
    return paths


TEACHING = ("naive_ring", "linear")   # the teaching copies, kept out of the 1.5x goal
GOAL = 1.5


def noise_band(rows, n):
    """How far the same code timed against itself strays at world size ``n`` in this run:
    the largest ``default_again``/``default`` ratio (or its inverse), at least 1."""
    ratios = [r["self_ratio"] for r in rows if r["world_size"] == n and r.get("self_ratio")]
    return max([1.0] + [max(x, 1 / x) for x in ratios])


def _cpu_note(row):
    return f" (CPU {row['cpu_vs_builtin']:.2f}x)" if row.get("cpu_vs_builtin") else ""


def goals(rows):
    """Issue 28's two goals over ``rows``: (lines of text, misses).

    1. every algorithm but the teaching copies within ``GOAL`` (1.5x) of the built-in;
    2. ``algorithm=None`` never slower than the built-in beyond :func:`noise_band`.
    """
    algos = [r for r in rows if r["vs_builtin"] and r["algorithm"] not in ("builtin", "default", SELF)
             and r["algorithm"] not in TEACHING]
    slow = [r for r in algos if r["vs_builtin"] > GOAL]
    lines, misses = [], []
    if algos:
        lines.append(f"# algorithms (not {', '.join(TEACHING)}) within {GOAL}x of the built-in: "
                     f"{len(algos) - len(slow)}/{len(algos)} points")
        misses += [f"{r['collective']} N={r['world_size']} {common.human(r['size'])} {r['algorithm']} "
                   f"{r['vs_builtin']:.2f}" + _cpu_note(r) for r in slow]
    dflt = [r for r in rows if r["algorithm"] == "default" and r["vs_builtin"]]
    if dflt:
        bands = {n: noise_band(rows, n) for n in sorted({r["world_size"] for r in dflt})}
        over = [r for r in dflt if r["vs_builtin"] > bands[r["world_size"]]]
        lines.append(f"# algorithm=None no slower than the built-in within the self-vs-self noise "
                     f"({', '.join(f'N={n}: {b:.2f}' for n, b in bands.items())}): "
                     f"{len(dflt) - len(over)}/{len(dflt)} points")
        misses += [f"{r['collective']} N={r['world_size']} {common.human(r['size'])} default "
                   f"({r['chosen']}) {r['vs_builtin']:.2f}" + _cpu_note(r) for r in over]
    return lines, misses


def summarize(rows, file=sys.stdout):
    """Print where ``algorithm=None`` stands against the best algorithm and the built-in,
    and the goals of :func:`goals` with every point that misses them."""
    dflt = [r for r in rows if r["algorithm"] == "default" and r["default_over_best"]]
    if dflt:
        worst = max(dflt, key=lambda r: r["default_over_best"])
        print(f"# default/best: worst {worst['default_over_best']:.2f} ({worst['collective']}, "
              f"N={worst['world_size']}, {common.human(worst['size'])}, chose {worst['chosen']}); "
              f"{sum(r['default_over_best'] <= 1.10 for r in dflt)}/{len(dflt)} points within 1.10", file=file)
    lines, misses = goals(rows)
    for line in lines:
        print(line, file=file)
    if misses:
        print("# misses: " + "; ".join(misses), file=file)


def crossover(rows, a, b, key="time_us"):
    """The smallest size from which ``a`` is faster than ``b`` at every larger size (None: never)."""
    t = {(r["algorithm"], r["size"]): r.get(key) for r in rows}
    sizes = sorted({r["size"] for r in rows})
    if not all(t.get((x, s)) for x in (a, b) for s in sizes):
        return None
    out = None
    for s in reversed(sizes):
        if t[(a, s)] >= t[(b, s)]:
            break
        out = s
    return out


def lab_summary(rows, spec, big=16 << 20):
    """Lines on a lab run: busbw at sizes >= ``big`` as a fraction of the link's rate, and where
    the ring overtakes the tree (all_reduce), measured and as the model predicts it."""
    link = spec.rate / 8 / 1e9
    lines = [f"# lab {spec}: link {link:.4f} GB/s each way; busbw at >= {common.human(big)} over it:"]
    for collective, n in dict.fromkeys((r["collective"], r["world_size"]) for r in rows):
        sel = [r for r in rows if r["collective"] == collective and r["world_size"] == n]
        for a in dict.fromkeys(r["algorithm"] for r in sel):
            fr = [f"{common.human(r['size'])} {r['busbw_GBps'] / link:.2f}"
                  for r in sel if r["algorithm"] == a and r["size"] >= big]
            if fr:
                lines.append(f"#   {collective} N={n} {a:>16}: " + ", ".join(fr))
        if collective == "all_reduce" and {"ring", "tree"} <= {r["algorithm"] for r in sel}:
            measured = crossover(sel, "ring", "tree")
            model = crossover(sel, "ring", "tree", "predicted_us")
            lines.append(f"#   all_reduce N={n}: ring faster than tree from "
                         f"{common.human(measured) if measured else 'no size measured'} "
                         f"(model: {common.human(model) if model else 'no size' if any(r.get('predicted_us') for r in sel) else 'run with --model'})")
    return lines


# ---------------------------------------------------------------- main

def build_parser():
    p = argparse.ArgumentParser(prog="python -m benchmarks.sweep",
                                description=__doc__.split("\n")[0].replace("``", ""),
                                formatter_class=common.HelpFormatter)
    common.add_size_flags(p, b="4K", e="16M", f=4)
    common.add_timing_flags(p, n=20, w=2)
    common.add_data_flags(p)
    p.add_argument("--collective", default=",".join(DEFAULT_COLLECTIVES),
                   help=f"comma-separated, or 'all': {','.join(COLLECTIVES)}")
    p.add_argument("--algorithm", default="all",
                   help="comma-separated algorithm names, plus 'builtin' and 'default' (algorithm=None); "
                        "'all' for every one")
    common.add_world_flags(p, default="2")
    p.add_argument("--batch", type=common.whole(0), default=0, help="calls per iteration (0: up to 32 for small sizes)")
    p.add_argument("--no-builtin", action="store_true", help="do not run the built-in")
    p.add_argument("--no-self", action="store_true",
                   help=f"do not time algorithm=None a second time ({SELF}: the noise of the same code "
                        f"against itself)")
    p.add_argument("--model", action="store_true",
                   help="also measure point to point (benchmarks.pingpong), fit alpha-beta-gamma "
                        "and predict every row")
    p.add_argument("--out", default=os.path.join(common.OUT_DIR, "sweep"),
                   help="folder for results.csv, results.json, report.md and plots")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--transport", choices=("auto", "gloo", "shm"), default=None,
                   help="how our collectives' messages travel between ranks of one host "
                        "(sets COLLECTIVES_TRANSPORT in every rank; default: its value, else auto: "
                        "shared memory); the built-in always uses gloo")
    return p


def collectives_flag(parser, text):
    """``--collective``'s comma-separated names (or ``all``) as a list; unknown names end the program."""
    names = list(COLLECTIVES) if text == "all" else text.split(",")
    unknown = [c for c in names if c not in COLLECTIVES]
    if unknown:
        parser.error(f"unknown collective(s) {', '.join(unknown)}; choose from {', '.join(COLLECTIVES)}")
    return names


def parse_args(argv=None):
    p = build_parser()
    args = p.parse_args(argv)
    args.collective = collectives_flag(p, args.collective)
    args.algorithm = args.algorithm.split(",")
    known = {a for names in ALGORITHMS.values() for a in names} | {"builtin", "default", "all"}
    unknown = [a for a in args.algorithm if a not in known]
    if unknown:
        p.error(f"unknown algorithm(s) {', '.join(unknown)}; choose from {', '.join(sorted(known))}")
    return common.finish_parsing(p, args)


def run_sweep(args):
    """Run the sweep ``args`` describe (from :func:`parse_args`) in every world.

    Returns (rows, p2p rows), or None on torchrun ranks other than 0.
    """
    results = common.run_worlds(_worker, args)
    if results is None:
        return None
    rows = [r for _, res in results for r in res["rows"]]
    p2p = [r for _, res in results for r in res["p2p"]]
    return rows, p2p


def main(argv=None):
    args = parse_args(argv)
    if args.transport is not None:
        os.environ["COLLECTIVES_TRANSPORT"] = args.transport    # the ranks inherit it
    meta = common.machine_info("python -m benchmarks.sweep", args)
    meta["transport"] = settings.transport()
    result = run_sweep(args)
    if result is None:
        return
    rows, p2p = result
    model = predict(rows, p2p) if p2p else {}
    summarize(rows)
    lab_lines = lab_summary(rows, args.lab) if args.lab else []
    print("\n".join(lab_lines))
    common.write_rows(args.out, "results", rows, dict(meta, model=model))
    if p2p:
        common.write_rows(args.out, "p2p", p2p, meta)
    with open(os.path.join(args.out, "report.md"), "w") as f:
        f.write(report_markdown(meta, rows, model))
        if lab_lines:
            f.write("\n" + "\n".join(line.lstrip("# ") for line in lab_lines) + "\n")
    if not args.no_plots:
        plot(rows, args.out)
    print(f"# wrote {args.out}/ (results.csv, results.json, report.md{', p2p' if p2p else ''}"
          f"{'' if args.no_plots else ', plots'})")


if __name__ == "__main__":
    main()
