"""Chapter 3: the nine collectives, ours next to torch.distributed's, on 4 ranks.

    python -m tutorials.demos.ch03_collectives

Every input encodes its rank, so each result can be checked by eye. Each
collective runs twice on fresh inputs, once as ``collectives.X`` and once as
``torch.distributed.X``; the line ends with whether all ranks agree.
"""
import torch
import torch.distributed as dist

import collectives
from tutorials.demos.common import run

WORLD_SIZE = 4


def show(x):
    if x is None:
        return "-"
    if isinstance(x, list):
        return " ".join(show(t) for t in x)
    return str(x.tolist()).replace(" ", "")


ABSENT = "absent"   # what run_both returns for torch's side when this torch lacks the built-in


def run_both(case, rank, n):
    """Run ``case(lib, rank, n)`` with our module and with torch's; return (ours, torch's).

    Older torch versions lack some gloo built-ins (torch 2.11 has no gloo
    all_to_all): the built-in then refuses on every rank before sending
    anything, and only ours is shown.
    """
    ours = case(collectives, rank, n)
    try:
        return ours, case(dist, rank, n)
    except RuntimeError as exc:
        if "does not support" not in str(exc):
            raise
        return ours, ABSENT


def broadcast(lib, rank, n):
    t = torch.tensor([10 + rank])
    lib.broadcast(t, src=0)
    return t


def reduce(lib, rank, n):
    t = torch.tensor([10 + rank])
    lib.reduce(t, dst=0)           # other ranks keep partial sums: look only at dst
    return t if rank == 0 else None


def all_reduce(lib, rank, n):
    t = torch.tensor([10 + rank])
    lib.all_reduce(t)
    return t


def scatter(lib, rank, n):
    t = torch.zeros(1, dtype=torch.int64)
    pieces = [torch.tensor([10 * (i + 1)]) for i in range(n)] if rank == 0 else None
    lib.scatter(t, pieces, src=0)
    return t


def gather(lib, rank, n):
    out = [torch.zeros(1, dtype=torch.int64) for _ in range(n)] if rank == 0 else None
    lib.gather(torch.tensor([10 + rank]), out, dst=0)
    return out


def all_gather(lib, rank, n):
    out = [torch.zeros(1, dtype=torch.int64) for _ in range(n)]
    lib.all_gather(out, torch.tensor([10 + rank]))
    return out


def reduce_scatter(lib, rank, n):
    out = torch.zeros(1, dtype=torch.int64)
    lib.reduce_scatter(out, [torch.tensor([10 * (i + 1) + rank]) for i in range(n)])
    return out


def all_to_all(lib, rank, n):
    ins = [torch.tensor([10 * rank + j]) for j in range(n)]
    outs = [torch.zeros(1, dtype=torch.int64) for _ in range(n)]
    lib.all_to_all(outs, ins)
    return outs


def barrier(lib, rank, n):
    lib.barrier()
    return None


INPUTS = {
    "broadcast": "[10+r], src=0",
    "reduce": "[10+r], dst=0",
    "all_reduce": "[10+r]",
    "scatter": "rank 0: [10] [20] [30] [40]",
    "gather": "[10+r], dst=0",
    "all_gather": "[10+r]",
    "reduce_scatter": "[10+r] [20+r] [30+r] [40+r]",
    "all_to_all": "[10r+0] [10r+1] [10r+2] [10r+3]",
    "barrier": "(no data)",
}
CASES = [broadcast, reduce, all_reduce, scatter, gather, all_gather, reduce_scatter,
         all_to_all, barrier]


def demo(rank, world_size):
    for case in CASES:
        ours, theirs = run_both(case, rank, world_size)
        results = [None] * world_size
        dist.all_gather_object(results, (show(ours), theirs if theirs is ABSENT else show(theirs)))
        if rank == 0:
            if any(b == ABSENT for _, b in results):
                version = torch.__version__.split("+")[0]
                verdict = f"(torch {version}'s gloo has no {case.__name__}: ours alone)"
            else:
                verdict = f"same as torch: {all(a == b for a, b in results)}"
            print(f"{case.__name__:<15} in: {INPUTS[case.__name__]}")
            print("  out: " + " | ".join(a for a, _ in results) + f"   {verdict}")


if __name__ == "__main__":
    run(demo, WORLD_SIZE)
