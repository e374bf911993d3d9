"""Inputs that encode the rank, and the answers computed independently in torch.

Every rank can build every other rank's input, so each rank computes the
expected result locally with plain torch reductions over the stacked inputs,
never with the library's own op table.
"""
import contextlib
import functools

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

FLOATS = (torch.float32, torch.float64, torch.bfloat16)
INTS = (torch.int32, torch.int64)
ALL_DTYPES = FLOATS + INTS + (torch.bool,)
SIZES = ((0,), (1,), (7,), (1001,), (3, 5))

OPS_FOR = {
    "float": (ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.AVG),
    "int": (ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX,
            ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR),
    "bool": (ReduceOp.MIN, ReduceOp.MAX, ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR),
}
OP_NAMES = {ReduceOp.SUM: "SUM", ReduceOp.PRODUCT: "PRODUCT", ReduceOp.MIN: "MIN",
            ReduceOp.MAX: "MAX", ReduceOp.AVG: "AVG", ReduceOp.BAND: "BAND",
            ReduceOp.BOR: "BOR", ReduceOp.BXOR: "BXOR"}


def kind(dtype):
    return "bool" if dtype == torch.bool else "float" if dtype.is_floating_point else "int"


def op_dtype_pairs():
    return [(op, dt) for dt in ALL_DTYPES for op in OPS_FOR[kind(dt)]]


def reduce_input(rank, shape, dtype, op):
    """Rank-encoded input whose reduction over ranks is exact in every dtype used."""
    i = torch.arange(int(torch.Size(shape).numel()), dtype=torch.int64).reshape(shape)
    if dtype == torch.bool:
        return ((i + rank) % 3 == 0) | ((i * (rank + 1)) % 5 == 1)
    if op in (ReduceOp.SUM, ReduceOp.AVG):
        v = (rank + 1) * (1 + i % 5)              # SUM over n ranks: n(n+1)/2 * (1 + i % 5)
    elif op == ReduceOp.PRODUCT:
        v = (rank + 1) + 0 * i                    # PRODUCT over n ranks: n!
    elif op in (ReduceOp.MIN, ReduceOp.MAX):
        v = (rank * 5 + i * 3) % 7 - 3
    else:
        v = (1 << ((rank + i) % 8)) | (rank + i) % 5
    return v.to(dtype)


def reduce_expected(inputs, op):
    """Reduce a list of tensors with torch's own reductions (independent of the library)."""
    x = torch.stack(inputs)
    dtype = inputs[0].dtype
    if dtype == torch.bool:
        if op in (ReduceOp.MIN, ReduceOp.BAND):
            return x.all(0)
        if op in (ReduceOp.MAX, ReduceOp.BOR):
            return x.any(0)
        return x.to(torch.int64).sum(0) % 2 == 1
    if op == ReduceOp.SUM:
        return x.to(torch.float64 if dtype.is_floating_point else torch.int64).sum(0).to(dtype)
    if op == ReduceOp.AVG:
        return (x.to(torch.float64).sum(0) / len(inputs)).to(dtype)
    if op == ReduceOp.PRODUCT:
        return x.to(torch.float64 if dtype.is_floating_point else torch.int64).prod(0).to(dtype)
    if op == ReduceOp.MIN:
        return x.amin(0)
    if op == ReduceOp.MAX:
        return x.amax(0)
    if op == ReduceOp.BAND:
        return functools.reduce(lambda a, b: a & b, inputs)
    if op == ReduceOp.BOR:
        return functools.reduce(lambda a, b: a | b, inputs)
    return functools.reduce(lambda a, b: a ^ b, inputs)


def payload(seed, shape, dtype):
    """A deterministic tensor for data-movement collectives; distinct per seed."""
    i = torch.arange(int(torch.Size(shape).numel()), dtype=torch.int64).reshape(shape)
    v = (i * 7 + seed * 13) % 97
    if dtype == torch.bool:
        return v % 2 == 1
    return v.to(dtype)


def assert_same(actual, expected, name):
    tol = dict(rtol=1e-2, atol=1e-2) if expected.dtype == torch.bfloat16 else {}
    if not expected.dtype.is_floating_point:
        tol = dict(rtol=0, atol=0)
    torch.testing.assert_close(actual, expected, **tol, msg=lambda m: f"{name}: {m}")


BUILTIN_COLLECTIVES = ("all_reduce", "broadcast", "reduce", "all_gather", "gather", "scatter",
                       "reduce_scatter", "all_to_all", "barrier", "all_gather_into_tensor",
                       "reduce_scatter_tensor", "all_to_all_single", "all_gather_object",
                       "broadcast_object_list", "gather_object", "scatter_object_list",
                       "all_reduce_coalesced", "monitored_barrier")


def builtin_refused(error):
    """Whether torch's built-in refused the call itself (an exception or its text): older
    torch lacks some gloo collectives (2.11: "Backend gloo does not support alltoall")."""
    text = str(error).lower()
    return any(s in text for s in ("not supported", "does not support", "unsupported", "not implemented"))


@contextlib.contextmanager
def builtin_collectives_forbidden():
    """Replace torch.distributed's collectives with functions that raise."""
    saved = []
    for module in (dist, dist.distributed_c10d):
        for name in BUILTIN_COLLECTIVES:
            if hasattr(module, name):
                saved.append((module, name, getattr(module, name)))

                def forbidden(*args, _name=name, **kwargs):
                    raise AssertionError(f"the library called the built-in torch.distributed.{_name}")
                setattr(module, name, forbidden)
    try:
        yield
    finally:
        for module, name, fn in saved:
            setattr(module, name, fn)
