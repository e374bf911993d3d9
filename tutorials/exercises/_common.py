"""What every check of the grader shares: the inputs that encode each rank, the comparisons that
say what went wrong, the rules on traffic (:class:`Need`) and memory (:class:`Allocations`).

This module imports no other module of the grader; the checks (one file per family of
exercises) import it, and the registry ``_checks.CHECKS`` imports the checks.
"""
import importlib
import importlib.util
import math
import os
import sys
import traceback
import weakref

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from tutorials.exercises import _routes

LARGE = 33600            # divisible by 1..8, so the ideal traffic is a whole number of elements
FULL_DTYPES = (torch.float32, torch.float64, torch.int64, torch.bfloat16)


def name_of(dtype):
    return str(dtype).replace("torch.", "")


def reduce_input(rank, numel, dtype, salt=0):
    """Values in -3..3, different on every rank: sums over 8 ranks are exact even in bfloat16."""
    i = torch.arange(numel)
    return ((i * 3 + rank * 5 + salt) % 7 - 3).to(dtype)


def tagged_input(rank, numel, dtype, salt=0):
    """rank * 10 + something small: you can read off which rank a value came from."""
    i = torch.arange(numel)
    return (rank * 10 + (i + salt) % 7).to(dtype)


TAGGED_VALUES = "rank r's tensor holds 10 r + a number from 0 to 6, so 23 came from rank 2"
REDUCED_VALUES = ("every rank holds small integers in -3..3, different on every rank, so every sum is exact in "
                  "every dtype: a wrong value is never rounding")
CANCEL_VALUES = ("float32 values that cancel: even ranks hold +-2^27, odd ranks 1 to 2.5, so the order of the "
                 "additions changes the sum (any order is right within rounding, but every rank must use the same)")


def reduced_values(case):
    """What the test values of a reduction's ``case`` encode, for a wrong verdict."""
    return CANCEL_VALUES if case.get("cancel") else REDUCED_VALUES


def tagged_values(case):
    """What the test values of a collective that moves tensors (:func:`tagged_input`) encode."""
    return TAGGED_VALUES


def cancel_input(rank, numel, salt=0):
    """float32 values where the order of summation changes the result.

    Even ranks hold +-2**27, cancelling in pairs; odd ranks hold small values
    (1 to 2.5) that vanish when added to 2**27 (its float32 spacing is 16) but
    survive when added after the large ones cancel. So (x0 + x1) + x2 is not
    x0 + (x1 + x2): any order is a right answer within the rounding bound, but
    every rank must use the same one.
    """
    i = torch.arange(numel)
    if rank % 2 == 0:
        sign = 1 - 2 * ((rank // 2 + i + salt) % 2)
        return (sign * 2.0 ** 27).to(torch.float32)
    return (1 + ((i + rank + salt) % 4) * 0.5).to(torch.float32)


def cancel_case(salt):
    return dict(numel=7, dtype=torch.float32, salt=salt, cancel=True)


def within_rounding(terms, received):
    """True if ``received`` is the float32 sum of ``terms`` in some order: within the bound on
    recursive summation's error, (n - 1) * 2**-24 * sum |x| per element (Higham, 2002, eq. 4.4)."""
    exact = sum(t.double() for t in terms)
    bound = (len(terms) - 1) * 2.0 ** -24 * sum(t.double().abs() for t in terms)
    return (isinstance(received, torch.Tensor) and received.shape == exact.shape
            and received.dtype == torch.float32 and bool(torch.all((received.double() - exact).abs() <= bound)))


def untouched(report, inputs):
    """Fail ``report`` where the solution changed a tensor it was only to read.

    ``inputs``: [(what, before, now)]: a copy taken before the call, and the
    tensor the solution was handed. Torch's collectives leave their inputs as
    they were, and callers rely on it (the gradients, a buffer reused next step).
    """
    changed = []
    for what, before, now in inputs:
        if now.shape == before.shape and torch.equal(now, before):
            continue
        at = first_wrong(before, now)
        at = at - at % 8 if before.numel() > 8 else 0
        changed.append(f"{what} held {show(before, at)} before the call and {show(now, at)} after")
    if changed:
        report["output_ok"] = report["ok"]
        report["ok"] = False
        report["changed"] = changed
    return report


def bits(tensor):
    """A digest of ``tensor``'s bytes and its first values written in full, for the parent to compare."""
    import hashlib
    flat = tensor.detach().contiguous().view(-1)
    raw = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
    return hashlib.sha1(raw).hexdigest(), [repr(float(v)) for v in flat[:4].float()]


def fmt(values):
    return "[" + ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values) + "]"


def show(t, start=0, limit=8):
    flat = t.detach().flatten()
    if flat.dtype == torch.bfloat16:
        flat = flat.float()
    part = flat[start:start + limit].tolist()
    more = flat.numel() - start - len(part)
    text = fmt(part)
    if start or more > 0:
        text = (f"from index {start}: " if start else "") + text[:-1] + (", ...]" if more > 0 else "]")
        text += f" ({flat.numel()} values)"
    return text


def same(expected, received):
    if not isinstance(received, torch.Tensor) or received.shape != expected.shape:
        return False
    if received.dtype != expected.dtype:
        return False
    if expected.dtype.is_floating_point and expected.dtype in (torch.float32, torch.float64) \
            and not _integral(expected):
        tol = 1e-5 if expected.dtype == torch.float32 else 1e-12
        return torch.allclose(received, expected, rtol=tol, atol=tol)
    return torch.equal(received, expected)


def _integral(t):
    return t.numel() == 0 or bool(torch.all(t == t.round()))


def first_wrong(expected, received):
    if received.shape != expected.shape or received.numel() == 0:
        return 0
    bad = (received.detach().float() != expected.float()).flatten().nonzero()
    return int(bad[0]) if len(bad) else 0


def compare(pairs):
    """pairs: [(what, expected, received)] on this rank; returns the report of run()."""
    lines, ok, wrong = [], True, 0
    for what, expected, received, *before in pairs:
        if same(expected, received):
            if len(pairs) <= 4:   # beside a few wrong ones, the right ones help; among many, they clutter
                lines.append(f"{what}: {show(received)}  ok")
            continue
        ok = False
        wrong += 1
        if wrong > 2:
            continue
        if not isinstance(received, torch.Tensor):
            lines.append(f"{what}: expected a tensor, found {type(received).__name__}")
        elif received.shape != expected.shape or received.dtype != expected.dtype:
            lines.append(f"{what}: expected {name_of(expected.dtype)}{list(expected.shape)}, "
                         f"found {name_of(received.dtype)}{list(received.shape)}")
        else:
            at = first_wrong(expected, received)
            at = at - at % 8 if expected.numel() > 8 else 0
            lines.append(f"{what}: expected {show(expected, at)}")
            lines.append(f"{' ' * len(what)}  received {show(received, at)}")
            if before and expected.numel() and torch.equal(received, before[0]):
                lines.append("(unchanged: the result must be written into the tensor "
                             "passed in, e.g. tensor.copy_(result) or tensor += ..., not tensor = ...)")
    if wrong > 2:
        lines.append(f"(and {wrong - 2} more wrong)")
    return {"ok": ok, "lines": lines}


def pattern(report, expected, received, terms, rank, what="the result"):
    """Name a recognisable wrong value on a failing ``report``: N times (or 1/N of) the expected
    sum, one rank's contribution missing or counted twice. ``terms``: each rank's contribution."""
    if report["ok"] or not isinstance(received, torch.Tensor) or received.shape != expected.shape \
            or received.dtype != expected.dtype or expected.numel() == 0:
        return report
    n = len(terms)
    hint = None
    wide = received.double()
    if n > 1 and bool(expected.ne(0).any()) and torch.equal(wide, n * expected.double()):
        hint = (f"exactly N = {n} times the expected value; each rank's input was added N times, or "
                f"a sum was kept where the mean was due (divide by N)")
    elif n > 1 and torch.equal(wide * n, expected.double()):
        hint = f"exactly 1/N of the expected value; divided by N = {n} once too often"
    else:
        for r, term in enumerate(terms):
            whose = "this rank's own input" if r == rank else f"rank {r}'s input"
            if not bool(term.ne(0).any()):
                continue
            if torch.equal(wide, expected.double() - term.double()):
                hint = f"{whose} is missing from the sum; every rank's contribution must be added once"
            elif torch.equal(wide, expected.double() + term.double()):
                hint = f"{whose} is counted twice; every rank's contribution must be added once"
            if hint:
                break
    if hint:
        report["lines"].append(f"({what}: {hint})")
    return report


def compare_rounded(what, terms, received):
    """The report for a cancellation case: any order of summation passes, a wrong sum does not."""
    if within_rounding(terms, received):
        return {"ok": True, "lines": [f"{what}: {show(received)}  ok"]}
    exact = sum(t.double() for t in terms)
    return {"ok": False, "lines": [f"{what}: expected {show(exact)} (exact; any order of summation "
                                   f"within float32 rounding passes)", f"{' ' * len(what)}  received {show(received)}"]}


def roots(n, quick):
    return sorted({n - 1, n // 2}) if quick else sorted({0, n // 2, n - 1})


def tensor_cases(n, quick, with_root=False):
    if quick:   # every size, but the second dtype only on one
        cases = [dict(numel=s, dtype=torch.float32) for s in (0, 1, 7)] + [dict(numel=7, dtype=torch.int64)]
    else:
        cases = [dict(numel=s, dtype=d) for s in (0, 1, 7) for d in FULL_DTYPES]
    cases.append(dict(numel=LARGE, dtype=torch.float32))
    if with_root:
        cases = [dict(c, root=r) for c in cases for r in (roots(n, quick) if c["numel"] != LARGE else [n - 1])]
    for salt, case in enumerate(cases):
        case["salt"] = salt
    return cases


def reduction_cases(n, quick):
    """A reduction's cases: :func:`tensor_cases` and the float32 case where the order of additions
    matters (:func:`cancel_input`)."""
    cases = tensor_cases(n, quick)
    return cases + [cancel_case(len(cases))]


def tensor_label(case, root_name=None):
    text = f"tensor {name_of(case['dtype'])}[{case['numel']}]"
    if case.get("cancel"):
        text += " where the order of summation matters"
    if root_name:
        text += f", {root_name}={case['root']}"
    return text


class Allocations(TorchFunctionMode):
    """While active (``with made: fn(...)``): every tensor the solution's code creates, held by weak
    reference. A memory rule then counts what is still alive, wherever the solution keeps it (a
    list built up front, an attribute on a parameter, a module global), not only what the grader
    handed out and can see.

    Args:
        keep (callable, optional): Which new tensors to remember (default all).
    """

    def __init__(self, keep=None):
        super().__init__()
        self.made, self.keep, self.paused = [], keep, False

    # A function mode, not a dispatch mode: a process's first Python dispatch mode imports
    # torch._dynamo (8 s), which a rank would spend looking stuck.
    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.paused:
            return out
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and (self.keep is None or self.keep(t)):
                self.made.append(weakref.ref(t))
        return out

    def alive(self):
        self.made = [r for r in self.made if r() is not None]
        return [t for t in (r() for r in self.made) if t is not None]


def storage_numel(tensors, exclude=()):
    """Elements held by the distinct storages behind ``tensors`` (a view keeps its whole storage
    alive), leaving out the storages of ``exclude``."""
    seen = {t.untyped_storage().data_ptr() for t in exclude if isinstance(t, torch.Tensor)}
    total = 0
    for t in tensors:
        storage = t.untyped_storage()
        if storage.nbytes() == 0 or storage.data_ptr() in seen:
            continue
        seen.add(storage.data_ptr())
        total += storage.nbytes() // t.element_size()
    return total


def log2_ceil(n):
    return max(0, math.ceil(math.log2(n))) if n > 1 else 0


class Need:
    """What the algorithm sends per rank, and what to tell a solution that sends more.

    Bounds are per rank; None means "not limited". ``ideal`` is the
    algorithm's figure in words (e.g. "2(N-1)/N x S = 235200 bytes"). ``min_bytes`` is a
    lower bound on the bytes all ranks send together; by default any counted byte meets it
    where the algorithm sends some (so a run whose data moved uncounted never passes).
    """

    def __init__(self, sent_bytes=None, sent_messages=None, recv_messages=None, ideal="", algorithm="",
                 chapter="", min_bytes=None):
        self.sent_bytes, self.sent_messages, self.recv_messages = sent_bytes, sent_messages, recv_messages
        self.min_bytes = min_bytes
        self.ideal, self.algorithm, self.chapter = ideal, algorithm, chapter


def learner_traceback(exc, source):
    """The traceback from the first frame outside the grader (the learner's code and below)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<frozen")]
    here = os.path.dirname(os.path.abspath(__file__))
    start = len(frames)     # all the grader's own (a SyntaxError names its line below): show none
    for i, frame in enumerate(frames):
        path = os.path.abspath(frame.filename)
        if not (os.path.dirname(path) == here and os.path.basename(path).startswith("_")):
            start = i
            break
    lines = (["Traceback (most recent call last):\n"] + traceback.format_list(frames[start:])) if start < len(frames) else []
    lines += traceback.format_exception_only(type(exc), exc)
    return "".join(lines)


def load(name, source):
    """The learner's function ``name``: ``source`` is a file path or a module name."""
    if source.endswith(".py"):
        spec = importlib.util.spec_from_file_location(f"_graded_{name}", source)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(source)
    fn = getattr(module, name, None)
    if not callable(fn):
        raise LookupError(f"{source} defines no function named {name}")
    return fn


def graded_here(name, source, shown, grade, off, chapter):
    """(passed, reason, text) of ``grade(fn)`` for a check run in the grader's own process (a pure
    function, or one run in the simulator): the learner's ``fn`` loaded and run with the library's
    routes switched off (before it loads too, so that ``from ... import x`` gets the switched-off
    one). A file that does not load, or a call down a route, is the verdict; ``off`` says what was
    switched off and what to do instead."""
    restore = _routes.switch_off(source)
    try:
        try:
            fn = load(name, source)
        except Exception:
            return False, "load_error", (f"FAIL {name}: {shown} does not load:\n"
                                         f"{traceback.format_exc(limit=-1)}")
        return grade(fn)
    except _routes.BuiltinUsed as exc:
        line = _routes.where_called(exc, source) or "in your code"
        return False, "builtin", f"FAIL {name}: it calls {exc.name} ({line}). {off} See {chapter}."
    finally:
        restore()
