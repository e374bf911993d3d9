"""Where a small collective's time goes: torch, the door, the algorithm, the API.

A 4 KiB all_reduce moves almost no data, so its time is the cost of the
calls around the messages. This benchmark peels the layers off one at a time
and times each, interleaved in the same processes::

    python -m benchmarks.call_overhead --world-size 2 --batch 1,32

rows (every rank runs each; time = median over samples of the slowest rank):

* ``built-in``: ``torch.distributed.all_reduce``.
* ``api``: ``collectives.all_reduce(x, algorithm=A)``: validation, the
  engine, staging, a :class:`Comm`, the algorithm, the door.
* ``algorithm``: ``REGISTRY["all_reduce"][A](Comm(...), x, op)``: no API layer.
* ``exchange, door`` / ``exchange, torch``: one send to the right and one
  receive from the left, through ``Comm.exchange`` / through
  ``dist.isend`` + ``dist.irecv`` directly.
* ``exchange, torch + 100 us CPU``: the same, after 100 us of busy work in
  the calling thread: how much a microsecond of Python before the messages
  costs in wall time on this machine.
* ``api, no network``: the API call with the door's process group replaced
  by one whose messages complete at once: the Python path alone.

``cpu`` is the calling thread's CPU time (``time.thread_time``), the slowest
rank's, median over samples. The built-in's work runs on gloo's own thread,
so its ``cpu`` is only the wait. ``--batch`` sets how many calls run back to
back per sample (the sweep uses up to 32 for small sizes); ``-b``/``-e``
sizes, ``-n``/``-w`` iterations, as in nccl-tests.
"""
import argparse
import os
import time

import torch
import torch.distributed as dist

from benchmarks import common
from collectives import api, call, reduce_ops
from collectives.algorithms import REGISTRY
from collectives.p2p_communications import Comm


class _Done:
    """A message that has already arrived."""

    def wait(self, timeout=None):
        return True

    def is_completed(self):
        return True


class _NoNetwork:
    """Stands in for a process group: every send and receive completes at once."""

    def send(self, tensors, peer, tag):
        return _Done()

    def recv(self, tensors, peer, tag):
        return _Done()


class _DryComm(Comm):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.group = _NoNetwork()
        # and no shared memory either: a door sets it up at its first message and then sends
        # through it to the peers on this host, which would time the network after all
        self._shm_pending = False


def _spin(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _variants(x, algorithm):
    rank, n = dist.get_rank(), dist.get_world_size()
    world = dist.group.WORLD
    right, left = (rank + 1) % n, (rank - 1) % n
    inbox = torch.empty_like(x)
    red = reduce_ops.reduction(dist.ReduceOp.SUM, x.dtype, "call_overhead")
    run = REGISTRY["all_reduce"][algorithm]

    def torch_exchange():
        works = [dist.irecv(inbox, left), dist.isend(x, right)]
        for w in works:
            w.wait()

    def torch_exchange_after_cpu():
        _spin(100e-6)
        torch_exchange()

    def dry_api():
        real = call.Comm
        call.Comm = _DryComm
        try:
            api.all_reduce(x, algorithm=algorithm)
        finally:
            call.Comm = real

    return {
        "built-in": lambda: dist.all_reduce(x),
        "api": lambda: api.all_reduce(x, algorithm=algorithm),
        "algorithm": lambda: run(Comm(world, "all_reduce", algorithm), x, red),
        "exchange, door": lambda: Comm(world, "bench", "exchange").exchange(
            0, sends=[(x, right)], recvs=[(inbox, left)]),
        "exchange, torch": torch_exchange,
        "exchange, torch + 100 us CPU": torch_exchange_after_cpu,
        "api, no network": dry_api,
    }


def _worker(args, rank, world, device):
    out = []
    for size in args.sizes:
        # Zeros stay zeros however often they are summed: only the bytes matter here.
        x = torch.zeros(max(1, size // 4))
        variants = _variants(x, args.algorithm)
        for batch in args.batch:
            wall, cpu = common.time_candidates_with_cpu(variants, args.iters, args.warmup_iters, batch, device)
            if rank == 0:
                print(f"all_reduce {x.numel() * 4} B, N={world}, algorithm={args.algorithm}, "
                      f"{batch} call(s) back to back per sample, {args.iters} samples:")
                for name in variants:
                    w, c = wall[name], cpu[name]
                    print(f"  {name:30s} {1e6 * w:8.0f} us  {w / wall['built-in']:5.2f}x built-in   "
                          f"cpu {1e6 * c:6.0f} us", flush=True)
            out += [{"world_size": world, "size": x.numel() * 4, "batch": batch, "variant": name,
                     "time_us": 1e6 * wall[name], "cpu_us": 1e6 * cpu[name],
                     "vs_builtin": wall[name] / wall["built-in"]} for name in variants]
    return out


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.call_overhead", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    common.add_size_flags(p, b="4K", e=None, f=4)
    common.add_timing_flags(p, n=100, w=5)
    p.add_argument("--algorithm", default="tree", help="all_reduce algorithm for the api and algorithm rows")
    common.add_world_flags(p, default="2", backend=False)
    p.add_argument("--batch", type=common.whole_list(1), default=[1, 32], help="calls back to back per sample, comma-separated")
    p.add_argument("--out", default=os.path.join(common.OUT_DIR, "call_overhead"))
    args = p.parse_args(argv)
    common.check_algorithms(p, "all_reduce", [args.algorithm])
    common.finish_parsing(p, args)
    common.run_and_write("python -m benchmarks.call_overhead", _worker, args)


if __name__ == "__main__":
    main()
