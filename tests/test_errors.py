"""Bad input: every validated error, raised on the calling rank before any message moves.

Each entry of ``ERRORS`` is one row of the table in docs/errors.md: the call,
the exception class and the words of the message (which name the argument).
Both ranks of a 2-rank world run every entry, blocking and ``async_op=True``
(a bad argument raises at the call, not at ``wait()``), under a traffic
counter that must stay at zero.
"""
import pytest
import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

import collectives as C
from tests.worlds import run_world

ALGOS = {c: ", ".join(a) for c, a in C.ALGORITHMS.items()}


def _t(*shape, dtype=torch.float32):
    return torch.zeros(*shape, dtype=dtype)


def _two():
    return [_t(2), _t(2)]


# id: (exception, words of the message, call(rank, kw)) where kw holds group/async_op.
ERRORS = {
    "not_a_tensor": (TypeError, "collectives.all_reduce: tensor must be a torch.Tensor, got list",
                     lambda r, kw: C.all_reduce([1.0, 2.0], **kw)),
    "list_entry_not_a_tensor": (TypeError, "all_gather: tensor_list[1] must be a torch.Tensor, got int",
                                lambda r, kw: C.all_gather([_t(2), 3], _t(2), **kw)),
    "not_a_list": (TypeError, "all_gather: tensor_list must be a list of tensors, got Tensor",
                   lambda r, kw: C.all_gather(_t(2, 2), _t(2), **kw)),
    "wrong_list_length": (ValueError, "reduce_scatter: input_list must hold one tensor per rank "
                                      "of the group (2), got 3",
                          lambda r, kw: C.reduce_scatter(_t(2), [_t(2)] * 3, **kw)),
    # uneven entries are allowed (rank i contributes tensor_list[i]), but this rank's own slot
    # must hold what this rank sends
    "list_entry_shape": (ValueError, "(this rank's slot) has 3 elements but tensor has 2",
                         lambda r, kw: C.all_gather([_t(3), _t(3)], _t(2), **kw)),
    "list_entry_dtype": (ValueError, "all_gather: tensor_list[1] has dtype torch.int64 but tensor "
                                     "has torch.float32",
                         lambda r, kw: C.all_gather([_t(2), _t(2, dtype=torch.int64)], _t(2), **kw)),
    "all_to_all_list_dtype": (ValueError, "all_to_all: output_tensor_list[0] has dtype torch.int32",
                              lambda r, kw: C.all_to_all([_t(2, dtype=torch.int32), _t(2)], _two(),
                                                         **kw)),
    "all_to_all_empty_input": (TypeError, "all_to_all: input_tensor_list must be a non-empty list",
                               lambda r, kw: C.all_to_all(_two(), [], **kw)),
    "root_not_an_int": (TypeError, "broadcast: src must be an int (a global rank), got float",
                        lambda r, kw: C.broadcast(_t(2), src=0.0, **kw)),
    "root_is_bool": (TypeError, "reduce: dst must be an int (a global rank), got bool",
                     lambda r, kw: C.reduce(_t(2), dst=True, **kw)),
    "root_out_of_range": (ValueError, "scatter: src=2 is out of range for a world of 2 ranks",
                          lambda r, kw: C.scatter(_t(2), None, src=2, **kw)),
    "root_negative": (ValueError, "gather: dst=-1 is out of range for a world of 2 ranks",
                      lambda r, kw: C.gather(_t(2), None, dst=-1, **kw)),
    "root_outside_group": (ValueError, "broadcast: src=1 is not a member of the group (ranks [0])",
                           lambda r, kw: C.broadcast(_t(2), src=1, **dict(kw, group=_solo()))),
    "scatter_list_missing": (ValueError, "scatter: scatter_list is required on the source rank",
                             lambda r, kw: C.scatter(_t(2), None, src=r, **kw)),
    "scatter_list_on_non_source": (ValueError, "scatter: scatter_list must not be given on "
                                               "non-source ranks",
                                   lambda r, kw: C.scatter(_t(2), _two(), src=1 - r, **kw)),
    "gather_list_missing": (ValueError, "gather: gather_list is required on the destination rank",
                            lambda r, kw: C.gather(_t(2), None, dst=r, **kw)),
    "gather_list_on_non_destination": (ValueError, "gather: gather_list must not be given on "
                                                   "non-destination ranks",
                                       lambda r, kw: C.gather(_t(2), _two(), dst=1 - r, **kw)),
    "op_not_a_reduce_op": (TypeError, "all_reduce: op must be a torch.distributed.ReduceOp",
                           lambda r, kw: C.all_reduce(_t(2), op="sum", **kw)),
    "op_not_for_dtype": (ValueError, "all_reduce: op=ReduceOp.AVG is not defined for dtype "
                                     "torch.int64; it is defined for floating, complex dtypes",
                         lambda r, kw: C.all_reduce(_t(2, dtype=torch.int64), op=ReduceOp.AVG, **kw)),
    "bitwise_op_on_float": (ValueError, "reduce_scatter: op=ReduceOp.BXOR is not defined for "
                                        "dtype torch.float32",
                            lambda r, kw: C.reduce_scatter(_t(2), _two(), op=ReduceOp.BXOR, **kw)),
    "sum_on_bool": (ValueError, "reduce: op=ReduceOp.SUM is not defined for dtype torch.bool "
                                "(use BOR or BAND for bool)",
                    lambda r, kw: C.reduce(_t(2, dtype=torch.bool), dst=0, **kw)),
    "unknown_algorithm": (ValueError, f"all_reduce: unknown algorithm='butterfly'; valid: "
                                      f"{ALGOS['all_reduce']}",
                          lambda r, kw: C.all_reduce(_t(2), **dict(kw, algorithm="butterfly"))),
    "unknown_barrier_algorithm": (ValueError, f"barrier: unknown algorithm='ring'; valid: "
                                              f"{ALGOS['barrier']}",
                                  lambda r, kw: C.barrier(**dict(kw, algorithm="ring"))),
    "group_not_a_group": (TypeError, "all_reduce: group must be a process group from "
                                     "torch.distributed.new_group(...) or None, got list",
                          lambda r, kw: C.all_reduce(_t(2), **dict(kw, group=[0, 1]))),
    "sparse_tensor": (ValueError, "all_reduce: tensor has layout torch.sparse_coo; only dense "
                                  "(strided) tensors can be sent",
                      lambda r, kw: C.all_reduce(_t(2).to_sparse(), **kw)),
    "device_backend_cannot_send": (ValueError, "broadcast: tensor is on device meta, which the "
                                               "backend cannot send (CPU and CUDA tensors only)",
                                   lambda r, kw: C.broadcast(torch.zeros(2, device="meta"), src=0,
                                                             **kw)),
    # algorithm='bruck' with uneven pieces is refused after 16-byte messages that agree on the
    # pieces, so that every rank refuses (tests/test_refusals_agreed.py)
}


_groups = {}


def _solo():
    """The group of rank 0 alone (rank 1 is outside it, and its calls return None)."""
    return _groups["solo"]


def _errors_world(rank, world_size):
    _groups["solo"] = dist.new_group([0])
    out = {}
    for name, (_, _, fn) in ERRORS.items():
        for async_op in (False, True):
            kw = dict(group=None, async_op=async_op)
            with C.count_traffic() as traffic:
                try:
                    fn(rank, kw)
                    result = ("no error", "")
                except Exception as exc:
                    result = (type(exc).__name__, str(exc))
            out[name, async_op] = result + (traffic.sent_messages + traffic.recv_messages,)
    # The world still works after all that: nothing half-sent is left behind.
    t = torch.full((2,), float(rank + 1))
    C.all_reduce(t)
    out["after"] = t.tolist()
    return out


@pytest.fixture(scope="module")
def errors():
    out = run_world(_errors_world, 2, timeout=120, env={"COLLECTIVES_TIMEOUT": "30"})
    return [out[0], out[1]]


@pytest.mark.parametrize("name", list(ERRORS))
def test_validation_error(errors, name):
    exc_type, words, _ = ERRORS[name]
    for rank, per_rank in enumerate(errors):
        for async_op in (False, True):
            kind, text, messages = per_rank[name, async_op]
            where = f"{name} on rank {rank} (async_op={async_op})"
            if name == "root_outside_group" and rank == 1:   # outside the group: returns None
                assert (kind, messages) == ("no error", 0), f"{where}: {kind}: {text}"
                continue
            assert kind == exc_type.__name__, f"{where}: {kind}: {text}"
            assert words in text, f"{where}: {text!r} lacks {words!r}"
            assert messages == 0, f"{where}: {messages} messages moved before the error"


def test_world_works_after_bad_calls(errors):
    assert [e["after"] for e in errors] == [[3.0, 3.0]] * 2


@pytest.mark.parametrize("call", [
    lambda: C.broadcast(_t(2), src=0), lambda: C.reduce(_t(2), dst=0), lambda: C.all_reduce(_t(2)),
    lambda: C.scatter(_t(2), None, src=0), lambda: C.gather(_t(2), None, dst=0),
    lambda: C.all_gather(_two(), _t(2)), lambda: C.reduce_scatter(_t(2), _two()),
    lambda: C.all_to_all(_two(), _two()), lambda: C.barrier(),
])
def test_process_group_not_initialised(call):
    assert not dist.is_initialized()
    with pytest.raises(ValueError, match=r"collectives\.\w+: the default process group is not "
                                         r"initialised; call torch.distributed.init_process_group"):
        call()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA and NCCL")
def test_cpu_tensor_on_nccl_group():
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with pytest.raises(ValueError, match="all_reduce: tensor is on the CPU, which the nccl "
                                             "backend cannot send"):
            C.all_reduce(torch.zeros(2))
    finally:
        dist.destroy_process_group()
