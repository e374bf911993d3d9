"""How close ``algorithm=None`` comes to the best algorithm, in one run.

Usage::

    python -m benchmarks.auto_choice                                # the goal: 4K..64M, N=2,4,8
    python -m benchmarks.auto_choice --world-size 2 -b 4K -e 1M -n 5 # a small run

For all_reduce, broadcast, all_gather and reduce_scatter (``--collective``), at
every size from ``-b`` to ``-e`` and every world size, it times every
algorithm and the automatic choice side by side
(``benchmarks.sweep.measure_point``: interleaved, so they see the same noise)
and prints, per collective and world size, auto/best at each size: the
automatic choice's time over the fastest algorithm's, round by round (the
median of the per-round ratios), among those it may pick
(within its memory bound of S/N + 4 MiB, ``collectives.tuning.allowed``;
every algorithm's time is in the rows) (1.00 when it picked the
fastest; the goal of issue 18 is at most 1.10 everywhere after
``python -m benchmarks.tune``). Where the choice came from (this machine's
table, the model with this machine's parameters, the shipped defaults) is
printed with it (``collectives.tuning.explain``).

Rows go to ``--out`` (default ``bench_out/auto_choice``): results.csv,
results.json and auto_choice.md (the table).
"""
import argparse
import os

from benchmarks import common, sweep
from collectives import tuning

GOAL = 1.10


def _worker(args, rank, n, device):
    rows = []
    points = [(c, size) for c in args.collective for size in args.sizes]
    progress = common.Progress(len(points), f"auto_choice N={n}")
    for collective, size in points:
        progress.step(f"{collective} {common.human(size)}")
        cands = sweep.candidates_for(collective, ["all"], builtin=args.builtin)
        rows += sweep.measure_point(collective, size, cands, rank, n, device, iters=args.iters,
                                    warmup=args.warmup_iters, check=bool(args.check))
    progress.close()
    # what algorithm=None read, as seen inside the world (same environment, same cache)
    sources = {(c, size): tuning.explain(c, size, n)[1] for c, size in points}
    return {"rows": rows, "sources": sources}


def candidates(row, rows):
    """The algorithm rows at ``row``'s point that ``algorithm=None`` may pick (within its
    memory bound, ``tuning.allowed``)."""
    point = (row["collective"], row["world_size"], row["size"])
    ok = tuning.allowed(*point[:1], point[2], point[1])
    return [x for x in rows if (x["collective"], x["world_size"], x["size"]) == point and x["algorithm"] in ok]


def best(row, rows):
    """The fastest candidate at ``row``'s point: the lowest median time."""
    return min(candidates(row, rows), key=lambda x: x["time_us"])


def auto_over_best(row, rows):
    """The automatic choice's time (``row``) over the fastest candidate's at the same point.

    The fastest is the candidate with the lowest median; the ratio is the median over
    rounds of the two times in a round (``benchmarks.common.paired_ratio``): a round
    runs every candidate back to back, so load from elsewhere on the machine slows
    both sides of a round alike. Rows without samples (older runs): the medians' ratio.
    """
    fastest = best(row, rows)
    if row.get("samples_us") and fastest.get("samples_us"):
        return common.paired_ratio(row["samples_us"], fastest["samples_us"])
    return row["time_us"] / fastest["time_us"]


def table(rows, sources):
    """Markdown: one row per (collective, N), one column per size, cells 'auto/best (choice)'."""
    sizes = sorted({r["size"] for r in rows})
    lines = ["| collective | N | " + " | ".join(common.human(s) for s in sizes) + " | worst |",
             "| --- | --- | " + " | ".join("---" for _ in sizes) + " | --- |"]
    keys = sorted({(r["collective"], r["world_size"]) for r in rows})
    for collective, n in keys:
        cells, worst = [], 0.0
        for s in sizes:
            r = next((r for r in rows if (r["collective"], r["world_size"], r["size"], r["algorithm"])
                      == (collective, n, s, "default")), None)
            if r is None:
                cells.append("-")
                continue
            fastest = best(r, rows)
            ratio = auto_over_best(r, rows)
            worst = max(worst, ratio)
            mark = "" if ratio <= GOAL else " **"
            cells.append(f"{ratio:.2f}{mark} ({r['chosen']}" + ("" if fastest["algorithm"] == r["chosen"]
                                                              else f"; best {fastest['algorithm']}") + ")")
        lines.append(f"| {collective} | {n} | " + " | ".join(cells) + f" | {worst:.2f} |")
    used = sorted(set(sources.values()))
    ratios = [auto_over_best(r, rows) for r in rows if r["algorithm"] == "default"]
    summary = (f"auto/best: worst {max(ratios):.2f}; {sum(x <= GOAL for x in ratios)}/{len(ratios)} points "
               f"within {GOAL:.2f} (** marks the others); best = the fastest algorithm within algorithm=None's "
               f"memory bound. algorithm=None chose from: " + "; ".join(used))
    return "\n".join(lines) + "\n\n" + summary + "\n"


def build_parser():
    p = argparse.ArgumentParser(prog="python -m benchmarks.auto_choice", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    common.add_size_flags(p, b="4K", e="64M", f=4)
    common.add_timing_flags(p, n=10, w=2)
    common.add_data_flags(p, op=False, dtype=None)
    p.add_argument("--collective", default=",".join(sweep.DEFAULT_COLLECTIVES),
                   help=f"comma-separated: {','.join(sweep.COLLECTIVES)}")
    p.add_argument("--builtin", action="store_true", help="time the built-in too (for the rows; not in the ratio)")
    common.add_world_flags(p, default="2,4,8")
    p.add_argument("--out", default=os.path.join(common.OUT_DIR, "auto_choice"))
    return p


def main(argv=None):
    p = build_parser()
    args = p.parse_args(argv)
    args.collective = sweep.collectives_flag(p, args.collective)
    args = common.finish_parsing(p, args)
    meta = common.machine_info("python -m benchmarks.auto_choice", args)
    results = common.run_worlds(_worker, args)
    if results is None:
        return
    rows = [r for _, res in results for r in res["rows"]]
    wrong = [r for r in rows if r.get("wrong")]
    sources = {(n, *k): v for n, res in results for k, v in res["sources"].items()}
    text = table(rows, sources)
    print(text)
    if wrong:
        print(f"# {len(wrong)} row(s) with wrong results: " + ", ".join(
            f"{r['collective']}/{r['algorithm']} N={r['world_size']} {common.human(r['size'])}" for r in wrong))
    common.write_rows(args.out, "results", rows, meta)
    with open(os.path.join(args.out, "auto_choice.md"), "w") as f:
        f.write(f"`{meta['command']}`, {meta['date_utc']}, {meta['host']} ({meta['cores']} cores), "
                f"load {meta['loadavg']}, torch {meta['torch']}\n\n{text}")
    print(f"# wrote {args.out}/ (results.csv, results.json, auto_choice.md)")
    if wrong:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
