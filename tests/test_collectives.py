"""Every collective x every algorithm x world sizes 1-5 (8 with small tensors) x roots x ops x dtypes x sizes.

Each world runs all its cases in one go (starting a world costs seconds) and
returns the names of the cases that failed, so a failure reads like
``all_reduce[rabenseifner] op=BXOR dtype=int32 shape=(7,) on rank 2: ...``.
Expected values come from torch reductions over every rank's (reconstructible)
input, and additionally from the gloo built-in where gloo has the operation.
While the library runs, torch.distributed's own collectives raise.
"""
import itertools

import pytest
import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

import collectives
from collectives import ALGORITHMS

from .expected import (ALL_DTYPES, OP_NAMES, SIZES, assert_same, builtin_collectives_forbidden,
                       op_dtype_pairs, payload, reduce_expected, reduce_input)
from .worlds import run_world


def _builtin(fn, *args, **kwargs):
    """Run a built-in collective if gloo supports it; False if it does not."""
    try:
        fn(*args, **kwargs)
        return True
    except (RuntimeError, ValueError, TypeError):
        return False


def _cases(rank, n, shapes, roots):
    """Yield (name, case) pairs; each case raises AssertionError on a wrong result."""
    pairs = op_dtype_pairs()

    for algo, (op, dt), shape in itertools.product(ALGORITHMS["all_reduce"], pairs, shapes):
        def case(algo=algo, op=op, dt=dt, shape=shape):
            x = reduce_input(rank, shape, dt, op)
            want = reduce_expected([reduce_input(r, shape, dt, op) for r in range(n)], op)
            ref = x.clone()
            has_ref = op != ReduceOp.AVG and dt == torch.float32 and _builtin(dist.all_reduce, ref, op=op)
            with builtin_collectives_forbidden():
                collectives.all_reduce(x, op=op, algorithm=algo)
            assert_same(x, want, "vs closed form")
            if has_ref:
                assert_same(x, ref, "vs dist.all_reduce")
        yield f"all_reduce[{algo}] op={OP_NAMES[op]} dtype={dt} shape={shape}", case

    reduce_pairs = [(ReduceOp.SUM, torch.float32), (ReduceOp.PRODUCT, torch.int64),
                    (ReduceOp.AVG, torch.float64), (ReduceOp.BOR, torch.bool),
                    (ReduceOp.MAX, torch.bfloat16), (ReduceOp.BXOR, torch.int32)]
    for algo, root, (op, dt), shape in itertools.product(ALGORITHMS["reduce"], roots, reduce_pairs, shapes):
        def case(algo=algo, root=root, op=op, dt=dt, shape=shape):
            x = reduce_input(rank, shape, dt, op)
            before = x.clone()
            with builtin_collectives_forbidden():
                collectives.reduce(x, dst=root, op=op, algorithm=algo)
            if rank == root:
                assert_same(x, reduce_expected([reduce_input(r, shape, dt, op) for r in range(n)], op),
                            "root vs closed form")
            else:
                assert torch.equal(x, before), "non-root tensor changed"
        yield f"reduce[{algo}] dst={root} op={OP_NAMES[op]} dtype={dt} shape={shape}", case

    for algo, root, dt, shape in itertools.product(ALGORITHMS["broadcast"], roots, ALL_DTYPES, shapes):
        def case(algo=algo, root=root, dt=dt, shape=shape):
            x = payload(rank, shape, dt)
            ref = x.clone()
            has_ref = dt in (torch.float32, torch.int64) and _builtin(dist.broadcast, ref, src=root)
            with builtin_collectives_forbidden():
                collectives.broadcast(x, src=root, algorithm=algo)
            assert_same(x, payload(root, shape, dt), "vs closed form")
            if has_ref:
                assert_same(x, ref, "vs dist.broadcast")
        yield f"broadcast[{algo}] src={root} dtype={dt} shape={shape}", case

    for algo, root, dt, shape in itertools.product(ALGORITHMS["scatter"], roots, ALL_DTYPES, shapes):
        def case(algo=algo, root=root, dt=dt, shape=shape):
            out = torch.zeros(shape, dtype=dt)
            pieces = [payload(100 * root + i, shape, dt) for i in range(n)] if rank == root else None
            kept = [p.clone() for p in pieces] if pieces else None
            with builtin_collectives_forbidden():
                collectives.scatter(out, pieces, src=root, algorithm=algo)
            assert_same(out, payload(100 * root + rank, shape, dt), "vs closed form")
            if pieces:
                assert all(torch.equal(a, b) for a, b in zip(pieces, kept)), "scatter_list changed"
        yield f"scatter[{algo}] src={root} dtype={dt} shape={shape}", case

    for algo, root, dt, shape in itertools.product(ALGORITHMS["gather"], roots, ALL_DTYPES, shapes):
        def case(algo=algo, root=root, dt=dt, shape=shape):
            x = payload(rank, shape, dt)
            outs = [torch.zeros(shape, dtype=dt) for _ in range(n)] if rank == root else None
            with builtin_collectives_forbidden():
                collectives.gather(x, outs, dst=root, algorithm=algo)
            assert torch.equal(x, payload(rank, shape, dt)), "input changed"
            if rank == root:
                for i, o in enumerate(outs):
                    assert_same(o, payload(i, shape, dt), f"gather_list[{i}]")
        yield f"gather[{algo}] dst={root} dtype={dt} shape={shape}", case

    for algo, dt, shape in itertools.product(ALGORITHMS["all_gather"], ALL_DTYPES, shapes):
        def case(algo=algo, dt=dt, shape=shape):
            x = payload(rank, shape, dt)
            outs = [torch.zeros(shape, dtype=dt) for _ in range(n)]
            refs = [torch.zeros(shape, dtype=dt) for _ in range(n)]
            has_ref = dt == torch.float32 and _builtin(dist.all_gather, refs, x.clone())
            with builtin_collectives_forbidden():
                collectives.all_gather(outs, x, algorithm=algo)
            assert torch.equal(x, payload(rank, shape, dt)), "input changed"
            for i, o in enumerate(outs):
                assert_same(o, payload(i, shape, dt), f"tensor_list[{i}]")
                if has_ref:
                    assert_same(o, refs[i], f"tensor_list[{i}] vs dist.all_gather")
        yield f"all_gather[{algo}] dtype={dt} shape={shape}", case

    rs_pairs = [(op, dt) for op, dt in pairs if dt in (torch.float32, torch.int32, torch.bool)
                or op in (ReduceOp.SUM, ReduceOp.AVG)]
    for algo, (op, dt), shape in itertools.product(ALGORITHMS["reduce_scatter"], rs_pairs, shapes):
        def case(algo=algo, op=op, dt=dt, shape=shape):
            def inputs(r):
                return [reduce_input(r * 3 + i, shape, dt, op) for i in range(n)]
            ins = inputs(rank)
            kept = [t.clone() for t in ins]
            out = torch.zeros(shape, dtype=dt)
            with builtin_collectives_forbidden():
                collectives.reduce_scatter(out, ins, op=op, algorithm=algo)
            want = reduce_expected([inputs(r)[rank] for r in range(n)], op)
            assert_same(out, want, "vs closed form")
            assert all(torch.equal(a, b) for a, b in zip(ins, kept)), "input_list changed"
        yield f"reduce_scatter[{algo}] op={OP_NAMES[op]} dtype={dt} shape={shape}", case

    for algo, dt, shape in itertools.product(ALGORITHMS["all_to_all"], ALL_DTYPES, shapes):
        def case(algo=algo, dt=dt, shape=shape):
            ins = [payload(10 * rank + j, shape, dt) for j in range(n)]
            outs = [torch.zeros(shape, dtype=dt) for _ in range(n)]
            with builtin_collectives_forbidden():
                collectives.all_to_all(outs, ins, algorithm=algo)
            for j, o in enumerate(outs):
                assert_same(o, payload(10 * j + rank, shape, dt), f"output_tensor_list[{j}]")
            assert all(torch.equal(t, payload(10 * rank + j, shape, dt)) for j, t in enumerate(ins))
        yield f"all_to_all[{algo}] dtype={dt} shape={shape}", case

    for algo in ALGORITHMS["all_to_all"]:
        def case(algo=algo):
            # uneven pieces: rank i sends j+i+1 elements to rank j (torch allows it)
            ins = [payload(10 * rank + j, (j + rank + 1,), torch.float32) for j in range(n)]
            outs = [torch.zeros(rank + j + 1) for j in range(n)]
            if algo == "bruck" and n > 1:
                # every rank sees uneven pieces, so every rank refuses before any message
                with pytest.raises(ValueError, match="bruck.*pieces of one size"):
                    collectives.all_to_all(outs, ins, algorithm=algo)
                return
            with builtin_collectives_forbidden():
                collectives.all_to_all(outs, ins, algorithm=algo)
            for j, o in enumerate(outs):
                assert_same(o, payload(10 * j + rank, (rank + j + 1,), torch.float32), f"piece {j}")
        yield f"all_to_all[{algo}] uneven sizes", case

    for algo in ALGORITHMS["barrier"]:
        def case(algo=algo):
            with builtin_collectives_forbidden():
                collectives.barrier(algorithm=algo)
        yield f"barrier[{algo}]", case


def _big_cases(rank, n):
    """~1M elements once per algorithm; all_reduce results must be bitwise equal across ranks."""
    numel = 1 << 20
    for algo in ALGORITHMS["all_reduce"]:
        def case(algo=algo):
            g = torch.Generator().manual_seed(1234 + rank)
            x = torch.randn(numel, generator=g)
            want = sum(torch.randn(numel, generator=torch.Generator().manual_seed(1234 + r)).double()
                       for r in range(n))
            with builtin_collectives_forbidden():
                collectives.all_reduce(x, algorithm=algo)
            torch.testing.assert_close(x.double(), want, rtol=1e-5, atol=1e-5)
            everyone = [torch.empty_like(x) for _ in range(n)]
            dist.all_gather(everyone, x)
            assert all(torch.equal(everyone[0], e) for e in everyone), "ranks differ bitwise"
        yield f"all_reduce[{algo}] 1M random float32, bitwise equal on all ranks", case
    for algo in ALGORITHMS["broadcast"]:
        def case(algo=algo):
            x = payload(rank, (numel,), torch.float32)
            with builtin_collectives_forbidden():
                collectives.broadcast(x, src=n - 1, algorithm=algo)
            assert torch.equal(x, payload(n - 1, (numel,), torch.float32))
        yield f"broadcast[{algo}] 1M float32", case
    for algo in ALGORITHMS["reduce_scatter"]:
        def case(algo=algo):
            c = numel // n
            ins = [payload(rank + i, (c,), torch.float32) for i in range(n)]
            out = torch.empty(c)
            with builtin_collectives_forbidden():
                collectives.reduce_scatter(out, ins, algorithm=algo)
            want = sum(payload(r + rank, (c,), torch.float32).double() for r in range(n))
            torch.testing.assert_close(out.double(), want)
        yield f"reduce_scatter[{algo}] 1M float32", case
    for algo in ALGORITHMS["all_gather"]:
        def case(algo=algo):
            c = numel // n
            outs = [torch.empty(c) for _ in range(n)]
            with builtin_collectives_forbidden():
                collectives.all_gather(outs, payload(rank, (c,), torch.float32), algorithm=algo)
            assert all(torch.equal(o, payload(i, (c,), torch.float32)) for i, o in enumerate(outs))
        yield f"all_gather[{algo}] 1M float32", case


def _noncontiguous_cases(rank, n):
    for algo in ALGORITHMS["all_reduce"]:
        def case(algo=algo):
            base = reduce_input(rank, (5, 3), torch.float32, ReduceOp.SUM)
            x = base.t()  # a transposed view: not contiguous
            want = reduce_expected([reduce_input(r, (5, 3), torch.float32, ReduceOp.SUM) for r in range(n)],
                                   ReduceOp.SUM).t()
            with builtin_collectives_forbidden():
                collectives.all_reduce(x, algorithm=algo)
            assert_same(x, want, "non-contiguous view")
            assert_same(base, want.t(), "the viewed storage holds the result")
        yield f"all_reduce[{algo}] non-contiguous", case
    for algo in ALGORITHMS["broadcast"]:
        def case(algo=algo):
            x = payload(rank, (4, 6), torch.int64)[:, ::2]
            with builtin_collectives_forbidden():
                collectives.broadcast(x, src=0, algorithm=algo)
            assert torch.equal(x, payload(0, (4, 6), torch.int64)[:, ::2])
        yield f"broadcast[{algo}] non-contiguous", case
    for algo in ALGORITHMS["all_gather"]:
        def case(algo=algo):
            outs = [torch.zeros(6, 4).t() for _ in range(n)]
            with builtin_collectives_forbidden():
                collectives.all_gather(outs, payload(rank, (6, 4), torch.float32).t(), algorithm=algo)
            assert all(torch.equal(o, payload(i, (6, 4), torch.float32).t()) for i, o in enumerate(outs))
        yield f"all_gather[{algo}] non-contiguous", case


def matrix_world(rank, n, shapes, all_roots, big):
    roots = list(range(n)) if all_roots else sorted({0, n - 1})
    failures = []
    cases = itertools.chain(_cases(rank, n, shapes, roots), _noncontiguous_cases(rank, n),
                            _big_cases(rank, n) if big else ())
    count = 0
    for name, case in cases:
        count += 1
        try:
            case()
        except Exception as exc:  # report every failing case by name, keep going
            failures.append(f"{name} on rank {rank}: {type(exc).__name__}: {str(exc)[:300]}")
    return count, failures


def assert_matrix_passed(results, min_cases=0):
    """``results``: each rank's ``matrix_world`` return; every failing case is named."""
    assert results[0][0] > min_cases
    failures = sorted({f for _, fs in results for f in fs})
    assert not failures, f"{len(failures)} failing cases:\n" + "\n".join(failures[:60])


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5])
def test_every_collective_algorithm_dtype_op_size(world_size):
    results = run_world(matrix_world, world_size, SIZES, True, True, env={"COLLECTIVES_TIMEOUT": "20"})
    assert_matrix_passed(results, min_cases=500)


def test_eight_ranks_small_tensors():
    results = run_world(matrix_world, 8, ((0,), (1,), (7,), (2, 3)), False, False,
                        env={"COLLECTIVES_TIMEOUT": "20"}, timeout=400)
    assert_matrix_passed(results)
