"""Chapter 15: a cluster on your laptop: hosts with real links, multi-node torchrun, placement.

    sudo python -m tutorials.demos.ch15_lab       (root: it builds network namespaces)

1. The lab: 4 hosts, each on a 1 Gbit/s link (tbf) to one switch.
2. One message over one link, then the ring all_reduce on 4 hosts: busbw against the link rate.
3. torchrun across 2 hosts (one agent per host, c10d rendezvous at host 0).
4. Placement on 2 hosts x 2 ranks: ring with ranks host by host, then interleaved
   (and the hierarchical all_reduce, where this version has it).
Without root or tbf it says what is missing and stops.
"""
import json
import os
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist

import collectives
from collectives.tools import lab
from tutorials.demos.common import run

RATE = "1gbit"
LINK = lab.parse_rate(RATE) / 8 / 1e9          # GB/s one way: 0.125
SIZE = 16 << 20                                # 16 MiB: far past the latency term


def slowest(seconds):
    """The slowest rank's time (every rank calls it)."""
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def timed(fn, iters=5):
    """Median over ``iters`` calls of the slowest rank's time; one untimed call first."""
    fn()
    times = []
    for _ in range(iters):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        times.append(slowest(time.perf_counter() - t0))
    return sorted(times)[len(times) // 2]


def links(rank, world):
    """Section 2, on 4 hosts x 1 rank: one message over one link, then all_reduce busbw."""
    torch.set_num_threads(1)
    msg = torch.zeros(SIZE // 4)
    one_way = timed(lambda: dist.send(msg, 1) if rank == 0 else dist.recv(msg, 0) if rank == 1 else None)
    x = torch.zeros(SIZE // 4)
    factor = 2 * (world - 1) / world                     # nccl-tests' busbw factor for all_reduce
    busbw = {"gloo (built-in)": SIZE / timed(lambda: dist.all_reduce(x)) * factor / 1e9}
    for algorithm in ("ring", "ring_pipelined", "tree"):
        t = timed(lambda: collectives.all_reduce(x, algorithm=algorithm))
        busbw[f"ours, {algorithm}"] = SIZE / t * factor / 1e9
    return SIZE / one_way / 1e9, busbw


def placement(rank, world, algorithms):
    """Section 4: time each all_reduce algorithm at 16 MiB on this world's placement."""
    torch.set_num_threads(1)
    x = torch.zeros(SIZE // 4)
    return {a: timed(lambda: collectives.all_reduce(x, algorithm=a)) for a in algorithms}


def torchrun_rank(out):
    """Section 3: one rank under torchrun; writes what it saw, for the launcher to print."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://")
    rank = dist.get_rank()
    x = torch.tensor([float(rank)])
    collectives.all_reduce(x)
    with open(os.path.join(out, f"{rank}.json"), "w") as f:
        json.dump([rank, int(os.environ["LOCAL_RANK"]), int(os.environ["GROUP_RANK"]),
                   os.environ["MASTER_ADDR"], x.item()], f)
    dist.destroy_process_group()


def main():
    reason = lab.unavailable_reason()
    if reason:
        print(f"no lab here: {reason}")
        return
    print(f"1. a lab of 4 hosts, each linked to one switch at {RATE} each way (tbf):")
    with lab.Lab(lab.parse_lab(f"hosts=4,rate={RATE}")) as built:
        for k, ns in enumerate(built.netns):
            qdisc = subprocess.run(["tc", "-n", ns, "qdisc", "show", "dev", "eth0"],
                                   capture_output=True, text=True).stdout.split()
            print(f"   host {k}: {built.addresses[k]} on eth0, qdisc {qdisc[1]} rate {qdisc[qdisc.index('rate') + 1]}")

    one_way, busbw = run(links, 4, lab=f"hosts=4,rate={RATE}")[0]
    print(f"2. one 16 MiB message, host 0 -> host 1: {one_way:.3f} GB/s = "
          f"{one_way / LINK:.2f} of the link's {LINK:.3f} GB/s")
    print("   all_reduce of 16 MiB on 4 hosts, busbw (GB/s) and its fraction of the link:")
    for name, bw in busbw.items():
        print(f"   {name:16s} {bw:.3f}  {bw / LINK:.2f}")

    with tempfile.TemporaryDirectory() as out:
        code = lab.torchrun(lab.parse_lab(f"hosts=2,ranks-per-host=2,rate={RATE}"),
                            ["-m", "tutorials.demos.ch15_lab", "--torchrun-rank", out],
                            env={"LOGLEVEL": "WARNING", "TORCHELASTIC_LOG_LEVEL": "WARNING"}, timeout=300)
        print(f"3. torchrun, one agent on each of 2 hosts, 2 ranks each (exit code {code}):")
        for r in range(4):
            with open(os.path.join(out, f"{r}.json")) as f:
                rank, local, node, master, total = json.load(f)
            print(f"   rank {rank}: node {node}, local rank {local}, store at {master}, "
                  f"all_reduce of the ranks = {total:g}")

    print("4. 2 hosts x 2 ranks, all_reduce of 16 MiB; the ring crosses a link 2 times (by host) "
          "or 4 times (interleaved):")
    hier = "hierarchical" in collectives.ALGORITHMS["all_reduce"]
    by_host = run(placement, 4, ["ring"] + ["hierarchical"] * hier, lab=f"hosts=2,rate={RATE}")[0]
    inter = run(placement, 4, ["ring"], lab=f"hosts=2,rate={RATE},placement=interleaved")[0]
    print(f"   ring, ranks host by host (0,1 | 2,3): {by_host['ring'] * 1e3:7.1f} ms")
    print(f"   ring, interleaved (0,2 | 1,3):        {inter['ring'] * 1e3:7.1f} ms = "
          f"{inter['ring'] / by_host['ring']:.2f}x host by host")
    if hier:
        print(f"   hierarchical, host by host:           {by_host['hierarchical'] * 1e3:7.1f} ms = "
              f"{by_host['ring'] / by_host['hierarchical']:.2f}x faster than the ring")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--torchrun-rank"]:
        torchrun_rank(sys.argv[2])
    else:
        main()
