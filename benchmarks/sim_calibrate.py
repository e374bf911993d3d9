"""Calibrate the simulator's ``local`` topology: this machine's alpha, beta, gamma and wake-up cost.

Usage::

    python -m benchmarks.sim_calibrate                    # N=2 and 4, 4 B..4M, then store
    python -m benchmarks.sim_calibrate --world-size 2 --no-store

Measures through the real door, as ``benchmarks.pingpong`` does (the same
``pingpong.measure``: ping-pong, ring exchange, a local reduction, and one small
all_reduce through the whole API), fits each world size with
``collectives.tuning.cost_model.fit``, and turns the fits into a flat topology for
``python -m collectives.sim --topology local`` (:func:`spec_from_p2p` says how each
figure follows): per-message latency alpha and CPU ``overhead``, the bandwidth of one
message and of the machine (``host_bandwidth``: on a loopback every byte is copied by
the CPUs, so messages in flight share it), gamma, the C cores the ranks share with the
``wake`` cost of a rank that waited, and the API's ``call`` cost.

Stored (``--no-store`` to only print) in the per-user cache beside the tuning tables
(``collectives.sim.topology.calibration_path()``), where ``--topology local`` reads it.
"""
import argparse
import datetime
import json
import math
import os
import statistics

from benchmarks import common, pingpong
from collectives.sim import simulate, topology
from collectives.tuning import cost_model


def spec_from_p2p(p2p_rows, cores=None, python=None):
    """A ``local`` topology (dict) from ``pingpong.measure`` rows of one or more world sizes.

    The figures are those with which the simulator plays the measured programs out (N ranks
    on C cores; per message a rank spends ``overhead`` o of CPU posting it, the wire adds
    alpha, a rank that waited spends ``wake`` w of CPU to run again, each call through the
    API costs ``call`` of CPU first; CPU work queues for the C cores):

    * alpha, o, w, call and ``switch`` (what a core turning from one rank to another costs):
      the best fit to the ping-pong's and the ring exchange's latency and to two 4-byte
      all_reduce calls through the API (:func:`latencies`);
    * bandwidth: one message alone (the ping-pong's seconds per byte from 256 KiB up,
      :func:`seconds_per_byte`); ``host_bandwidth``: what all messages at once share, the
      loopback's copies being the machine's CPUs and memory: the ring exchange moves N
      messages at once, N / its seconds per byte, the smallest over the world sizes
      measured (the machine's capacity once its cores are all busy copying);
    * gamma: the local reduction's seconds per byte; ``copy`` and ``alloc``: a local copy's,
      and what new memory costs more (:func:`memory_rates`); and the three per size
      (``by_size``, :func:`memory_tables`), which the simulator uses;
    * ``python`` = 1: the simulator runs each algorithm's own code, unchanged, on this machine,
      so the host time it takes between a rank's messages is what it costs that rank here.
    """
    cores = cores or os.cpu_count()
    by_n = {}
    for r in p2p_rows:
        by_n.setdefault(r["world_size"], []).append(r)
    fits = {n: {**cost_model.fit(rows), **api_figures(rows)} for n, rows in sorted(by_n.items())}
    small = min(fits)
    python = PYTHON if python is None else python
    lat = latencies(fits, cores, python)
    mine = by_n[small]
    copy, alloc = memory_rates(mine)
    one = seconds_per_byte(mine, "pingpong_oneway_us") or fits[small]["beta"]
    host = min(n / (seconds_per_byte(by_n[n], "ring_exchange_us") or fits[n]["beta_ring"]) for n in fits)
    return {
        "kind": "flat", **lat, "bandwidth": 1.0 / one,
        "host_bandwidth": max(host, 0.5 / one),
        "gamma": fits[small]["gamma"], "cores": cores, "python": python,
        "copy": copy, "alloc": alloc, "by_size": memory_tables(mine),
        "calibrated": {"when": datetime.datetime.now().isoformat(timespec="seconds"),
                       "machine": common.machine_info("python -m benchmarks.sim_calibrate"),
                       "fits": {str(n): f for n, f in fits.items()}},
        "source": f"calibrated on this machine by python -m benchmarks.sim_calibrate "
                  f"({datetime.date.today().isoformat()}, N={','.join(map(str, fits))})",
    }


def _pingpong(comm, tensor, root):
    """``pingpong.measure``'s ping-pong (ranks 0 and 1), with the algorithm modules' signature."""
    if comm.rank == 0:
        comm.send(tensor, 1, 0)
        comm.recv(tensor, 1, 1)
    elif comm.rank == 1:
        comm.recv(tensor, 0, 0)
        comm.send(tensor, 0, 1)


def _ring_exchange(comm, tensor, root):
    """``pingpong.measure``'s ring exchange: every rank sends right and receives from the left."""
    n, r = comm.size, comm.rank
    comm.sendrecv(tensor, (r + 1) % n, tensor.new_empty(tensor.shape), (r - 1) % n, 2)


PYTHON = 1.0     # a rank's own code costs on this machine what it costs the simulator running it here

LATENCY_FIELDS = ("alpha", "overhead", "wake", "call", "switch")


def latencies(fits, cores, python):
    """{alpha, overhead, wake, call, switch}: the figures with which the simulator best plays
    out what was measured (least squares of log(predicted / measured), all >= 0).

    The programs, per world size N, each simulated as it was measured (a batch of calls back
    to back, the ranks sharing C cores): the ping-pong's and the ring exchange's latency (the
    intercepts of their fits, simulated with 4 bytes: half a ping-pong's round trip, one
    exchange), and two whole 4-byte all_reduce calls through the API (``pingpong.API_CALLS``),
    which carry the API's own work per call (``call``) and the algorithm's per step. The
    figures need not all agree (they are noisy, and the machine is not the model), so the fit
    spreads the misfit instead of letting one difference of two noisy figures decide a
    parameter. Nelder-Mead on the square roots (which keeps them >= 0)."""
    batch = pingpong.API_BATCH
    targets = []          # (collective, function or name, n, divide by, through the API, measured s)
    for n, f in fits.items():
        targets.append(("broadcast", _pingpong, n, 2, False, f["alpha"]))
        targets.append(("broadcast", _ring_exchange, n, 1, False, f["alpha_ring"]))
        for field, (collective, algorithm) in pingpong.API_CALLS.items():
            if f.get(field):
                targets.append((collective, algorithm, n, 1, True, f[field]))

    def loss(x):
        spec = {name: v * v for name, v in zip(LATENCY_FIELDS, x)}
        spec.update(kind="flat", bandwidth=1e12, gamma=0.0, cores=cores, python=python, name="fit")
        door_only = dict(spec, call=0.0)        # the point-to-point programs skip the API
        total = 0.0
        for collective, fn, n, per, api, measured in targets:
            got = simulate(collective, fn, n, pingpong.API_BYTES, spec if api else door_only,
                           calls=batch).time / per
            total += math.log(max(got, 1e-12) / measured) ** 2
        return total

    guess = math.sqrt(fits[min(fits)]["alpha"] / 4)
    x = nelder_mead(loss, [guess] * len(LATENCY_FIELDS))
    return {name: v * v for name, v in zip(LATENCY_FIELDS, x)}


def nelder_mead(f, x0, scale=0.5, iters=400):
    """Minimise ``f`` from ``x0`` (the textbook simplex method; small, no dependency)."""
    n = len(x0)
    pts = [list(x0)] + [[x0[j] * (1 + scale) if j == i else x0[j] for j in range(n)] for i in range(n)]
    vals = [f(p) for p in pts]
    for _ in range(iters):
        order = sorted(range(n + 1), key=vals.__getitem__)
        pts, vals = [pts[i] for i in order], [vals[i] for i in order]
        centre = [sum(p[j] for p in pts[:-1]) / n for j in range(n)]
        move = lambda t: [c + t * (w - c) for c, w in zip(centre, pts[-1])]  # noqa: E731
        r = move(-1.0)
        fr = f(r)
        if fr < vals[0]:
            e = move(-2.0)
            fe = f(e)
            pts[-1], vals[-1] = (e, fe) if fe < fr else (r, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = r, fr
        else:
            c = move(0.5)
            fc = f(c)
            if fc < vals[-1]:
                pts[-1], vals[-1] = c, fc
            else:
                pts = [pts[0]] + [[b + 0.5 * (p - b) for b, p in zip(pts[0], q)] for q in pts[1:]]
                vals = [vals[0]] + [f(p) for p in pts[1:]]
        if max(vals) - min(vals) < 1e-10:
            break
    return pts[min(range(n + 1), key=vals.__getitem__)]


def memory_rates(rows):
    """(copy, alloc) seconds per byte: a local copy into used memory, and what a copy into new
    memory costs more (the slopes of ``copy_us`` and ``fresh_copy_us`` over size); (0, 0)
    where they were not measured."""
    rows = [r for r in rows if r.get("copy_us") and r.get("fresh_copy_us")]
    if len(rows) < 2:
        return 0.0, 0.0
    sizes = [r["size"] for r in rows]
    _, copy = cost_model.fit_line(sizes, [r["copy_us"] * 1e-6 for r in rows])
    _, fresh = cost_model.fit_line(sizes, [r["fresh_copy_us"] * 1e-6 for r in rows])
    return copy, max(fresh - copy, 0.0)


def seconds_per_byte(rows, field, smallest=256 << 10):
    """The slope of ``field`` (microseconds) over size, least squares on the sizes from
    ``smallest`` up, where the bytes, not the call, make the time (the relative-error fit
    of ``cost_model.fit`` weighs the small sizes and misses the large ones' bandwidth);
    None with fewer than two such sizes."""
    pts = [(r["size"], r[field] * 1e-6) for r in rows if r["size"] >= smallest]
    if len({x for x, _ in pts}) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    slope = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)
    return slope if slope > 0 else None


def memory_tables(rows):
    """``by_size`` tables of gamma, copy and alloc (seconds per byte at each size measured) from
    one world size's rows: what a reduction, a copy and a copy into new memory each took per
    byte, on one rank's core (the smallest world measured, N <= C, where no rank waits for a
    core). Sizes under 4 KiB are left out: there the call, not the bytes, is the time."""
    tables = {"gamma": [], "copy": [], "alloc": []}
    for r in sorted(rows, key=lambda r: r["size"]):
        s = r["size"]
        if s < 4096 or not (r.get("copy_us") and r.get("fresh_copy_us")):
            continue
        tables["gamma"].append([s, r["reduce_us"] * 1e-6 / s])
        tables["copy"].append([s, r["copy_us"] * 1e-6 / s])
        tables["alloc"].append([s, max(r["fresh_copy_us"] - r["copy_us"], 0.0) * 1e-6 / s])
    return {k: v for k, v in tables.items() if v}


def api_figures(rows):
    """{field: median seconds} of ``pingpong.API_CALLS`` in one world size's rows (empty if not measured)."""
    return {field: statistics.median(r[field] for r in rows) * 1e-6
            for field in pingpong.API_CALLS if all(r.get(field) for r in rows)}


def _worker(args, rank, n, device):
    return pingpong.measure(rank, n, device, args.sizes, args.iters, args.warmup_iters, args.batch)


def fit_text(n, f):
    """The line that reports the calibration's fits ``f`` for ``n`` ranks."""
    return (f"# N={n}: ping-pong alpha {f['alpha'] * 1e6:.1f} us, {cost_model.rate(f['beta'], 2)}; ring exchange "
            f"alpha {f['alpha_ring'] * 1e6:.1f} us, {cost_model.rate(f['beta_ring'], 2)} per message; "
            f"4-byte all_reduce through the API {f.get('api_us', 0) * 1e6:.0f} us (recursive doubling), "
            f"{f.get('api_ring_us', 0) * 1e6:.0f} us (ring)")


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
    p.add_argument("--batch", type=common.whole(0), default=0, help="calls per iteration (0: up to 32 for small sizes)")
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
    for n, f in spec["calibrated"]["fits"].items():
        print(fit_text(n, f))
    if not args.no_store:
        print(f"# stored in {store(spec)}; python -m collectives.sim --topology local reads it")


if __name__ == "__main__":
    main()
