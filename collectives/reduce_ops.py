"""Reduction operators: which ``ReduceOp`` is defined for which dtype, and how to apply it.

``op`` arguments are ``torch.distributed.ReduceOp`` values, so a call can be
swapped for the built-in and back. The table follows torch's own meaning of
each op:

=========  ==========================  ==========================================
op         dtypes                      combine(acc, x)
=========  ==========================  ==========================================
SUM        floating, complex, integer  acc + x
PRODUCT    floating, complex, integer  acc * x
MIN, MAX   floating, integer, bool     elementwise minimum / maximum
AVG        floating, complex           SUM, then divide by the group size once
BAND/BOR/  integer, bool               bitwise and / or / xor
BXOR
=========  ==========================  ==========================================

SUM and PRODUCT are refused for ``torch.bool`` because the built-ins disagree
on them (``torch.sum`` counts, NCCL ors); say BOR or BAND instead.
"""
import functools
from dataclasses import dataclass

import torch
from torch.distributed import ReduceOp

_BITWISE = {ReduceOp.BAND: torch.bitwise_and, ReduceOp.BOR: torch.bitwise_or,
            ReduceOp.BXOR: torch.bitwise_xor}
_ARITH = {ReduceOp.SUM: torch.add, ReduceOp.AVG: torch.add, ReduceOp.PRODUCT: torch.mul,
          ReduceOp.MIN: torch.minimum, ReduceOp.MAX: torch.maximum}
_DEFINED_FOR = {
    "SUM": ("floating", "complex", "integer"),
    "PRODUCT": ("floating", "complex", "integer"),
    "AVG": ("floating", "complex"),
    "MIN": ("floating", "integer", "bool"),
    "MAX": ("floating", "integer", "bool"),
    "BAND": ("integer", "bool"),
    "BOR": ("integer", "bool"),
    "BXOR": ("integer", "bool"),
}
_NAMES = {ReduceOp.SUM: "SUM", ReduceOp.AVG: "AVG", ReduceOp.PRODUCT: "PRODUCT",
          ReduceOp.MIN: "MIN", ReduceOp.MAX: "MAX", ReduceOp.BAND: "BAND",
          ReduceOp.BOR: "BOR", ReduceOp.BXOR: "BXOR"}


@dataclass(frozen=True)
class Reduction:
    """A validated op for one dtype. ``combine(acc, x)`` updates ``acc`` in place."""
    op: object
    name: str
    fn: object
    average: bool

    def combine(self, acc, x):
        self.fn(acc, x, out=acc)
        return acc


def _kind(dtype):
    if dtype == torch.bool:
        return "bool"
    if dtype.is_complex:
        return "complex"
    if dtype.is_floating_point:
        return "floating"
    return "integer"


def reduction(op, dtype, where):
    """Return the :class:`Reduction` for ``op`` on ``dtype`` or raise a clear error."""
    if isinstance(op, ReduceOp):
        op = op.op if hasattr(op, "op") else op
    if not isinstance(op, ReduceOp.RedOpType):
        raise _not_an_op(op, where)
    return _reduction(op, dtype, where)


# Cached because every collective call looks its op up, and hashing a ReduceOp
# costs ~0.5 us: the checks below hash it four times. Errors are not cached.
@functools.lru_cache(maxsize=None)
def _reduction(op, dtype, where):
    if op not in _NAMES:
        raise _not_an_op(op, where)
    name = _NAMES[op]
    kind = _kind(dtype)
    allowed = _DEFINED_FOR[name]
    if kind not in allowed:
        hint = " (use BOR or BAND for bool)" if kind == "bool" else ""
        raise ValueError(f"{where}: op=ReduceOp.{name} is not defined for dtype {dtype}{hint}; "
                         f"it is defined for {', '.join(allowed)} dtypes")
    fn = _BITWISE.get(op) or _ARITH[op]
    return Reduction(op, name, fn, name == "AVG")


def _not_an_op(op, where):
    return TypeError(f"{where}: op must be a torch.distributed.ReduceOp "
                     f"({', '.join(_NAMES.values())}), got {op!r}")
