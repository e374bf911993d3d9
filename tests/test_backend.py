"""torch.distributed's own calls under ``backend="collectives"``: a conformance matrix.

Each world (sizes 1-5) runs with ``init_process_group("collectives")`` and calls
``torch.distributed`` directly: every collective, the tensor forms, the object
collectives, send/recv, async handles, on the whole world and on a subgroup,
for every algorithm of ours (chosen per group as ``COLLECTIVES_ALGO`` would).
Expected values are computed locally (tests/expected.py) and, where gloo has
the operation, also compared with a gloo group of the same ranks. Every case
with data to move must show messages in ``count_traffic()``: the bytes went
through our door, not through a built-in.
"""
import itertools
import os

import pytest
import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

import collectives
from collectives import ALGORITHMS
from collectives.backend import backend_of
from collectives.errors import UnsupportedOperation
from collectives.settings import parse_algorithms

from .expected import OP_NAMES, assert_same, op_dtype_pairs, payload, reduce_expected, reduce_input
from .test_collectives import assert_matrix_passed
from .worlds import run_world

SHAPES = ((1,), (7,), (3, 5))


def _moved(traffic, n, numel):
    """Our door carried the call (nothing to move on a group of one or for an empty tensor)."""
    return n == 1 or numel == 0 or traffic.sent_messages + traffic.recv_messages > 0


def _cases(rank, group, ranks, ref):
    """(name, case) pairs for one group; ``ranks`` its global ranks, ``ref`` a gloo group of them."""
    n = len(ranks)
    me = ranks.index(rank)
    backend = backend_of(group)

    def use(collective, algo):
        backend._algorithms = {collective: algo}

    def run(collective, algo, numel, fn):
        use(collective, algo)
        with collectives.count_traffic() as t:
            fn()
        assert _moved(t, n, numel), f"no message went through our door for {collective}[{algo}]"

    for algo in ALGORITHMS["all_reduce"]:
        pairs = op_dtype_pairs() if algo == ALGORITHMS["all_reduce"][0] else \
            [(ReduceOp.SUM, torch.float32), (ReduceOp.BXOR, torch.int64), (ReduceOp.AVG, torch.float64)]
        for (op, dt), shape, async_op in itertools.product(pairs, SHAPES, (False, True)):
            def case(algo=algo, op=op, dt=dt, shape=shape, async_op=async_op):
                x = reduce_input(me, shape, dt, op)
                want = reduce_expected([reduce_input(r, shape, dt, op) for r in range(n)], op)

                def call():
                    work = dist.all_reduce(x, op=op, group=group, async_op=async_op)
                    if async_op:
                        assert work.get_future().wait()[0] is x or torch.equal(work.get_future().value()[0], x)
                        work.wait()
                run("all_reduce", algo, x.numel(), call)
                assert_same(x, want, "vs closed form")
                if dt == torch.float32 and op == ReduceOp.SUM:
                    y = reduce_input(me, shape, dt, op)
                    dist.all_reduce(y, op=op, group=ref)
                    assert torch.equal(x, y) or n > 2, "vs gloo"
                    assert_same(x, y, "vs gloo")
            yield f"all_reduce[{algo}] op={OP_NAMES[op]} {dt} {shape} async={async_op}", case

    def coalesced():
        xs = [reduce_input(me, s, torch.float32, ReduceOp.SUM) for s in SHAPES]
        run("all_reduce", "ring", 1, lambda: dist.all_reduce_coalesced(xs, group=group))
        for x, s in zip(xs, SHAPES):
            assert_same(x, reduce_expected([reduce_input(r, s, torch.float32, ReduceOp.SUM)
                                            for r in range(n)], ReduceOp.SUM), "coalesced")
    yield "all_reduce_coalesced", coalesced

    for algo, root, shape in itertools.product(ALGORITHMS["broadcast"], (0, n - 1), SHAPES):
        def case(algo=algo, root=root, shape=shape):
            x = payload(me, shape, torch.float32)
            run("broadcast", algo, x.numel(), lambda: dist.broadcast(x, src=ranks[root], group=group))
            assert torch.equal(x, payload(root, shape, torch.float32))
        yield f"broadcast[{algo}] root={root} {shape}", case

    for algo, root, (op, dt) in itertools.product(ALGORITHMS["reduce"], (0, n - 1),
                                                  [(ReduceOp.SUM, torch.float32), (ReduceOp.MAX, torch.int32)]):
        def case(algo=algo, root=root, op=op, dt=dt):
            x = reduce_input(me, (7,), dt, op)
            before = x.clone()
            run("reduce", algo, 7, lambda: dist.reduce(x, dst=ranks[root], op=op, group=group))
            want = reduce_expected([reduce_input(r, (7,), dt, op) for r in range(n)], op)
            assert_same(x, want if me == root else before, "reduce")
        yield f"reduce[{algo}] root={root} op={OP_NAMES[op]} {dt}", case

    for algo, shape in itertools.product(ALGORITHMS["all_gather"], SHAPES):
        def case(algo=algo, shape=shape):
            x = payload(me, shape, torch.float64)
            outs = [torch.empty(shape, dtype=torch.float64) for _ in range(n)]
            run("all_gather", algo, x.numel(), lambda: dist.all_gather(outs, x, group=group))
            assert all(torch.equal(o, payload(i, shape, torch.float64)) for i, o in enumerate(outs))
            flat = torch.empty((n * shape[0],) + shape[1:], dtype=torch.float64)
            run("all_gather", algo, x.numel(), lambda: dist.all_gather_into_tensor(flat, x, group=group))
            assert torch.equal(flat, torch.cat([payload(i, shape, torch.float64) for i in range(n)]))
            objs = [None] * n
            dist.all_gather_object(objs, {"rank": me, "shape": shape}, group=group)
            assert objs == [{"rank": i, "shape": shape} for i in range(n)]
        yield f"all_gather[{algo}] + into_tensor + object {shape}", case

    for algo, root in itertools.product(ALGORITHMS["gather"], (0, n - 1)):
        def case(algo=algo, root=root):
            x = payload(me, (5,), torch.int64)
            outs = [torch.empty(5, dtype=torch.int64) for _ in range(n)] if me == root else None
            run("gather", algo, 5, lambda: dist.gather(x, outs, dst=ranks[root], group=group))
            if me == root:
                assert all(torch.equal(o, payload(i, (5,), torch.int64)) for i, o in enumerate(outs))
            objs = [None] * n if me == root else None
            dist.gather_object(("hi", me), objs, dst=ranks[root], group=group)
            if me == root:
                assert objs == [("hi", i) for i in range(n)]
        yield f"gather[{algo}] root={root} + gather_object", case

    for algo, root in itertools.product(ALGORITHMS["scatter"], (0, n - 1)):
        def case(algo=algo, root=root):
            out = torch.empty(3, 2)
            pieces = [payload(i, (3, 2), torch.float32) for i in range(n)] if me == root else None
            run("scatter", algo, 6, lambda: dist.scatter(out, pieces, src=ranks[root], group=group))
            assert torch.equal(out, payload(me, (3, 2), torch.float32))
            got = [None]
            dist.scatter_object_list(got, [f"to {i}" for i in range(n)] if me == root else None,
                                     src=ranks[root], group=group)
            assert got == [f"to {me}"]
            objs = [me, "x"] if me == root else [None, None]
            dist.broadcast_object_list(objs, src=ranks[root], group=group)
            assert objs == [root, "x"]
        yield f"scatter[{algo}] root={root} + scatter_object_list + broadcast_object_list", case

    for algo, (op, dt) in itertools.product(ALGORITHMS["reduce_scatter"],
                                            [(ReduceOp.SUM, torch.float32), (ReduceOp.BOR, torch.int32),
                                             (ReduceOp.AVG, torch.float64)]):
        def case(algo=algo, op=op, dt=dt):
            ins = [reduce_input(me * n + j, (4,), dt, op) for j in range(n)]
            out = torch.empty(4, dtype=dt)
            run("reduce_scatter", algo, 4, lambda: dist.reduce_scatter(out, ins, op=op, group=group))
            want = reduce_expected([reduce_input(r * n + me, (4,), dt, op) for r in range(n)], op)
            assert_same(out, want, "reduce_scatter")
            flat = torch.cat(ins)
            out2 = torch.empty(4, dtype=dt)
            run("reduce_scatter", algo, 4, lambda: dist.reduce_scatter_tensor(out2, flat, op=op, group=group))
            assert_same(out2, want, "reduce_scatter_tensor")
        yield f"reduce_scatter[{algo}] + tensor op={OP_NAMES[op]} {dt}", case

    for algo in ALGORITHMS["all_to_all"]:
        def case(algo=algo):
            ins = [torch.full((j + 1,), 10.0 * me + j) for j in range(n)]       # uneven sizes
            outs = [torch.empty(me + 1) for _ in range(n)]
            uneven_ok = algo != "bruck" or n == 1      # Bruck takes pieces of one size only
            if uneven_ok:
                run("all_to_all", algo, 1, lambda: dist.all_to_all(outs, ins, group=group))
                assert all(torch.equal(o, torch.full((me + 1,), 10.0 * i + me)) for i, o in enumerate(outs))
            else:   # refused on every rank, before any message
                use("all_to_all", algo)
                with pytest.raises(ValueError, match="algorithm='bruck' needs pieces of one size"):
                    dist.all_to_all(outs, ins, group=group)
            # all_to_all_single, even, then uneven rows (input_split_sizes[j] = j + 1)
            x = torch.arange(2.0 * n) + 100 * me
            y = torch.empty(2 * n)
            run("all_to_all", algo, 1, lambda: dist.all_to_all_single(y, x, group=group))
            assert torch.equal(y, torch.cat([torch.arange(2.0 * me, 2.0 * me + 2) + 100 * i for i in range(n)]))
            if not uneven_ok:
                return
            x = torch.cat([torch.full((j + 1, 2), 10.0 * me + j) for j in range(n)])
            y = torch.empty(n * (me + 1), 2)
            run("all_to_all", algo, 1, lambda: dist.all_to_all_single(
                y, x, output_split_sizes=[me + 1] * n, input_split_sizes=[j + 1 for j in range(n)], group=group))
            assert torch.equal(y, torch.cat([torch.full((me + 1, 2), 10.0 * i + me) for i in range(n)]))
        yield f"all_to_all[{algo}] + single even/uneven", case

    def barrier():
        run("barrier", "dissemination", 1, lambda: dist.barrier(group=group))
        try:
            dist.monitored_barrier(group=group)
        except ValueError as exc:
            # torch 2.11 refuses any backend but gloo before it reaches ours
            assert "only implemented for GLOO" in str(exc), exc
            backend_of(group).monitored_barrier()
    yield "barrier + monitored_barrier", barrier

    def point_to_point():
        if n == 1:
            return
        right, left = ranks[(me + 1) % n], ranks[(me - 1) % n]
        got = torch.empty(3)
        reqs = [dist.isend(torch.full((3,), float(me)), right, group=group, tag=5),
                dist.irecv(got, left, group=group, tag=5)]
        for r in reqs:
            r.wait()
        assert torch.equal(got, torch.full((3,), float((me - 1) % n)))
    yield "isend/irecv ring", point_to_point

    def batched_point_to_point():
        # torch's own batch_isend_irecv asks the group for its CPU backend first; receives listed
        # before sends, two messages in one direction (kept in order) and two tags in one batch
        if n == 1:
            return
        right, left = ranks[(me + 1) % n], ranks[(me - 1) % n]
        got = [torch.empty(4), torch.empty(2, dtype=torch.int64), torch.empty(0)]
        ops = [dist.P2POp(dist.irecv, got[0], left, group, tag=0),
               dist.P2POp(dist.irecv, got[1], left, group, tag=9),
               dist.P2POp(dist.irecv, got[2], left, group, tag=9),
               dist.P2POp(dist.isend, torch.arange(4.0) + 10 * me, right, group, tag=0),
               dist.P2POp(dist.isend, torch.tensor([me, -me]), right, group, tag=9),
               dist.P2POp(dist.isend, torch.empty(0), right, group, tag=9)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        prev = (me - 1) % n
        assert torch.equal(got[0], torch.arange(4.0) + 10 * prev), got
        assert got[1].tolist() == [prev, -prev], got
    yield "batch_isend_irecv ring", batched_point_to_point

    def any_source():
        # irecv without src reaches the backend's recv_anysource. dist.recv without src also
        # asks the Work for its sender: torch 2.15 wraps a Python backend's Work in one that
        # cannot say (docs/errors.md), 2.11 (our backend is the ProcessGroup) hands ours back.
        if n == 1:
            return
        if me == 0:
            got = [torch.empty(2) for _ in ranks[1:]]
            for work in [dist.irecv(g, group=group, tag=7) for g in got]:
                work.wait()
            assert sorted(g.tolist() for g in got) == [[float(r)] * 2 for r in ranks[1:]], got
            one = torch.empty(2)
            try:
                src = dist.recv(one, group=group, tag=8)
            except RuntimeError as exc:
                assert "sourceRank()" in str(exc), exc
            else:
                assert one.tolist() == [float(src)] * 2 and src == ranks[1], (src, one)
        else:
            dist.send(torch.full((2,), float(rank)), ranks[0], group=group, tag=7)
            if me == 1:
                dist.send(torch.full((2,), float(rank)), ranks[0], group=group, tag=8)
    yield "recv from any source", any_source


def conformance_world(rank, n):
    assert dist.get_backend() == "collectives"
    groups = [(None, list(range(n)))]
    if n >= 3:
        g = dist.new_group([0] + [r for r in range(n) if r % 2 == 1])   # inherits "collectives"
        groups.append((g, dist.get_process_group_ranks(g)))
    refs = {tuple(r): dist.new_group(r, backend="gloo") for _, r in groups}
    count, failures = 0, []
    for group, ranks in groups:
        if rank not in ranks:
            continue
        for name, case in _cases(rank, group, ranks, refs[tuple(ranks)]):
            count += 1
            try:
                case()
            except Exception as exc:
                failures.append(f"{name} (group {ranks}) on rank {rank}: {type(exc).__name__}: {str(exc)[:300]}")
    return count, failures


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5])
def test_torch_collectives_under_our_backend(world_size):
    results = run_world(conformance_world, world_size, backend="collectives",
                        env={"COLLECTIVES_TIMEOUT": "20"})
    assert_matrix_passed(results, min_cases=100)


def mixed_world(rank, n):
    """torch's calls and our own API's, async, interleaved on one collectives-backed group."""
    group = dist.new_group(list(range(n)))
    xs = [torch.full((5,), float(rank + k)) for k in range(4)]
    works = [dist.all_reduce(xs[0], group=group, async_op=True),
             collectives.all_reduce(xs[1], group=group, async_op=True, algorithm="ring"),
             dist.all_reduce(xs[2], group=group, async_op=True),
             collectives.all_reduce(xs[3], group=group, async_op=True, algorithm="tree")]
    for w in works:
        w.wait()
    return [x.tolist() for x in xs]


def test_mixing_torch_calls_and_our_api_keeps_issue_order():
    n = 3
    results = run_world(mixed_world, n, backend="collectives", env={"COLLECTIVES_TIMEOUT": "20"})
    want = [[float(sum(range(n)) + n * k)] * 5 for k in range(4)]
    assert all(r == want for r in results)
