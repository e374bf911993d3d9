"""Chapter 5: the five all-reduce algorithms, counted, and the alpha-beta cost model.

    python -m tutorials.demos.ch05_algorithms

Each algorithm runs once under ``collectives.trace()``. From the messages it
really sent, the cost model predicts its time as ``cost_model.predict`` does:
alpha x max(steps, messages) + beta x max(critical bytes, bytes sent, bytes
received), steps running one after another, each as long as its largest
message (the critical bytes sum those). Gamma, the time to reduce a byte, is 0
here: a trace shows messages, not additions (chapter 13 adds it). That
prediction, evaluated at every message size, says which algorithm wins where.
"""
import torch
import torch.distributed as dist

import collectives
from collectives.tuning import cost_model
from tutorials.demos.common import run

WORLD_SIZE = 4
ALPHA = 5e-6           # seconds per step: latency of one message (a typical datacentre link)
BETA = 1 / 12.5e9      # seconds per byte: 100 Gbit/s
ELEMENTS = 4096        # traced once; steps and bytes per step scale with the size
ALGORITHMS = ["naive_ring", "ring", "recursive_doubling", "rabenseifner", "tree"]


def traced_steps(algorithm, rank, world_size):
    """For one all_reduce of ELEMENTS floats: per step, the largest message any rank sent (bytes);
    and the busiest rank's messages sent or received, bytes sent, bytes received."""
    x = torch.full((ELEMENTS,), float(rank))
    with collectives.trace() as messages:
        collectives.all_reduce(x, algorithm=algorithm)
    mine = [(m.kind, m.step, m.nbytes) for m in messages.messages]
    everyone = [None] * world_size
    dist.all_gather_object(everyone, mine)
    largest, busiest = {}, (0, 0, 0)
    for seen in everyone:
        for kind, step, nbytes in seen:
            if kind == "send":
                largest[step] = max(largest.get(step, 0), nbytes)
        count = {k: sum(1 for kind, _, _ in seen if kind == k) for k in ("send", "recv")}
        nbytes = {k: sum(b for kind, _, b in seen if kind == k) for k in ("send", "recv")}
        busiest = tuple(map(max, busiest, (max(count.values()), nbytes["send"], nbytes["recv"])))
    return [largest[s] for s in sorted(largest)], busiest


def predicted_time(traced, nbytes):
    """The model's time of an all_reduce of ``nbytes`` whose trace was for ELEMENTS floats."""
    steps, (messages, sent, received) = traced
    scale = nbytes / (ELEMENTS * 4)
    return ALPHA * max(len(steps), messages) + BETA * max(sum(steps), sent, received) * scale


def pretty(nbytes):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024:
            return f"{nbytes:g} {unit}"
        nbytes /= 1024
    return f"{nbytes:g} TiB"


def demo(rank, world_size):
    steps = {a: traced_steps(a, rank, world_size) for a in ALGORITHMS}
    if rank != 0:
        return
    size = ELEMENTS * 4
    print(f"all_reduce of S = {size} bytes on N = {world_size} ranks, as traced:")
    print(f"  {'algorithm':20s} steps  bytes on the critical path")
    for algorithm, (per_step, _) in steps.items():
        print(f"  {algorithm:20s} {len(per_step):5d}  {sum(per_step):6d} = {sum(per_step) / size:g} S")

    print(f"predicted time in us (alpha = {ALPHA * 1e6:g} us, beta = 1 / {1 / BETA / 1e9:g} GB/s, gamma = 0):")
    print(f"  {'size':>9s}" + "".join(f"{a[:12]:>13s}" for a in steps) + "  fastest")
    params = {"alpha": ALPHA, "beta": BETA, "gamma": 0.0}
    agree = True
    for nbytes in [8, 1024, 32 * 1024, 256 * 1024, 1024 ** 2, 16 * 1024 ** 2, 256 * 1024 ** 2]:
        times = {a: predicted_time(s, nbytes) for a, s in steps.items()}
        best = min(times, key=times.get)
        print(f"  {pretty(nbytes):>9s}" + "".join(f"{t * 1e6:13.1f}" for t in times.values())
              + f"  {best}")
        # Above 1 MiB Rabenseifner cuts its halves into more messages (to bound its
        # memory), which the 16 KiB trace cannot show: compare where the schedules are the same.
        for a, t in times.items():
            card = cost_model.predict("all_reduce", a, world_size, nbytes, params)
            agree = agree and (nbytes > 1024 ** 2 or abs(card - t) <= 1e-9 * max(t, 1e-6))
    print(f"collectives.tuning.cost_model.predict (each algorithm's cost()) gives the same times "
          f"up to 1 MiB: {agree}")


if __name__ == "__main__":
    run(demo, WORLD_SIZE)
