"""What the hierarchy buys: ``hierarchical`` all_reduce against the flat ring, on whatever
world it is given, with ranks placed host by host or interleaved.

Usage::

    python -m benchmarks.hierarchy --world-size 4 --ranks-per-host 2 -b 16M     # one machine
    torchrun --nnodes 2 --nproc-per-node 2 ... -m benchmarks.hierarchy -b 1M -e 64M  # two hosts

On hosts with slow links between them (two machines, or the lab of issue 25), the
layout comes from ``LOCAL_WORLD_SIZE``, which torchrun sets.

Flags as in nccl-tests (``-b -e -f -n -w -c``) and ``benchmarks.sweep``. Ours:

* ``--ranks-per-host L``: ranks per host, global ranks placed host by host (rank g on
  host g // L). Default: ``LOCAL_WORLD_SIZE``, which torchrun (and the lab) set;
  under our one-machine launcher it is the world size, so give it there to run the
  algorithm in its two-level shape on one host.
* ``--placement host-by-host,interleaved``: the order of the ranks the algorithms
  see. ``host-by-host``: as started. ``interleaved``: logical rank i is a rank of
  host i mod H, so neighbours on the ring sit on different hosts (2 x 2: the ring
  runs 0, 2, 1, 3 over the world's ranks, and every hop crosses hosts). The
  algorithms are called with a door that renumbers the ranks (and tells the
  hierarchical algorithm the true hosts, so it keeps its traffic where it was).
* ``--algorithm``: all_reduce algorithms to time (default ``ring,hierarchical``),
  and ``builtin`` (torch's own, which renumbering does not reach).
* ``--segment-bytes``: the hierarchical algorithm's segment size (how finely its
  three phases overlap).

For each size and placement it prints the time per call (median over ``-n``
samples of the slowest rank, candidates interleaved: see
:func:`benchmarks.common.time_candidates`), busbw (algbw x 2(N-1)/N),
``link/S``: the most bytes one host sent to the others in one call (traced),
over S, and ``vs ring``: the ring's time over this one's, both in this run.
The issue's goal: hierarchical >= 1.35x the ring at 16 MiB on 2 hosts x 2 ranks,
host by host, with 1 Gbit/s between the hosts (a traffic bound of 1.5x).
``--out DIR`` (default ``bench_out/hierarchy``) gets results.csv and results.json.
"""
import argparse
import os

import torch
import torch.distributed as dist

import collectives
from benchmarks import common
from collectives import reduce_ops, settings
from collectives.algorithms import REGISTRY
from collectives.p2p_communications import Comm

PLACEMENTS = ("host-by-host", "interleaved")


class Placed:
    """A door over ``comm`` whose rank i is ``comm``'s rank ``order[i]`` (the Door protocol
    of ``collectives.door``, plus ``hosts``: the true host of each renumbered rank)."""

    def __init__(self, comm, order, hosts):
        self.comm, self.order = comm, order
        self.rank, self.size = order.index(comm.rank), comm.size
        self.hosts = tuple(hosts[g] for g in order)

    def _map(self, pairs):
        return [(t, self.order[p]) for t, p in pairs]

    def post(self, step, sends=(), recvs=()):
        return self.comm.post(step, sends=self._map(sends), recvs=self._map(recvs))

    def exchange(self, step, sends=(), recvs=()):
        self.post(step, sends, recvs).wait()

    def send(self, tensor, peer, step):
        self.comm.send(tensor, self.order[peer], step)

    def recv(self, tensor, peer, step):
        self.comm.recv(tensor, self.order[peer], step)

    def sendrecv(self, send_tensor, dst, recv_tensor, src, step):
        self.comm.sendrecv(send_tensor, self.order[dst], recv_tensor, self.order[src], step)


def order_for(placement, n, per_host):
    """Logical rank -> world rank: the identity host by host; interleaved, logical rank i
    on host i mod H (local index i div H)."""
    if placement == "host-by-host":
        return list(range(n))
    h = n // per_host
    return [(i % h) * per_host + i // h for i in range(n)]


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.hierarchy", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_world_flags(p, default="4", backend=False)
    common.add_size_flags(p, b="16M", e=None)
    common.add_timing_flags(p, n=10, w=2)
    common.add_data_flags(p, op=False, dtype=None)
    p.add_argument("--ranks-per-host", type=int, default=None,
                   help="ranks per host, placed host by host (default: LOCAL_WORLD_SIZE)")
    p.add_argument("--placement", default=",".join(PLACEMENTS),
                   help=f"rank placements to compare, of {', '.join(PLACEMENTS)} (default both)")
    p.add_argument("--algorithm", default="ring,hierarchical",
                   help="all_reduce algorithms, and builtin (default ring,hierarchical)")
    p.add_argument("--segment-bytes", type=common.parse_size, default=None,
                   help="the hierarchical algorithm's segment size (default its SEGMENT_BYTES, 1M; "
                        "at most MAX_SEGMENTS segments): fewer, larger segments send fewer messages "
                        "and overlap less")
    p.add_argument("--out", default=os.path.join(common.OUT_DIR, "hierarchy"))
    args = p.parse_args(argv)
    args.placements = [x.strip() for x in args.placement.split(",") if x.strip()]
    args.algorithms = [x.strip() for x in args.algorithm.split(",") if x.strip()]
    for x in args.placements:
        if x not in PLACEMENTS:
            p.error(f"--placement {x!r}: use {' or '.join(PLACEMENTS)}")
    common.check_algorithms(p, "all_reduce", args.algorithms, extra=("builtin",))
    if args.ranks_per_host is not None and args.ranks_per_host < 1:
        p.error("--ranks-per-host must be 1 or more")
    return common.finish_parsing(p, args)


def worker(args, rank, n, device):
    per_host = args.ranks_per_host or settings.local_world_size() or n
    if n % per_host:
        raise SystemExit(f"{n} ranks do not fill hosts of {per_host}: give --ranks-per-host")
    hosts = [g // per_host for g in range(n)]
    red = reduce_ops.reduction(dist.ReduceOp.SUM, torch.float32, "hierarchy")
    # The doors below are made by hand; a door uses the group's shared memory once an API call
    # has agreed and set it up, and gloo before that: one call here, so both doors are measured
    # on the transport COLLECTIVES_TRANSPORT selects, as the built-in's neighbours would be.
    collectives.barrier()
    calls = [0]
    rows = []
    for size in args.sizes:
        x = torch.ones(size // 4)
        for placement in args.placements:
            order = order_for(placement, n, per_host)

            def call(algorithm, order=order, x=x):
                if algorithm == "builtin":
                    dist.all_reduce(x)
                    return None
                calls[0] += 1
                comm = Comm(None, "all_reduce", algorithm, seq=calls[0])
                kw = {"segment_bytes": args.segment_bytes} if algorithm == "hierarchical" else {}
                return REGISTRY["all_reduce"][algorithm](Placed(comm, order, hosts), x, red, **kw)

            cands = {a: (lambda a=a: call(a)) for a in args.algorithms
                     if not (a == "builtin" and placement != args.placements[0])}
            wrong = {}
            link = {}
            for a in cands:
                x.fill_(rank + 1)
                with collectives.trace() as t:
                    call(a)
                if args.check:
                    wrong[a] = int((x != n * (n + 1) / 2).sum())
                out = torch.zeros(n // per_host, dtype=torch.int64)
                for m in t.messages:
                    if m.kind == "send" and hosts[m.src] != hosts[m.dst]:
                        out[hosts[m.src]] += m.nbytes
                dist.all_reduce(out)
                link[a] = int(out.max()) if a != "builtin" else None
            times = common.time_candidates(cands, args.iters, args.warmup_iters, 1, device)
            for a, sec in times.items():
                rows.append({"size": size, "world_size": n, "ranks_per_host": per_host,
                             "placement": placement if a != "builtin" else "-", "algorithm": a,
                             "time_us": sec * 1e6, "busbw_GBps": size / sec * 2 * (n - 1) / n / 1e9,
                             "link_over_S": None if link[a] is None else link[a] / size,
                             "vs_ring": times["ring"] / sec if "ring" in times else None,
                             "wrong": wrong.get(a)})
    return rows


def main(argv=None):
    args = parse_args(argv)
    rows = common.run_and_write("python -m benchmarks.hierarchy", worker, args)
    if rows is None:
        return
    print("| N | per host | size | placement | algorithm | time (us) | busbw (GB/s) | link/S | vs ring | #wrong |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['world_size']} | {r['ranks_per_host']} | {common.human(r['size'])} | {r['placement']} "
              f"| {r['algorithm']} | {r['time_us']:.0f} | {r['busbw_GBps']:.3f} "
              f"| {common.fmt(r['link_over_S'], '.2f')} | {common.fmt(r['vs_ring'], '.2f')} "
              f"| {common.fmt(r['wrong'], 'd')} |")
    print(f"# wrote {args.out}/results.csv, results.json")


if __name__ == "__main__":
    main()
