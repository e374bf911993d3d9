"""Point to point through the door, and the alpha-beta-gamma cost model fitted to it.

Usage::

    python -m benchmarks.pingpong                          # N=2, 4 B..16M
    python -m benchmarks.pingpong -b 4 -e 64M -f 4 --world-size 2,4

For each size, three candidates are timed interleaved (see
:func:`benchmarks.common.time_candidates`), all through
``collectives.p2p_communications.Comm``, the path every algorithm's messages take:

* ``ping-pong``: rank 0 sends S bytes to rank 1, which sends them back; half
  the round trip is the one-way time (alpha + beta S).
* ``ring exchange``: every rank sends S right and receives S from its left at
  once: the bandwidth a ring can use when every link is busy both ways.
* ``reduce``: one local ``add_`` of S bytes (gamma S).
* ``copy`` and ``fresh copy``: one local ``copy_`` of S bytes into memory used before, and
  into memory just allocated (which the first write faults in): what the simulator
  charges a rank's own copies and allocations (``benchmarks.sim_calibrate``).

and once, ``api_us`` and ``api_ring_us`` in every row: whole 4-byte
``collectives.all_reduce`` calls through the API (:func:`measure_api`), from which
``benchmarks.sim_calibrate`` finds the API's own cost per call and per step.

:func:`collectives.tuning.cost_model.fit` then gives alpha and beta (ping-pong),
alpha_ring and beta_ring (ring exchange) and gamma, per world size, printed
and written to ``--out`` (default ``bench_out/pingpong``) as p2p.csv,
p2p.json and model.json. ``benchmarks.sweep --model`` runs the same
measurement in its own worlds and predicts every row from it.
"""
import argparse
import json
import os

import torch
import torch.distributed as dist

from benchmarks import common
from collectives.tuning import cost_model


def measure(rank, n, device, sizes, iters=20, warmup=2, batch=0):
    """Ping-pong (ranks 0 and 1), ring exchange (all ranks) and a local reduction at each size.

    Call it inside a world (every rank at once, n >= 2).

    Returns:
        list[dict]: per size: world_size, size, api_us, api_ring_us, pingpong_oneway_us, pingpong_GBps,
        ring_exchange_us, ring_exchange_GBps, reduce_us, reduce_GBps, copy_us, fresh_copy_us
        (same on every rank).
    """
    from collectives.p2p_communications import Comm
    comm = Comm(dist.group.WORLD, "bench", "p2p")
    right, left = (rank + 1) % n, (rank - 1) % n
    # Messages live where the algorithms' do: on the device where the backend sends it
    # (NCCL), in host memory where it does not (gloo stages CUDA tensors once per call).
    wire = device if comm.nccl else torch.device("cpu")
    rows = []
    api = {field: t * 1e6 for field, t in measure_api(wire, iters, warmup).items()}
    for size in sizes:
        a = torch.zeros(max(size // 4, 1), device=wire)
        b = torch.zeros_like(a)

        def pingpong():
            if rank == 0:
                comm.send(a, 1, 0)
                comm.recv(b, 1, 1)
            elif rank == 1:
                comm.recv(b, 0, 0)
                comm.send(a, 0, 1)

        def ring():
            comm.sendrecv(a, right, b, left, 2)

        def reduce_local():
            b.add_(a)

        def copy_local():
            b.copy_(a)

        def copy_fresh():
            torch.empty_like(a).copy_(a)
        t = common.time_candidates({"pingpong": pingpong, "ring_exchange": ring, "reduce": reduce_local,
                                    "copy": copy_local, "fresh": copy_fresh},
                                   iters, warmup, common.batch_for(size, batch), wire)
        nbytes = a.numel() * 4
        rows.append({"world_size": n, "size": nbytes, **api,
                     "pingpong_oneway_us": t["pingpong"] / 2 * 1e6,
                     "pingpong_GBps": nbytes / (t["pingpong"] / 2) / 1e9,
                     "ring_exchange_us": t["ring_exchange"] * 1e6,
                     "ring_exchange_GBps": nbytes / t["ring_exchange"] / 1e9,
                     "reduce_us": t["reduce"] * 1e6, "reduce_GBps": nbytes / t["reduce"] / 1e9,
                     "copy_us": t["copy"] * 1e6, "fresh_copy_us": t["fresh"] * 1e6})
    return rows


API_CALLS = {"api_us": ("all_reduce", "recursive_doubling"), "api_ring_us": ("all_reduce", "ring")}
API_BYTES = 4
API_BATCH = common.batch_for(API_BYTES)


def measure_api(device, iters=20, warmup=2):
    """Seconds per call of whole 4-byte ``collectives.all_reduce`` calls (``API_CALLS``:
    recursive doubling, ceil(log2 N) steps; the ring, 2 (N - 1)), ``API_BATCH`` back to back,
    as {field: seconds}. Four bytes are nothing to move or add: the time is the API's own work
    per call and per step, which ``benchmarks.sim_calibrate`` takes from them. Collective:
    every rank."""
    from collectives import api
    x = torch.zeros(API_BYTES // 4, device=device)
    fns = {field: (lambda c=c, a=a: getattr(api, c)(x, algorithm=a)) for field, (c, a) in API_CALLS.items()}
    return common.time_candidates(fns, iters, warmup, API_BATCH, device)


def fit_line_text(n, m):
    """The line that reports ``m``, :func:`cost_model.fit`'s figures for ``n`` ranks."""
    return (f"# N={n} fit: alpha {m['alpha'] * 1e6:.1f} us, beta {cost_model.rate(m['beta'])}; "
            f"ring exchange alpha {m['alpha_ring'] * 1e6:.1f} us, beta {cost_model.rate(m['beta_ring'])}; "
            f"gamma {cost_model.rate(m['gamma'])}")


def _worker(args, rank, n, device):
    if n < 2:
        raise SystemExit("ping-pong needs --world-size 2 or more")
    if rank == 0:
        print(f"# N={n}, {args.backend}/{args.device}, -n {args.iters} -w {args.warmup_iters}", flush=True)
        print(f"#{'size(B)':>11} {'one-way(us)':>12} {'GB/s':>8} {'ring exch(us)':>14} {'GB/s':>8} "
              f"{'reduce(us)':>11} {'GB/s':>8}", flush=True)
    rows = []
    progress = common.Progress(len(args.sizes), f"pingpong N={n}")
    for size in args.sizes:
        progress.step(common.human(size))
        row = measure(rank, n, device, [size], args.iters, args.warmup_iters, args.batch)[0]
        if rank == 0:
            print(f" {row['size']:>11} {row['pingpong_oneway_us']:>12.1f} {row['pingpong_GBps']:>8.3f} "
                  f"{row['ring_exchange_us']:>14.1f} {row['ring_exchange_GBps']:>8.3f} "
                  f"{row['reduce_us']:>11.1f} {row['reduce_GBps']:>8.3f}", flush=True)
        rows.append(row)
    progress.close()
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.pingpong", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    common.add_size_flags(p, b="4", e="16M", f=4)
    common.add_timing_flags(p, n=20, w=2)
    common.add_world_flags(p, default="2")
    p.add_argument("--batch", type=common.whole(0), default=0, help="calls per iteration (0: up to 32 for small sizes)")
    p.add_argument("--out", default=os.path.join(common.OUT_DIR, "pingpong"))
    args = common.finish_parsing(p, p.parse_args(argv))
    meta = common.machine_info("python -m benchmarks.pingpong", args)
    results = common.run_worlds(_worker, args)
    if results is None:
        return
    rows = [r for _, res in results for r in res]
    model = {}
    for n, res in results:
        model[n] = cost_model.fit(res)
        m = model[n]
        print(fit_line_text(n, m))
    common.write_rows(args.out, "p2p", rows, meta)
    with open(os.path.join(args.out, "model.json"), "w") as f:
        json.dump({"meta": meta, "model": model}, f, indent=1)
    print(f"# wrote {args.out}/ (p2p.csv, p2p.json, model.json)")


if __name__ == "__main__":
    main()
