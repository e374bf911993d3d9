"""Subgroups with non-member callers, async handles, issue order, mixed back-to-back calls."""
import time

import torch
import torch.distributed as dist

import collectives
from collectives import ALGORITHMS

from .expected import builtin_collectives_forbidden
from .worlds import run_world


def subgroup_world(rank, n):
    """Every collective and algorithm on subgroups that skip rank 0 or are not contiguous."""
    failures = []
    for members in ([1, 2, 3], [0, 2], [3, 1]):
        group = dist.new_group(sorted(members))
        ranks = sorted(members)
        k = len(ranks)
        inside = rank in ranks
        me = ranks.index(rank) if inside else None
        untouched = torch.full((3,), -7.0)

        def check(name, cond):
            if not cond:
                failures.append(f"group {ranks} rank {rank}: {name}")

        with builtin_collectives_forbidden():
            for algo in ALGORITHMS["all_reduce"]:
                x = torch.full((5,), float(rank + 1)) if inside else untouched.clone()
                ret = collectives.all_reduce(x, group=group, algorithm=algo)
                want = float(sum(r + 1 for r in ranks))
                check(f"all_reduce[{algo}]", torch.all(x == want) if inside else
                      (ret is None and torch.equal(x, untouched)))
            for algo in ALGORITHMS["broadcast"]:
                for src in ranks:
                    x = torch.full((5,), float(rank)) if inside else untouched.clone()
                    collectives.broadcast(x, src=src, group=group, algorithm=algo)
                    check(f"broadcast[{algo}] src={src}", torch.all(x == src) if inside else torch.equal(x, untouched))
            for algo in ALGORITHMS["reduce"]:
                dst = ranks[-1]
                x = torch.full((4,), float(rank + 1))
                collectives.reduce(x, dst=dst, group=group, algorithm=algo)
                if rank == dst:
                    check(f"reduce[{algo}]", torch.all(x == sum(r + 1 for r in ranks)))
            for algo in ALGORITHMS["scatter"]:
                src = ranks[0]
                out = torch.zeros(2)
                pieces = [torch.full((2,), 10.0 + i) for i in range(k)] if rank == src else None
                collectives.scatter(out, pieces, src=src, group=group, algorithm=algo)
                if inside:
                    check(f"scatter[{algo}]", torch.all(out == 10.0 + me))
            for algo in ALGORITHMS["gather"]:
                dst = ranks[-1]
                outs = [torch.zeros(2) for _ in range(k)] if rank == dst else None
                collectives.gather(torch.full((2,), float(rank)), outs, dst=dst, group=group, algorithm=algo)
                if rank == dst:
                    check(f"gather[{algo}]", all(torch.all(o == r) for o, r in zip(outs, ranks)))
            for algo in ALGORITHMS["all_gather"]:
                outs = [torch.zeros(3) for _ in range(k)]
                collectives.all_gather(outs, torch.full((3,), float(rank)), group=group, algorithm=algo)
                if inside:
                    check(f"all_gather[{algo}]", all(torch.all(o == r) for o, r in zip(outs, ranks)))
            for algo in ALGORITHMS["reduce_scatter"]:
                out = torch.zeros(2)
                collectives.reduce_scatter(out, [torch.full((2,), float(rank * 10 + i)) for i in range(k)],
                                           group=group, algorithm=algo)
                if inside:
                    check(f"reduce_scatter[{algo}]", torch.all(out == sum(r * 10 + me for r in ranks)))
            for algo in ALGORITHMS["all_to_all"]:
                outs = [torch.zeros(1) for _ in range(k)]
                collectives.all_to_all(outs, [torch.tensor([rank * 10.0 + i]) for i in range(k)],
                                       group=group, algorithm=algo)
                if inside:
                    check(f"all_to_all[{algo}]", all(o.item() == r * 10 + me for o, r in zip(outs, ranks)))
            collectives.barrier(group=group)
    return failures


def test_subgroups_and_non_members():
    failures = [f for fs in run_world(subgroup_world, 4) for f in fs]
    assert not failures, "\n".join(failures)


def async_world(rank, n):
    out = {}
    # 1. async handles: issued together, waited in reverse order, results right
    xs = [torch.full((1000,), float(rank + i)) for i in range(6)]
    handles = [collectives.all_reduce(x, algorithm=a, async_op=True)
               for x, a in zip(xs, ALGORITHMS["all_reduce"] * 2)]
    for h in reversed(handles):
        h.wait()
    out["async_results"] = [x[0].item() for x in xs]
    out["completed"] = all(h.is_completed() for h in handles)

    # 2. async overlaps: rank 1 joins 1.5 s late; rank 0's async call must return at once
    #    and its computation must run while the collective waits
    if rank == 1:
        time.sleep(1.5)
    t0 = time.monotonic()
    y = torch.full((10,), float(rank))
    h = collectives.broadcast(y, src=1, async_op=True)
    issued = time.monotonic() - t0
    busy_done_before_wait = not h.is_completed() if rank == 0 else True
    z = torch.randn(200, 200)
    for _ in range(20):
        z = z @ z.t() / 200  # the caller's own work, overlapping the collective
    h.wait()
    out["issue_seconds"] = issued
    out["pending_while_computing"] = busy_done_before_wait
    out["broadcast"] = y[0].item()

    # 3. mixed sync/async back to back complete in issue order
    a = torch.full((7,), float(rank + 1))
    b = torch.full((7,), float(rank))
    c = torch.zeros(3)
    h1 = collectives.all_reduce(a, async_op=True, algorithm="ring")
    collectives.broadcast(b, src=n - 1)                       # sync, queued behind h1
    h2 = collectives.all_reduce(a, op=dist.ReduceOp.MAX, async_op=True)  # must see h1's result
    outs = [torch.zeros(3) for _ in range(n)]
    h3 = collectives.all_gather(outs, c + rank, async_op=True)
    collectives.barrier()
    h3.wait(), h2.wait(), h1.wait()
    out["mixed"] = (a[0].item(), b[0].item(), [o[0].item() for o in outs])

    # 4. get_future for DDP-style hooks: its value is a list of tensors, as torch's is
    f = collectives.all_reduce(torch.ones(4), async_op=True).get_future()
    value = f.wait()
    out["future"] = value[0][0].item() if isinstance(value, list) and len(value) == 1 else value
    return out


def test_async_handles_overlap_and_issue_order():
    n = 3
    results = run_world(async_world, n)
    for rank, out in enumerate(results):
        assert out["async_results"] == [float(sum(r + i for r in range(n))) for i in range(6)]
        assert out["completed"]
        assert out["broadcast"] == 1.0
        assert out["mixed"] == (float(n * (n + 1) // 2), float(n - 1), [0.0, 1.0, 2.0])
        assert out["future"] == float(n)
    assert results[0]["issue_seconds"] < 0.5, "async_op=True must not wait for the peers"
    assert results[0]["pending_while_computing"], "the collective should still be pending while rank 0 computes"
