"""Subgroups with non-member callers, async handles, issue order, mixed back-to-back calls."""
import threading
import time

import pytest
import torch
import torch.distributed as dist

import collectives
from collectives import ALGORITHMS, observers, p2p_api

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


# -- who runs a call: the caller, or its lane's thread (collectives/engine.py) ---------------

class _Runners:
    """An observer noting the thread that ran each call (the call machinery reports a call
    from the thread that ran it)."""

    def __init__(self):
        self.threads = []

    def _observe(self, msg):
        pass

    def _observe_call(self, call):
        self.threads.append(threading.current_thread().name)


def _on_caller(runners):
    """How many of the recorded calls ran on this (the calling) thread, of how many."""
    me = threading.current_thread().name
    return sum(t == me for t in runners.threads), len(runners.threads)


def caller_world(rank, n):
    out = {}
    g = dist.new_group(list(range(n)), backend="collectives")
    x = torch.ones(1)
    dist.all_reduce(x, group=g)                      # the group's first call (its agreement)

    # 1. with the lane idle, a blocking call through torch runs on the caller's thread (no hop
    #    to the lane's thread), as do the two calls of a blocking coalesced one (torch says
    #    the call blocks in opts.asyncOp); async ones waited at once still complete
    with observers.observing(_Runners()) as runners:
        for _ in range(20):
            dist.all_reduce(x, group=g)
        dist.all_reduce_coalesced([torch.ones(2), torch.ones(3)], group=g)
    out["blocking_on_caller"] = _on_caller(runners)
    x = torch.ones(1)
    for _ in range(5):
        dist.all_reduce(x, group=g, async_op=True).wait()
        collectives.all_reduce(x, group=g, async_op=True).wait()
    out["async_waited"] = x.item()

    # 2. async work nobody waits for still moves: the lane's thread runs it
    with observers.observing(_Runners()) as runners:
        y = torch.full((3,), float(rank))
        h = dist.all_reduce(y, group=g, async_op=True)
        got = torch.zeros(3)
        hs = p2p_api.isend(torch.full((3,), float(rank)), (rank + 1) % n)
        hr = p2p_api.irecv(got, (rank - 1) % n)
        deadline = time.monotonic() + 20
        while not (h.is_completed() and hs.is_completed() and hr.is_completed()) and time.monotonic() < deadline:
            time.sleep(0.01)
        out["async_completed_unwaited"] = (h.is_completed(), hs.is_completed(), hr.is_completed())
        h.wait(), hs.wait(), hr.wait()
    out["async_values"] = (y[0].item(), got[0].item())
    out["async_on_caller"] = _on_caller(runners)

    # 3. several async calls, only one waited for: they still run in issue order on every
    #    rank (the ranks wait in different ways and at different times)
    orders = []
    for case in range(4):
        a = torch.full((2,), float(rank + 1))
        b = torch.full((2,), float(rank))
        outs = [torch.zeros(2) for _ in range(n)]
        hs = [dist.all_reduce(a, group=g, async_op=True),                          # sum
              dist.all_reduce(a, op=dist.ReduceOp.PRODUCT, group=g, async_op=True),  # sum ** n
              collectives.broadcast(b, src=n - 1, group=g, async_op=True),
              dist.all_gather(outs, a, group=g, async_op=True),                       # reads a's product
              dist.all_reduce(b, group=g, async_op=True)]                             # of the broadcast
        if (rank + case) % 2:
            time.sleep(0.2)         # the calls are done before the waits
        if case >= 2:
            hs[0].wait()            # the first one, then the last one
        hs[-1].wait()
        orders.append((a[0].item(), b[0].item(), [o[0].item() for o in outs]))
    out["order"] = orders

    # 4. a future's callback issuing a blocking collective on the same group does not hang,
    #    whether the first call is done before the callback is attached or not (case 2: each
    #    rank its own way). One callback is in flight at a time: a collective issued from a
    #    callback takes its place in the group's order when the callback runs, so a second
    #    call issued meanwhile by the main thread would race it for that place, and the ranks
    #    could order the two differently (as under torch's own backends).
    for case in range(3):
        for issue in (lambda t: dist.all_reduce(t, group=g, async_op=True),
                      lambda t: collectives.all_reduce(t, group=g, async_op=True)):
            z = torch.ones(1)
            w = torch.ones(1)
            h = issue(z)
            if case == 1 or case == 2 and rank % 2:
                time.sleep(0.2)     # done before the callback is attached: it runs right here
            f = h.get_future().then(lambda _: (dist.all_reduce(w, group=g), w.item())[1])
            h.wait()
            out.setdefault(f"callback{case}", []).append((z.item(), f.wait()))
    return out


@pytest.mark.parametrize("n", [2, 3])
def test_blocking_torch_calls_run_on_the_caller_and_async_ones_keep_issue_order(n):
    results = run_world(caller_world, n, backend="collectives", timeout=120)
    s = float(n * (n + 1) // 2)
    for rank, out in enumerate(results):
        assert out["blocking_on_caller"] == (22, 22)
        assert out["async_waited"] == float(n ** 10)
        assert out["async_completed_unwaited"] == (True, True, True)
        assert out["async_values"] == (float(sum(range(n))), float((rank - 1) % n))
        assert out["async_on_caller"][0] == 0, "nobody waited: the lane's threads ran them"
        assert out["order"] == [(s ** n, float(n * (n - 1)), [s ** n] * n)] * 4, (rank, out["order"])
        for case in range(3):
            assert out[f"callback{case}"] == [(float(n), float(n))] * 2


# -- the engine's two locks are always taken in one order --------------------------------------

def test_a_lane_retired_while_its_first_queued_call_starts_its_thread_does_not_deadlock():
    """The engine's lock, then a lane's (``Engine._lane`` retiring a lane whose key a new
    group took, or a group collected): a submit that held its lane's lock while it took the
    engine's (to register the exit hook with the lane's first thread) could wait for a thread
    that waited for it. Forced here: the retirer takes the engine's lock the moment the
    submit asks for it."""
    import threading
    from collectives.engine import Engine

    e = Engine()
    lane = e._lane("k")
    asking, retirer_holds = threading.Event(), threading.Event()

    def register_late():       # as the real one, which takes the engine's lock, minus atexit
        asking.set()
        retirer_holds.wait(5)
        with e._lock:
            pass
    e._register_exit_hook = register_late

    def retirer():
        asking.wait(5)
        with e._lock:
            retirer_holds.set()
            lane.retire()
    other = threading.Thread(target=retirer, daemon=True)
    other.start()
    submitter = threading.Thread(target=lambda: e.submit(lambda seq: seq, "call", True, key="k"), daemon=True)
    submitter.start()
    submitter.join(10)
    other.join(10)
    assert not submitter.is_alive() and not other.is_alive(), "the two locks were taken in opposite orders"
