"""How well the simulator predicts this machine: measure, calibrate in the same run, simulate, compare.

Usage::

    python -m benchmarks.sim_accuracy                                  # N=2,4, 4K..64M, 4 collectives
    python -m benchmarks.sim_accuracy -b 4K -e 1M -f 16 --world-size 2 -n 5

Takes ``benchmarks.sweep``'s flags. Runs the sweep (every algorithm of all_reduce,
broadcast, all_gather and reduce_scatter by default) with point-to-point measured in
the same worlds (``--model``), calibrates the ``local`` topology from those
measurements (``benchmarks.sim_calibrate.spec_from_p2p``: the machine's figures, each
one's charge described in ``collectives/sim/topology.py``), simulates every measured point
as it was measured (the sweep's batch of calls back to back), and prints
predicted/measured per point. It ends with::

    sim_accuracy: median |error| X%, p90 Y%, fastest agrees A of B

The measurements are written to ``--out`` (default ``bench_out/sim_accuracy``) as
``measured.json``; ``--replay FILE`` calibrates and simulates a recorded run again without
measuring (to try a change to the model against the same measurements).

A cell (collective, N, size) agrees when the algorithm the simulator predicts
fastest measured within the run's own noise of the measured fastest (its median at
most the fastest's median plus the fastest's interquartile range). The calibration is
not stored (``benchmarks.sim_calibrate`` stores one).
"""
import json
import os
import statistics
import sys

from benchmarks import common, sweep
from benchmarks.sim_calibrate import spec_from_p2p
from collectives.algorithms import ALGORITHMS
from collectives.sim import simulate, topology

DEFAULT = ["--world-size", "2,4", "-b", "4K", "-e", "64M", "-f", "4", "--no-builtin", "--no-plots"]


def quantile(xs, q):
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def compare(rows, spec, batch=0):
    """[(row, predicted seconds)] for every measured row of a registered algorithm, simulated
    as it was measured: ``common.batch_for(size, batch)`` calls back to back, per call."""
    out = []
    for row in rows:
        c, a = row["collective"], row["algorithm"]
        if a not in ALGORITHMS.get(c, ()):
            continue
        r = simulate(c, a, row["world_size"], row["size"], dict(spec, name="local"),
                     root=max(row["root"], 0), device="meta", calls=common.batch_for(row["size"], batch))
        out.append((row, r.time))
    return out


def agreement(pairs):
    """(agreeing cells, cells): the predicted fastest within the measured fastest's noise."""
    cells = {}
    for row, pred in pairs:
        cells.setdefault((row["collective"], row["world_size"], row["size"]), []).append((row, pred))
    agree = 0
    for entries in cells.values():
        best = min(entries, key=lambda e: e[0]["time_us"])[0]
        pick = min(entries, key=lambda e: e[1])[0]
        samples = best["samples_us"]
        noise = quantile(samples, 0.75) - quantile(samples, 0.25) if len(samples) > 1 else 0.0
        agree += pick["time_us"] <= best["time_us"] + noise
    return agree, len(cells)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    replay = None
    if "--replay" in argv:
        i = argv.index("--replay")
        if i + 1 >= len(argv):
            sys.exit("python -m benchmarks.sim_accuracy: --replay needs a measured.json")
        replay = argv[i + 1]
        del argv[i:i + 2]
    args = sweep.parse_args(DEFAULT + ["--out", os.path.join(common.OUT_DIR, "sim_accuracy")] + argv)
    args.model = True                     # point to point in the same worlds: the calibration
    if replay:
        with open(replay) as f:
            recorded = json.load(f)
        meta, rows, p2p, args.batch = recorded["meta"], recorded["rows"], recorded["p2p"], recorded["batch"]
        print(f"# replaying {replay}: measured {meta.get('date_utc', '')} by {meta.get('command', '')}")
    else:
        meta = common.machine_info("python -m benchmarks.sim_accuracy", args)
        result = sweep.run_sweep(args)
        if result is None:
            return
        rows, p2p = result
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, "measured.json")
        with open(path, "w") as f:
            json.dump({"meta": meta, "rows": rows, "p2p": p2p, "batch": args.batch}, f)
        print(f"# measurements written to {path} (--replay it to simulate them again)")
    report(rows, p2p, args.batch, meta.get("cores") or os.cpu_count(), meta)


def report(rows, p2p, batch, cores, meta, python=None):
    """Calibrate from ``p2p``, simulate ``rows``, print the table and the summary line; return
    (median, p90, agreeing cells, cells). ``python``: the calibration's own (None) or another
    charge for the algorithms' code (0: none, which makes the simulation exact and
    independent of how busy this machine is now)."""
    spec = spec_from_p2p(p2p, cores, python)
    print(f"\n# calibrated in this run: {topology.describe(dict(spec, name='local'))}")
    print(f"# {meta.get('cpu', '')}")
    pairs = compare(rows, spec, batch)
    print(f"#{'collective':>14} {'N':>3} {'size(B)':>11} {'algorithm':>20} {'measured(us)':>13} "
          f"{'predicted(us)':>14} {'pred/meas':>9}")
    errors = []
    for row, pred in pairs:
        measured = row["time_us"] * 1e-6
        errors.append(abs(pred / measured - 1))
        print(f" {row['collective']:>14} {row['world_size']:>3} {row['size']:>11} {row['algorithm']:>20} "
              f"{row['time_us']:>13.1f} {pred * 1e6:>14.1f} {pred / measured:>9.2f}")
    agree, cells = agreement(pairs)
    median, p90 = statistics.median(errors), quantile(errors, 0.9)
    print(f"sim_accuracy: median |error| {median * 100:.0f}%, "
          f"p90 {p90 * 100:.0f}%, fastest agrees {agree} of {cells}")
    return median, p90, agree, cells


if __name__ == "__main__":
    main()
