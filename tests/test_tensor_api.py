"""The single-tensor forms (collectives.tensor_api) against the gloo built-ins, and their traffic.

Each world computes every case with our function and with ``torch.distributed``'s
built-in on a gloo group of the same ranks, for every algorithm of the list form
that carries it, and checks the bytes each rank sent against the card.
"""
import itertools

import pytest
import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

import collectives
from collectives import ALGORITHMS
from collectives.algorithms import all_to_all_bruck

from .expected import assert_same, builtin_collectives_forbidden, payload, reduce_expected, reduce_input
from .test_collectives import assert_matrix_passed
from .worlds import run_world


def _cases(rank, group, ranks):
    n, me = len(ranks), ranks.index(rank)

    for algo, shape in itertools.product(ALGORITHMS["all_gather"], ((1,), (6,), (2, 3))):
        def case(algo=algo, shape=shape):
            x = payload(me, shape, torch.float32)
            out = torch.full((n * shape[0],) + shape[1:], -1.0)
            stacked = torch.full((n,) + shape, -1.0)
            with builtin_collectives_forbidden(), collectives.count_traffic() as t:
                collectives.all_gather_into_tensor(out, x, group=group, algorithm=algo)
                work = collectives.all_gather_into_tensor(stacked, x, group=group, algorithm=algo, async_op=True)
                work.wait()
            ref = torch.empty_like(out)
            dist.all_gather_into_tensor(ref, x, group=group)
            assert torch.equal(out, ref) and torch.equal(stacked.view_as(ref), ref)
            if algo == "ring":   # card: N-1 messages of the input's size, twice (two calls)
                assert t.sent_messages == 2 * (n - 1) and t.sent_bytes == 2 * (n - 1) * x.nbytes
        yield f"all_gather_into_tensor[{algo}] {shape}", case

    for algo, (op, dt) in itertools.product(ALGORITHMS["reduce_scatter"],
                                            [(ReduceOp.SUM, torch.float32), (ReduceOp.MAX, torch.int64),
                                             (ReduceOp.AVG, torch.float64)]):
        def case(algo=algo, op=op, dt=dt):
            shape = (2, 3)
            inp = torch.cat([reduce_input(me * n + j, shape, dt, op) for j in range(n)])
            out = torch.empty(shape, dtype=dt)
            with builtin_collectives_forbidden(), collectives.count_traffic() as t:
                collectives.reduce_scatter_tensor(out, inp, op=op, group=group, algorithm=algo)
            want = reduce_expected([reduce_input(r * n + me, shape, dt, op) for r in range(n)], op)
            assert_same(out, want, "closed form")
            if op != ReduceOp.AVG:   # gloo has no AVG
                ref = torch.empty_like(out)
                dist.reduce_scatter_tensor(ref, inp, op=op, group=group)
                assert_same(out, ref, "vs gloo")
            if algo == "ring":   # card: N-1 messages of the output's size
                assert t.sent_messages == n - 1 and t.sent_bytes == (n - 1) * out.nbytes
        yield f"reduce_scatter_tensor[{algo}] op={op} {dt}", case

    for algo, uneven in itertools.product(ALGORITHMS["all_to_all"], (False, True)):
        def case(algo=algo, uneven=uneven):
            # uneven: rank i sends j + i + 1 rows to rank j (some zero when shifted), 2 columns
            send = [(j + me) % 3 if uneven else 2 for j in range(n)]
            recv = [(me + i) % 3 if uneven else 2 for i in range(n)]
            inp = torch.cat([torch.full((send[j], 2), 100.0 * me + j) for j in range(n)])
            out = torch.full((sum(recv), 2), -1.0)
            kw = dict(output_split_sizes=recv, input_split_sizes=send) if uneven else {}
            if algo == "bruck" and uneven and n > 1:
                with pytest.raises(ValueError, match="algorithm='bruck' needs pieces of one size"):
                    collectives.all_to_all_single(out, inp, group=group, algorithm=algo, **kw)
                return
            with builtin_collectives_forbidden(), collectives.count_traffic() as t:
                collectives.all_to_all_single(out, inp, group=group, algorithm=algo, **kw)
            ref = torch.empty_like(out)
            dist.all_to_all_single(ref, inp, group=group, **kw)
            assert torch.equal(out, ref)
            others = [j for j in range(n) if j != me and send[j]]
            if algo == "bruck":   # card: ceil(log2 N) messages to agree on sizes, as many to forward pieces
                card = all_to_all_bruck.cost(n, inp.nbytes, inp.element_size())
                assert t.sent_messages == card.messages == 2 * (n - 1).bit_length()
                assert t.sent_bytes == card.sent_bytes
                return
            # card: every other rank's rows, once, in one message each (empty pieces are not sent)
            assert t.sent_messages == len(others) and t.sent_bytes == sum(send[j] * 8 for j in others)
        yield f"all_to_all_single[{algo}] uneven={uneven}", case

    def bad():
        with pytest.raises(ValueError, match="all_gather_into_tensor: output_tensor has 5 elements"):
            collectives.all_gather_into_tensor(torch.empty(5), torch.empty(2), group=group)
        with pytest.raises(ValueError, match="must be contiguous"):
            collectives.reduce_scatter_tensor(torch.empty(2), torch.empty(n, 4)[:, ::2], group=group)
        with pytest.raises(ValueError, match="input_split_sizes=.* must be"):
            collectives.all_to_all_single(torch.empty(n), torch.empty(n), input_split_sizes=[n + 1] * n,
                                          group=group)
    yield "clear errors", bad


def world(rank, n):
    groups = [(None, list(range(n)))]
    if n >= 3:
        g = dist.new_group(list(range(1, n)))
        groups.append((g, list(range(1, n))))
    count, failures = 0, []
    for group, ranks in groups:
        if rank not in ranks:
            continue
        for name, case in _cases(rank, group, ranks):
            count += 1
            try:
                case()
            except Exception as exc:
                failures.append(f"{name} (group {ranks}) on rank {rank}: {type(exc).__name__}: {str(exc)[:300]}")
    return count, failures


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_tensor_forms_match_builtin_and_cards(world_size):
    assert_matrix_passed(run_world(world, world_size, env={"COLLECTIVES_TIMEOUT": "20"}), min_cases=10)
