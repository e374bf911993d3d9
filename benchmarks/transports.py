"""The two doors side by side: all_reduce over gloo's loopback and over shared memory, same run.

One world per ``--world-size``. At every size, five candidates are timed in interleaved
rounds (``benchmarks.common.time_samples``; the order rotates each round, so load from
elsewhere on the machine hits all alike):

* ``built-in``: ``torch.distributed.all_reduce`` on gloo;
* ``default/shm``, ``default/gloo``: ``collectives.all_reduce`` with ``algorithm=None``,
  messages through shared memory or through gloo (``COLLECTIVES_TRANSPORT`` switched
  between the calls: the door reads it for every call);
* ``ring/shm``, ``ring/gloo``: the ring, both ways;
* ``p2p/shm``, ``p2p/gloo``: point to point through the API (``collectives.p2p_api``):
  every rank ``isend``\ s the size to its right and ``irecv``\ s it from its left, both ways;
* ``copy_``: one ``dst.copy_(src)`` of the size on rank 0 alone (the others wait at the
  next barrier): what one core's memory bandwidth allows, the ceiling of any transport
  that copies each byte.

Rank 0 prints one row per size: busbw (GB/s, nccl-tests' definition, 2(N-1)/N x S / t)
of each candidate and the ratios of the issue's goals, each the median of per-round
ratios (``common.paired_ratio``)::

    python -m benchmarks.transports --world-size 2,4 -b 4K -e 64M -f 4 -n 10 -w 2

``default/shm / built-in`` is a time ratio (<= 1 is faster), ``x busbw`` a busbw ratio
(>= 1 is faster), ``ring/shm of copy_`` the ring's busbw over the copy's bandwidth.
Rows go to ``--out``/transports.csv and .json with the machine and its load average.
"""
import argparse
import os

import torch
import torch.distributed as dist

import collectives
from benchmarks import common
from collectives import p2p_api

CANDIDATES = ("built-in", "default/shm", "default/gloo", "ring/shm", "ring/gloo", "p2p/shm", "p2p/gloo",
              "copy_")


def _on(transport, fn):
    def call():
        os.environ["COLLECTIVES_TRANSPORT"] = transport
        fn()
    return call


def _shift(x, got, rank, n):
    """Send ``x`` to the right, receive ``got`` from the left, through the public API."""
    def call():
        works = [p2p_api.isend(x, (rank + 1) % n), p2p_api.irecv(got, (rank - 1) % n)]
        for work in works:
            work.wait()
    return call


def worker(args, rank, n, device):
    rows = []
    for size in args.sizes:
        numel = max(1, size // 4)
        x = torch.full((numel,), float(rank + 1))
        src, dst, got = torch.ones(numel), torch.empty(numel), torch.empty(numel)
        cands = {
            "built-in": lambda: dist.all_reduce(x),
            "default/shm": _on("auto", lambda: collectives.all_reduce(x)),
            "default/gloo": _on("gloo", lambda: collectives.all_reduce(x)),
            "ring/shm": _on("auto", lambda: collectives.all_reduce(x, algorithm="ring")),
            "ring/gloo": _on("gloo", lambda: collectives.all_reduce(x, algorithm="ring")),
            "p2p/shm": _on("auto", _shift(x, got, rank, n)),
            "p2p/gloo": _on("gloo", _shift(x, got, rank, n)),
            "copy_": (lambda: dst.copy_(src)) if rank == 0 else (lambda: None),
        }
        if n == 1:
            cands = {"copy_": cands["copy_"], "built-in": cands["built-in"]}
        batch = common.batch_for(size, args.batch)
        wall, _ = common.time_samples(cands, args.iters, args.warmup_iters, batch, device)
        os.environ["COLLECTIVES_TRANSPORT"] = "auto"
        if rank != 0:
            continue
        factor = 2 * (n - 1) / n
        med = common.medians(wall)
        row = {"world_size": n, "bytes": numel * 4, "batch": batch}
        for name, t in med.items():
            bw = numel * 4 / t / 1e9
            row[f"{name} us"] = round(t * 1e6, 1)
            row[f"{name} busbw"] = round(bw if name == "copy_" else bw * factor, 3)
        if n > 1:
            row["default/shm / built-in time"] = round(common.paired_ratio(wall["default/shm"], wall["built-in"]), 3)
            row["default/shm / default/gloo time"] = round(
                common.paired_ratio(wall["default/shm"], wall["default/gloo"]), 3)
            row["ring/shm x busbw of built-in"] = round(common.paired_ratio(wall["built-in"], wall["ring/shm"]), 3)
            row["default/shm x busbw of built-in"] = round(
                common.paired_ratio(wall["built-in"], wall["default/shm"]), 3)
            row["p2p/shm / p2p/gloo time"] = round(common.paired_ratio(wall["p2p/shm"], wall["p2p/gloo"]), 3)
            row["ring/shm of copy_"] = round(
                common.paired_ratio(wall["copy_"], wall["ring/shm"]) * factor, 3)
        rows.append(row)
        print(_line(row), flush=True)
    return rows


COLUMNS = [("bytes", "bytes", "{:>10}"), ("built-in busbw", "bi GB/s", "{:>8.2f}"),
           ("default/shm busbw", "def/shm", "{:>8.2f}"), ("default/gloo busbw", "def/gloo", "{:>8.2f}"),
           ("ring/shm busbw", "ring/shm", "{:>8.2f}"), ("ring/gloo busbw", "ring/gl", "{:>8.2f}"),
           ("copy_ busbw", "copy_", "{:>8.2f}"), ("default/shm / built-in time", "def/bi t", "{:>8.2f}"),
           ("default/shm / default/gloo time", "shm/gl t", "{:>8.2f}"),
           ("default/shm x busbw of built-in", "def x bi", "{:>8.2f}"),
           ("ring/shm x busbw of built-in", "ring x bi", "{:>9.2f}"),
           ("p2p/shm / p2p/gloo time", "p2p shm/gl", "{:>10.2f}"),
           ("ring/shm of copy_", "ring/copy", "{:>9.2f}")]


def _line(row):
    out = [f"N={row['world_size']}"]
    for key, _, spec in COLUMNS:
        value = row.get(key)
        out.append(spec.format(value) if value is not None else spec.replace(".2f", "").format("-"))
    return " ".join(out)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.transports", description=__doc__.split("\n")[0])
    common.add_world_flags(p, default="2,4", backend=False)
    common.add_size_flags(p, b="4K", e="64M", f=4)
    common.add_timing_flags(p, n=10, w=2)
    p.add_argument("--batch", type=common.whole(0), default=0,
                   help="calls per sample (default: up to 32 for small sizes, 1 from 256 KiB)")
    p.add_argument("--out", default=common.OUT_DIR, help="folder for transports.csv/.json")
    args = common.finish_parsing(p, p.parse_args(argv))
    print("     " + " ".join(f"{h:>{len(spec.format(0.0 if 'f' in spec else 0))}}" for _, h, spec in COLUMNS),
          flush=True)
    rows = common.run_and_write("python -m benchmarks.transports", worker, args, name="transports")
    if rows is not None:
        print(f"rows in {os.path.join(args.out, 'transports.csv')}; load average "
              f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
