"""Chapter 22: one algorithm, two transports.

    python -m tutorials.demos.ch22_transports

1. The same ring all_reduce over the gloo door (TCP on the loopback) and over the
   shared-memory door (``collectives/shm.py``): the same bits, and the time of each.
2. Bytes copied per byte moved, from the shared-memory module's ``cost()``.
3. Where the doorbell's latency decides and where memory bandwidth does: each door's
   ping-pong fitted to alpha + beta S (``benchmarks.pingpong``, ``cost_model.fit``).
4. The simulator's ``local`` preset calibrated for each door from those fits, and the
   ring of step 1 played out on each.

The door reads ``COLLECTIVES_TRANSPORT`` at every call, so one world switches between the
two (``auto``: shared memory between ranks of one host; ``gloo``: every message over gloo).
"""
import contextlib
import io
import os
import statistics
import time

import torch
import torch.distributed as dist

import collectives
from benchmarks import pingpong
from collectives import shm
from collectives.sim import simulate
from collectives.tuning import cost_model
from tutorials.demos.common import run

WORLD_SIZE = 2
MiB = 1 << 20
RING_BYTES = 8 * MiB
# The ping-pong's sizes, for the fits: the largest must take many times alpha on either door,
# or the slope (beta) is noise and alpha / beta anything at all (seen: 157 MB from 1 MiB rows).
SIZES = (4 << 10, 256 << 10, 8 << 20)
# Each door's ping-pong is measured this many times, the doors taking turns, and each size keeps
# its fastest: load only ever adds time to a message. One measurement (each size the median of 5
# rounds) beside the other demos once had stalls in most rounds of two sizes, and its slope came
# out at zero (printed as 1,000,000 GB/s).
REPEATS = 3


@contextlib.contextmanager
def door(name):
    """Send this block's messages through ``name`` (``gloo`` or ``auto``), then put it back."""
    before = os.environ.get("COLLECTIVES_TRANSPORT")
    os.environ["COLLECTIVES_TRANSPORT"] = name
    try:
        yield
    finally:
        if before is None:
            del os.environ["COLLECTIVES_TRANSPORT"]
        else:
            os.environ["COLLECTIVES_TRANSPORT"] = before


def ring_once(x, transport):
    """One ring all_reduce of a copy of ``x`` over ``transport``: (result, seconds)."""
    y = x.clone()
    with door(transport):
        dist.barrier()
        start = time.perf_counter()
        collectives.all_reduce(y, algorithm="ring")
        return y, time.perf_counter() - start


def same_ring_two_doors(rank, n):
    print("1. the same ring all_reduce of 8 MiB over each door (median of 3 rounds, interleaved)")
    # values that encode the rank: any lost or misplaced byte changes the sum
    x = torch.arange(RING_BYTES // 4, dtype=torch.float32) % 1000 + 1000 * rank
    times = {"gloo": [], "auto": []}
    results = {}
    for round_ in range(4):
        for transport in (("gloo", "auto") if round_ % 2 else ("auto", "gloo")):
            results[transport], t = ring_once(x, transport)
            if round_:          # round 0 warms up (and sets the group's mailboxes up)
                times[transport].append(t)
    want = sum(torch.arange(RING_BYTES // 4, dtype=torch.float32) % 1000 + 1000 * r for r in range(n))
    print(f"   same bits on both doors: {torch.equal(results['gloo'], results['auto'])}, "
          f"equal to the closed form: {torch.equal(results['auto'], want)}")
    gloo, mem = statistics.median(times["gloo"]), statistics.median(times["auto"])
    print(f"   gloo door, ring of 8 MiB (ms): {gloo * 1e3:.1f}")
    print(f"   shared-memory door, ring of 8 MiB (ms): {mem * 1e3:.1f}")
    print(f"   gloo / shared memory, time: {gloo / mem:.1f}")


def copies():
    print("2. bytes copied per byte moved (shm.cost: the module's card as code)")
    small, big = shm.cost(64 << 10), shm.cost(RING_BYTES // 2)   # big: one ring message at N=2
    through = shm.cost(RING_BYTES // 2, direct_min=None)
    side = shm.cost(RING_BYTES // 2, direct_min=None, pipelined=True)
    print(f"   a 64 KiB message, through its mailbox: {small['copies']} copies per byte, "
          f"{small['pieces']} piece, {small['syscalls']} doorbell write{'s' * (small['syscalls'] != 1)}")
    print(f"   a 4 MiB message where ranks outnumber cores, read from the sender's tensor: "
          f"{big['copies']} copy per byte ({big['bytes_copied'] // MiB} MiB copied), {big['syscalls']} system calls")
    print(f"   the same 4 MiB through 2 MiB mailboxes (where the kernel forbids reading a peer): "
          f"{through['copies']} copies per byte ({through['bytes_copied'] // MiB} MiB copied), "
          f"{through['pieces']} pieces, {through['syscalls']} doorbell writes")
    print(f"   the same 4 MiB where each rank has a core of its own (this demo's {WORLD_SIZE} ranks, "
          f"on {WORLD_SIZE} cores or more): {side['copies']} copies per byte, made side by side in "
          f"{shm.PIECE // 1024} KiB pieces, {side['syscalls']} doorbell writes")
    print("   gloo on the loopback: 2 copies per byte (write into the socket, read out of it),")
    print("   plus TCP/IP, socket threads on both sides and system calls for every piece")


def least_disturbed(repeats):
    """Rows of one size each, every time field the fastest of ``repeats`` (lists of rows). The
    rates (``_GBps``) are left out: each was worked out from one repeat's time, not these."""
    return [{key: min(r[key] for r in same) if key.endswith("_us") else value
             for key, value in same[0].items() if not key.endswith("_GBps")}
            for same in zip(*repeats)]


def fits(rank, n):
    print("3. alpha + beta S fitted to each door's ping-pong (4 KiB, 256 KiB, 8 MiB)")
    doors = (("gloo", "gloo"), ("shared memory", "auto"))
    repeats = {name: [] for name, _ in doors}
    for _ in range(REPEATS):
        for name, transport in doors:
            with door(transport):
                repeats[name].append(pingpong.measure(rank, n, torch.device("cpu"), list(SIZES), iters=5, warmup=2))
    found = {name: cost_model.fit(least_disturbed(rows)) for name, rows in repeats.items()}
    for name, f in found.items():
        crossover = f["alpha"] / f["beta"]         # where alpha = beta S
        print(f"   {name} door, alpha (us): {f['alpha'] * 1e6:.0f}")
        print(f"   {name} door, bandwidth (GB/s): {1e-9 / f['beta']:.1f}")
        print(f"   {name} door, alpha = beta S at (KiB): {crossover / 1024:.0f}")
    print("   below that size the wake-up decides (a system call and a context switch per message);")
    print("   above it, copying the bytes does: memory bandwidth")
    return found


def calibrated(found):
    print("4. the simulator's local preset calibrated for each door, the ring of step 1 played out on it")
    for name, f in found.items():
        spec = {"kind": "flat", "alpha": f["alpha"], "bandwidth": 1 / f["beta"], "gamma": f["gamma"],
                "cores": 2, "wake": 0.0, "name": f"local ({name})"}
        r = simulate("all_reduce", "ring", WORLD_SIZE, RING_BYTES, spec)
        print(f"   local ({name}), simulated ring of 8 MiB (ms): {r.time * 1e3:.1f}")


def demo(rank, world_size):
    torch.set_num_threads(1)
    # every rank takes part in every step; rank 0 tells
    with contextlib.redirect_stdout(io.StringIO()) if rank else contextlib.nullcontext():
        same_ring_two_doors(rank, world_size)
        if rank == 0:
            copies()
        found = fits(rank, world_size)
        if rank == 0:
            calibrated(found)


if __name__ == "__main__":
    run(demo, WORLD_SIZE)
