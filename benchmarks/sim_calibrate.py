"""Calibrate the simulator's ``local`` topology: this machine's alpha, beta, gamma and wake-up cost.

Usage::

    python -m benchmarks.sim_calibrate                    # N=2 and 4, 4 B..4M, then store
    python -m benchmarks.sim_calibrate --world-size 2 --no-store

Measures through the real door, as ``benchmarks.pingpong`` does (the same
``pingpong.measure``: ping-pong, ring exchange, a local reduction), fits each world
size with ``collectives.tuning.cost_model.fit``, and turns the fits into a flat
topology for ``python -m collectives.sim --topology local``:

* the ring exchange is what the algorithms do (every rank sends right and receives
  left at once), so its fit gives the per-message alpha and the bandwidth;
* this machine has C cores. With more ranks than cores a rank that was waiting must
  first get a core back: the simulator charges each wake-up ``wake`` seconds of a
  shared core (C of them). With N = 2 on 2 cores a step costs alpha + wake; with
  N = 4 the four wake-ups queue on two cores: alpha + 2 wake. The two fits give
  both: ``wake = a4 - a2``, ``alpha = a2 - wake`` (with only N <= C measured, the
  wake-up is taken as 0 and everything is alpha);
* gamma is the local reduction's seconds per byte.

Stored (``--no-store`` to only print) in the per-user cache beside the tuning tables
(``collectives.sim.topology.calibration_path()``), where ``--topology local`` reads it.
"""
import argparse
import datetime
import json
import os

from benchmarks import common, pingpong
from collectives.sim import topology
from collectives.tuning import cost_model


def spec_from_p2p(p2p_rows, cores=None):
    """A ``local`` topology (dict) from ``pingpong.measure`` rows of one or more world sizes."""
    cores = cores or os.cpu_count()
    fits = {}
    for n in sorted({r["world_size"] for r in p2p_rows}):
        fits[n] = cost_model.fit([r for r in p2p_rows if r["world_size"] == n])
    small = min(fits)
    a_small = fits[small]["alpha_ring"]
    wake = 0.0
    over = [n for n in fits if n > cores]
    if over and small <= cores:
        big = max(over)
        rounds = -(-big // cores)         # wake-ups in a row per step at N = big
        wake = max((fits[big]["alpha_ring"] - a_small) / (rounds - 1), 0.0)
    alpha = max(a_small - wake, 0.0)
    return {
        "kind": "flat", "alpha": alpha, "bandwidth": 1.0 / fits[small]["beta_ring"],
        "gamma": fits[small]["gamma"], "cores": cores, "wake": wake,
        "calibrated": {"when": datetime.datetime.now().isoformat(timespec="seconds"),
                       "machine": common.machine_info("python -m benchmarks.sim_calibrate"),
                       "fits": {str(n): f for n, f in fits.items()}},
        "source": f"calibrated on this machine by python -m benchmarks.sim_calibrate "
                  f"({datetime.date.today().isoformat()}, N={','.join(map(str, fits))})",
    }


def _worker(args, rank, n, device):
    return pingpong.measure(rank, n, device, args.sizes, args.iters, args.warmup_iters, args.batch)


def store(spec):
    path = topology.calibration_path()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(spec, f, indent=1)
    return path


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.sim_calibrate", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    common.add_size_flags(p, b="4", e="4M", f=8)
    common.add_timing_flags(p, n=20, w=2)
    common.add_world_flags(p, default="2,4")
    p.add_argument("--batch", type=int, default=0, help="calls per iteration (0: up to 32 for small sizes)")
    p.add_argument("--no-store", action="store_true", help="print the figures, do not store them")
    args = common.finish_parsing(p, p.parse_args(argv))
    if min(args.world_size) < 2:
        p.error("--world-size: calibration needs 2 or more ranks")
    results = common.run_worlds(_worker, args)
    if results is None:
        return
    rows = [r for _, res in results for r in res]
    spec = spec_from_p2p(rows)
    topology.validate(dict(spec, name="local"))
    print(topology.describe(dict(spec, name="local")))
    if not args.no_store:
        print(f"# stored in {store(spec)}; python -m collectives.sim --topology local reads it")


if __name__ == "__main__":
    main()
