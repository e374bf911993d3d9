"""Aliased buffers: every way a user can pass the same memory as input and output.

A user who writes ``all_to_all(lst, lst)``, ``all_gather(lst, lst[rank])``,
``reduce_scatter(lst[rank], lst)``, ``scatter(lst[src], lst, src)`` on the
source or ``gather(t, lst, dst)`` with ``t`` in ``lst`` on the destination
gets, from torch's built-in, the answer as if every input had been read before
any output was written. Ours must give the same, for every algorithm, world
sizes 1 to 5, sizes 0, fewer elements than ranks, odd, and large (large enough
that a send still reading a buffer races with a receive writing it, which is
how ``all_to_all(out, inp)`` with ``out is inp`` returned wrong data).

Inputs encode (owner rank, list index, element), so each rank computes the
answer in closed form. The built-in runs the same call with the same aliasing
first, and ``test_builtin_agrees_with_the_closed_forms`` checks that the closed
forms are torch's answers. Two aliasings are not well defined in torch (measured
on torch 2.15, gloo): ``reduce_scatter`` with ``output`` being another rank's
entry ``input_list[j]`` and ``scatter`` on the source with ``tensor`` being another
rank's piece ``scatter_list[j]`` give wrong values on some ranks there. Ours is
held to the same closed form (inputs read before outputs are written) there too,
since that is the only answer a user can rely on; the built-in is not compared.

Each variant also has a ``views`` form: input and output are different Python
objects over the same memory (slices of one buffer), so detecting aliasing by
``is`` alone is not enough.
"""
import functools
import time

import pytest
import torch
import torch.distributed as dist

import collectives
from collectives import ALGORITHMS
from tests.expected import builtin_refused
from tests.worlds import run_world

WORLD_SIZES = (1, 2, 3, 4, 5)
SIZES = (0, 1, 3, 1001, 65536)   # 1 and 3: fewer elements than ranks at N=2..5
BIG = SIZES[-1]
VARIANTS = {
    "all_to_all": ("same_list", "same_tensors", "rotated", "views"),
    "all_gather": ("own", "other", "views"),
    "reduce_scatter": ("own", "other", "views"),
    "scatter": ("own", "other", "views"),
    "gather": ("own", "other", "views"),
}
# Aliasings whose built-in result is not defined (see the module docstring): not compared.
BUILTIN_UNDEFINED = {("reduce_scatter", "other"), ("scatter", "other")}


def value(owner, k, numel):
    """Rank ``owner``'s entry ``k``: distinct per (owner, k, element), exact in float32 sums."""
    return torch.arange(numel, dtype=torch.float32) + 1000.0 * owner + 100.0 * k


def _slices(buf, n, m):
    return [buf[j * m:(j + 1) * m] for j in range(n)]


def _overlap(a, b):
    """Whether two tensors share any byte of memory."""
    if a.numel() == 0 or b.numel() == 0:
        return False
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + b.nbytes and b0 < a0 + a.nbytes


class Case:
    """One aliased call on this rank: ``run(api, **kw)`` makes it, ``problems()`` checks it."""

    def __init__(self, collective, variant, n, me, m):
        self.collective, self.variant, self.n, self.me, self.m = collective, variant, n, me, m
        self.checks = []   # (name, tensor, expected value)
        getattr(self, "_" + collective)(variant, n, me, m)

    def _all_to_all(self, variant, n, me, m):
        inp = [value(me, j, m) for j in range(n)]
        if variant == "same_list":
            out = inp
        elif variant == "same_tensors":
            out = list(inp)
        elif variant == "rotated":        # out[j] is the tensor this rank sends to j + 1
            out = [inp[(j + 1) % n] for j in range(n)]
        else:
            buf = torch.cat(inp)
            inp, out = _slices(buf, n, m), _slices(buf, n, m)
        self.run = lambda api, **kw: api.all_to_all(out, inp, **kw)
        self.checks = [(f"output[{j}]", out[j], value(j, me, m)) for j in range(n)]

    def _all_gather(self, variant, n, me, m):
        if variant == "views":
            buf = torch.full((n * m,), -1.0)
            tensor_list, tensor = _slices(buf, n, m), buf[me * m:(me + 1) * m]
        else:
            tensor_list = [torch.full((m,), -1.0) for _ in range(n)]
            tensor = tensor_list[me if variant == "own" else (me + 1) % n]
        tensor.copy_(value(me, 0, m))
        self.run = lambda api, **kw: api.all_gather(tensor_list, tensor, **kw)
        self.checks = [(f"tensor_list[{j}]", tensor_list[j], value(j, 0, m)) for j in range(n)]

    def _reduce_scatter(self, variant, n, me, m):
        if variant == "views":
            buf = torch.cat([value(me, j, m) for j in range(n)])
            input_list, output = _slices(buf, n, m), buf[me * m:(me + 1) * m]
        else:
            input_list = [value(me, j, m) for j in range(n)]
            output = input_list[me if variant == "own" else (me + 1) % n]
        self.run = lambda api, **kw: api.reduce_scatter(output, input_list, **kw)
        want = functools.reduce(torch.add, [value(i, me, m) for i in range(n)])
        self.checks = [("output", output, want)] + [
            (f"input_list[{j}] (not the output)", input_list[j], value(me, j, m))
            for j in range(n) if not _overlap(input_list[j], output)]

    def _scatter(self, variant, n, me, m):
        src = n - 1   # a root other than 0 where there is one
        scatter_list = None
        if me != src:
            tensor = torch.full((m,), -1.0)
        elif variant == "views":
            buf = torch.cat([value(src, j, m) for j in range(n)])
            scatter_list, tensor = _slices(buf, n, m), buf[src * m:(src + 1) * m]
        else:
            scatter_list = [value(src, j, m) for j in range(n)]
            tensor = scatter_list[src if variant == "own" else (src + 1) % n]
        self.run = lambda api, **kw: api.scatter(tensor, scatter_list, src=src, **kw)
        self.checks = [("tensor", tensor, value(src, me, m))] + [
            (f"scatter_list[{j}] (not the output)", scatter_list[j], value(src, j, m))
            for j in range(n) if scatter_list and not _overlap(scatter_list[j], tensor)]

    def _gather(self, variant, n, me, m):
        dst = 1 % n   # a root other than 0 where there is one
        tensor, gather_list = value(me, 0, m), None
        if me == dst:
            at = dst if variant == "own" else (dst + 1) % n
            if variant == "views":
                buf = torch.full((n * m,), -1.0)
                gather_list, tensor = _slices(buf, n, m), buf[at * m:(at + 1) * m]
                tensor.copy_(value(me, 0, m))
            else:
                gather_list = [torch.full((m,), -1.0) for _ in range(n)]
                gather_list[at] = tensor
        self.run = lambda api, **kw: api.gather(tensor, gather_list, dst=dst, **kw)
        self.checks = [(f"gather_list[{j}]", gather_list[j], value(j, 0, m))
                       for j in range(n) if gather_list is not None]

    def problems(self):
        bad = []
        for name, got, want in self.checks:
            if not torch.equal(got, want):
                wrong = (got != want).nonzero().flatten()[:3].tolist() if got.shape == want.shape else []
                bad.append(f"{name}: elements {wrong} are {[got[i].item() for i in wrong]}, "
                           f"want {[want[i].item() for i in wrong]}" if wrong else
                           f"{name}: {got.shape} vs {want.shape}")
        return bad


def _aliasing_world(rank, n):
    """{(collective, variant, size): {"builtin": ..., (algorithm, async_op): ...}} on this rank."""
    out = {}
    start = time.monotonic()
    for collective, variants in VARIANTS.items():
        for variant in variants:
            for m in SIZES:
                key, entry = (collective, variant, m), {}
                case = Case(collective, variant, n, rank, m)
                try:
                    case.run(dist)
                    entry["builtin"] = case.problems()
                except RuntimeError as exc:   # e.g. a gloo collective an older torch lacks
                    if not builtin_refused(exc):
                        raise
                    entry["builtin"] = None
                for algorithm in (None,) + ALGORITHMS[collective]:
                    for async_op in (False, True):
                        if async_op and m == BIG:
                            continue   # the race needs the size, not the handle: keep it cheap
                        case = Case(collective, variant, n, rank, m)
                        try:
                            work = case.run(collectives, algorithm=algorithm, async_op=async_op)
                            if async_op:
                                work.wait()
                            problems = case.problems()
                        except Exception as exc:   # reported per case; the next cases go on
                            problems = [f"raised {type(exc).__name__}: {str(exc)[:300]}"]
                        entry[(algorithm, async_op)] = problems
                out[key] = entry
    out["seconds"] = time.monotonic() - start
    return out


@functools.cache
def _world(n):
    return run_world(_aliasing_world, n, timeout=300, env={"COLLECTIVES_TIMEOUT": "10"})


def _report(results, collective, which):
    lines = []
    for rank, res in enumerate(results):
        for key, entry in res.items():
            if key == "seconds" or key[0] != collective:
                continue
            c, variant, m = key
            for how, problems in entry.items():
                if which(how) and problems:
                    lines.append(f"rank {rank} {c}[{variant}] size {m} {how}: {'; '.join(problems)}")
    return lines


def _entries(results, collective):
    return {k: v for k, v in results[0].items() if k != "seconds" and k[0] == collective}


@pytest.mark.parametrize("collective", list(VARIANTS))
@pytest.mark.parametrize("n", WORLD_SIZES)
def test_aliased_call_gives_the_inputs_before_the_call(n, collective):
    results = _world(n)
    lines = _report(results, collective, lambda how: how != "builtin")
    assert not lines, (f"N={n}: {len(lines)} wrong results; first ones:\n" + "\n".join(lines[:12]))


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_builtin_agrees_with_the_closed_forms(n):
    """The closed forms above are torch's own answers for every defined aliasing."""
    results = _world(n)
    compared = 0
    lines = []
    for collective in VARIANTS:
        for (c, variant, m) in _entries(results, collective):
            if (c, variant) in BUILTIN_UNDEFINED:
                continue
            for rank, res in enumerate(results):
                problems = res[(c, variant, m)]["builtin"]
                if problems is None:
                    continue   # this torch's gloo lacks the collective
                compared += 1
                lines += [f"rank {rank} {c}[{variant}] size {m}: {p}" for p in problems]
    assert not lines, "\n".join(lines[:12])
    if not compared:
        pytest.skip("this torch's gloo backend has none of these collectives")
