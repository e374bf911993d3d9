"""The cases each exercise is graded on, the answers it must give, and the traffic it may use.

Every rank can build every other rank's input (the values depend only on the
rank and the case), so each rank computes the answer the built-in collective
gives, locally, with plain torch (as ``tests/expected.py`` does): the
built-ins themselves are switched off while a solution is graded. Inputs are
small integers, so every sum is exact in every dtype used, bfloat16 included,
whatever order a solution adds in; the one exception is the cancellation case
of the reductions (:func:`cancel_input`), where the order matters and the
answer is checked against the bound on rounding error instead.

A check has:

* ``cases(world_size, quick)``: the list of cases (the same on every rank);
* ``run(fn, case, rank, world_size)``: builds this rank's inputs, calls the
  learner's ``fn``, compares, returns ``{"ok", "lines"}`` (what to show for
  this rank if the case is wrong); optional keys: ``"changed"`` (lines: inputs
  the solution was only to read but changed, see :func:`untouched`),
  ``"bits"`` (a digest of the result and its first values: the parent demands
  the same digest on every rank, see :func:`bits`);
* ``need(case, world_size)``: what the algorithm sends per rank (None for
  cases too small to judge), used by the parent on the counted traffic;
* ``label(case)``: the case in words.
"""
import copy
import math
import weakref

import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

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


class SendRecvRing:
    chapter = "chapter 2 (tutorials/02_point_to_point.md)"

    def cases(self, n, quick):
        return tensor_cases(n, quick)

    def label(self, case):
        return tensor_label(case)

    def run(self, fn, case, rank, n):
        mine = tagged_input(rank, case["numel"], case["dtype"], case["salt"])
        tensor = mine.clone()
        fn(tensor)
        expected = tagged_input((rank - 1) % n, case["numel"], case["dtype"], case["salt"])
        return compare([(f"tensor (had {show(mine)})", expected, tensor, mine)])

    def need(self, case, n):
        if case["numel"] != LARGE or n == 1:
            return None
        s = case["numel"] * 4
        return Need(sent_bytes=s, sent_messages=1, ideal=f"one message of S = {s} bytes",
                    algorithm="a ring step", chapter=self.chapter)


class Broadcast:
    chapter = "chapter 5 (tutorials/05_algorithms.md)"

    def cases(self, n, quick):
        return tensor_cases(n, quick, with_root=True)

    def label(self, case):
        return tensor_label(case, "src")

    def run(self, fn, case, rank, n):
        src = case["root"]
        expected = tagged_input(src, case["numel"], case["dtype"], case["salt"])
        tensor = expected.clone() if rank == src else torch.full_like(expected, -1)
        fn(tensor, src)
        return compare([("tensor", expected, tensor)])

    def need(self, case, n):
        if case["numel"] != LARGE or n == 1:
            return None
        k = log2_ceil(n)
        return Need(sent_messages=k, recv_messages=1,
                    ideal=f"at most ceil(log2 N) = {k} messages from any rank, one into each",
                    algorithm="the binomial tree", chapter=self.chapter)


class Reduce:
    chapter = "chapter 5 (tutorials/05_algorithms.md)"

    def cases(self, n, quick):
        return tensor_cases(n, quick, with_root=True)

    def label(self, case):
        return tensor_label(case, "dst")

    def run(self, fn, case, rank, n):
        dst = case["root"]
        mine = reduce_input(rank, case["numel"], case["dtype"], case["salt"])
        tensor = mine.clone()
        fn(tensor, dst)
        if rank != dst:   # like torch: only dst's result is defined
            return {"ok": True, "lines": ["(not dst: any value)"]}
        terms = [reduce_input(r, case["numel"], case["dtype"], case["salt"]) for r in range(n)]
        expected = sum(terms).to(case["dtype"])
        return pattern(compare([(f"tensor (had {show(mine)})", expected, tensor, mine)]), expected, tensor,
                       terms, rank)

    def need(self, case, n):
        if case["numel"] != LARGE or n == 1:
            return None
        s, k = case["numel"] * 4, log2_ceil(n)
        return Need(sent_messages=1, sent_bytes=s, recv_messages=k,
                    ideal=f"one message from each rank but dst, at most ceil(log2 N) = {k} into any rank",
                    algorithm="the binomial tree", chapter=self.chapter)


class AllGather:
    chapter = "chapter 3 (tutorials/03_collectives.md) and chapter 4 (tutorials/04_ring_allreduce.md)"

    def cases(self, n, quick):
        return tensor_cases(n, quick)

    def label(self, case):
        return f"{tensor_label(case)} per rank, tensor_list of {{n}}"

    def run(self, fn, case, rank, n):
        mine = tagged_input(rank, case["numel"], case["dtype"], case["salt"])
        tensor_list = [torch.full_like(mine, -1) for _ in range(n)]
        handed = mine.clone()
        fn(tensor_list, handed)
        report = compare([(f"tensor_list[{r}]", tagged_input(r, case["numel"], case["dtype"], case["salt"]),
                           tensor_list[r]) for r in range(n)])
        return untouched(report, [("tensor", mine, handed)])

    def need(self, case, n):
        if case["numel"] != LARGE or n == 1:
            return None
        s = case["numel"] * 4
        return Need(sent_bytes=(n - 1) * s, sent_messages=n - 1,
                    ideal=f"(N-1) x S = {(n - 1) * s} bytes in N-1 = {n - 1} messages",
                    algorithm="the ring", chapter=self.chapter)


class ReduceScatter:
    chapter = "chapter 4 (tutorials/04_ring_allreduce.md)"

    def cases(self, n, quick):
        cases = tensor_cases(n, quick)
        return cases + [cancel_case(len(cases))]

    def label(self, case):
        return f"input_list of {{n}} x {tensor_label(case)}"

    def inputs(self, rank, n, case):
        if case.get("cancel"):
            return [cancel_input(rank, case["numel"], case["salt"] + j) for j in range(n)]
        return [reduce_input(rank, case["numel"], case["dtype"], case["salt"] + 11 * j) for j in range(n)]

    def run(self, fn, case, rank, n):
        input_list = self.inputs(rank, n, case)
        handed = [t.clone() for t in input_list]
        output = torch.full((case["numel"],), -1, dtype=case["dtype"])
        fn(output, handed)
        terms = [self.inputs(r, n, case)[rank] for r in range(n)]
        if case.get("cancel"):
            report = compare_rounded("output", terms, output)
        else:
            report = pattern(compare([("output", sum(terms).to(case["dtype"]), output)]),
                             sum(terms).to(case["dtype"]), output, terms, rank)
        return untouched(report, [(f"input_list[{j}]", before, now)
                                  for j, (before, now) in enumerate(zip(input_list, handed))])

    def need(self, case, n):
        if case["numel"] != LARGE or n == 1:
            return None
        s = case["numel"] * 4
        return Need(sent_bytes=(n - 1) * s, sent_messages=n - 1,
                    ideal=f"(N-1) x S = {(n - 1) * s} bytes in N-1 = {n - 1} messages "
                          f"(S: one rank's output)",
                    algorithm="the ring", chapter=self.chapter)


class AllReduce:
    chapter = "chapter 4 (tutorials/04_ring_allreduce.md)"

    def cases(self, n, quick):
        cases = tensor_cases(n, quick)
        return cases + [cancel_case(len(cases))]

    def label(self, case):
        return tensor_label(case)

    def run(self, fn, case, rank, n):
        if case.get("cancel"):
            terms = [cancel_input(r, case["numel"], case["salt"]) for r in range(n)]
            tensor = terms[rank].clone()
            fn(tensor)
            report = compare_rounded(f"tensor (had {show(terms[rank])})", terms, tensor)
        else:
            mine = reduce_input(rank, case["numel"], case["dtype"], case["salt"])
            tensor = mine.clone()
            fn(tensor)
            terms = [reduce_input(r, case["numel"], case["dtype"], case["salt"]) for r in range(n)]
            expected = sum(terms).to(case["dtype"])
            report = pattern(compare([(f"tensor (had {show(mine)})", expected, tensor, mine)]), expected,
                             tensor, terms, rank)
        if isinstance(tensor, torch.Tensor):
            report["bits"] = bits(tensor)   # all_reduce promises the same bits on every rank
        return report

    def need(self, case, n):
        if case["numel"] != LARGE or n == 1:
            return None
        s, e = case["numel"] * 4, 4
        ideal = 2 * (n - 1) * s // n
        return Need(sent_bytes=2 * (n - 1) * math.ceil(case["numel"] / n) * e, sent_messages=2 * (n - 1),
                    ideal=f"2(N-1)/N x S = {ideal} bytes in 2(N-1) = {2 * (n - 1)} messages",
                    algorithm="the ring", chapter=self.chapter)


class AllToAll:
    chapter = "chapter 3 (tutorials/03_collectives.md) and chapter 5 (tutorials/05_algorithms.md)"

    def cases(self, n, quick):
        return tensor_cases(n, quick)

    def label(self, case):
        return f"input_tensor_list of {{n}} x {tensor_label(case)}"

    def piece(self, src, dst, case):
        return tagged_input(src, case["numel"], case["dtype"], case["salt"] + dst)

    def run(self, fn, case, rank, n):
        inputs = [self.piece(rank, j, case) for j in range(n)]
        handed = [t.clone() for t in inputs]
        outputs = [torch.full_like(inputs[0], -1) for _ in range(n)]
        fn(outputs, handed)
        report = compare([(f"output_tensor_list[{j}]", self.piece(j, rank, case), outputs[j]) for j in range(n)])
        return untouched(report, [(f"input_tensor_list[{j}]", before, now)
                                  for j, (before, now) in enumerate(zip(inputs, handed))])

    def need(self, case, n):
        if case["numel"] != LARGE or n == 1:
            return None
        s = case["numel"] * 4
        return Need(sent_bytes=(n - 1) * s, sent_messages=n - 1,
                    ideal=f"(N-1) x S = {(n - 1) * s} bytes in N-1 = {n - 1} messages",
                    algorithm="the pairwise exchange", chapter=self.chapter)


def small_model(width, dtype):
    torch.manual_seed(0)   # the same weights on every rank
    return nn.Sequential(nn.Linear(6, width), nn.Tanh(), nn.Linear(width, 3)).to(dtype)


def backward_on(model, rank, salt, dtype):
    g = torch.Generator().manual_seed(1000 * salt + rank)
    x = torch.randn(4, 6, generator=g, dtype=torch.float64).to(dtype)
    model.zero_grad()
    model(x).pow(2).mean().backward()


class AverageGradients:
    chapter = "chapter 6 (tutorials/06_sync_sgd.md)"

    def cases(self, n, quick):
        dtypes = (torch.float32,) if quick else (torch.float32, torch.float64)
        cases = [dict(width=5, dtype=d) for d in dtypes] + [dict(width=1400, dtype=torch.float32)]
        for salt, case in enumerate(cases):
            case["salt"] = salt
        return cases

    def label(self, case):
        numel = sum(p.numel() for p in small_model(case["width"], torch.float32).parameters())
        return f"a {name_of(case['dtype'])} model of 4 parameters, {numel} values"

    def run(self, fn, case, rank, n):
        model = small_model(case["width"], case["dtype"])
        expected = []
        for r in range(n):
            reference = copy.deepcopy(model)
            backward_on(reference, r, case["salt"], case["dtype"])
            expected.append([p.grad.clone() for p in reference.parameters()])
        mean = [sum(gs) / n for gs in zip(*expected)]
        backward_on(model, rank, case["salt"], case["dtype"])
        weights = [p.detach().clone() for p in model.parameters()]
        fn(model)
        names = [name for name, _ in model.named_parameters()]
        report = compare([(f"{name}.grad", m, p.grad) for name, m, p in zip(names, mean, model.parameters())])
        first = next(iter(model.parameters()))
        pattern(report, mean[0], first.grad, [g[0] / n for g in expected], rank, f"{names[0]}.grad")
        return untouched(report, [(f"{name} (the weights)", w, p.detach())
                                  for name, w, p in zip(names, weights, model.parameters())])

    def need(self, case, n):
        if case["width"] < 100 or n == 1:
            return None
        sizes = [p.numel() for p in small_model(case["width"], torch.float32).parameters()]
        total = sum(sizes) * 4
        bound = max(2 * (n - 1) * math.ceil(sum(sizes) / n), sum(2 * (n - 1) * math.ceil(m / n) for m in sizes)) * 4
        return Need(sent_bytes=bound,
                    ideal=f"about 2(N-1)/N x S = {2 * (n - 1) * total // n} bytes (S = {total} bytes of gradients)",
                    algorithm="a ring all_reduce", chapter="chapter 4 (tutorials/04_ring_allreduce.md)")


class Zero1Step:
    chapter = "chapter 10 (tutorials/10_zero.md)"
    steps, lr, momentum = 3, 0.1, 0.9

    def cases(self, n, quick):
        dtypes = (torch.float32,) if quick else (torch.float32, torch.float64)
        cases = [dict(shapes=[(5, 3), (3,), (7,)], dtype=d) for d in dtypes]
        cases.append(dict(shapes=[(200, 100), (100,)], dtype=torch.float32))
        for salt, case in enumerate(cases):
            case["salt"] = salt
        return cases

    def label(self, case):
        numel = sum(math.prod(s) for s in case["shapes"])
        return (f"{self.steps} steps on {len(case['shapes'])} {name_of(case['dtype'])} parameters "
                f"({numel} values), lr={self.lr}, momentum={self.momentum}")

    def grads(self, rank, step, case):
        g = torch.Generator().manual_seed(100 * case["salt"] + 10 * step + rank)
        return [torch.randn(s, generator=g, dtype=torch.float64).to(case["dtype"]) for s in case["shapes"]]

    def run(self, fn, case, rank, n):
        g = torch.Generator().manual_seed(case["salt"])
        start = [torch.randn(s, generator=g, dtype=torch.float64).to(case["dtype"]) for s in case["shapes"]]
        params = [nn.Parameter(t.clone()) for t in start]
        reference = [t.clone() for t in start]
        buffers = None
        state = {}
        made = Allocations()
        for step in range(self.steps):
            for p, grad in zip(params, self.grads(rank, step, case)):
                p.grad = grad
            with made:
                fn(params, state, self.lr, self.momentum)
            mean = [sum(gs) / n for gs in zip(*[self.grads(r, step, case) for r in range(n)])]
            buffers = mean if buffers is None else [self.momentum * b + m for b, m in zip(buffers, mean)]
            reference = [p - self.lr * b for p, b in zip(reference, buffers)]
            report = compare([(f"after step {step + 1}: params[{i}]", r, p.detach())
                              for i, (r, p) in enumerate(zip(reference, params))])
            if not report["ok"]:
                return report
        # What the steps keep alive, wherever: the state dict, or a tensor the solution made and
        # keeps elsewhere (on a parameter, in a global); the parameters and gradients are the caller's.
        in_state = state_numel(state)
        kept = max(in_state, storage_numel(made.alive(), exclude=[*params, *(p.grad for p in params)]))
        total = sum(math.prod(s) for s in case["shapes"])
        allowed = math.ceil(total / n) + n
        if kept > allowed:
            where = [] if kept == in_state else _kept_outside(params, fn)
            return {"ok": True, "state": (kept, allowed, total, in_state, where), "lines": report["lines"]}
        return report

    def need(self, case, n):
        total = sum(math.prod(s) for s in case["shapes"])
        if total < 1000 or n == 1:
            return None
        bound = self.steps * 2 * (n - 1) * (math.ceil(total / n) + len(case["shapes"])) * 4
        return Need(sent_bytes=bound,
                    ideal=f"about {self.steps} x 2(N-1)/N x S = {self.steps * 2 * (n - 1) * total * 4 // n} bytes in "
                          f"{self.steps} steps (each: reduce-scatter the gradients, all-gather the parameters; "
                          f"S = {total * 4} bytes)",
                    algorithm="ZeRO-1", chapter=self.chapter)


def _kept_outside(params, fn):
    """Where a solution keeps tensors outside ``state``: attributes of the parameters, its globals."""
    where = []
    for i, p in enumerate(params):
        where += [f"params[{i}].{attr}" for attr, v in vars(p).items() if state_numel(v)]
    glob = getattr(fn, "__globals__", {})
    where += [f"the global {name}" for name, v in glob.items()
              if not name.startswith("__") and isinstance(v, (torch.Tensor, dict, list, tuple)) and state_numel(v)]
    return where


def state_numel(obj):
    """Tensor elements held in a (nested) optimizer state."""
    if isinstance(obj, torch.Tensor):
        return obj.numel()
    if isinstance(obj, dict):
        return sum(state_numel(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(state_numel(v) for v in obj)
    return 0


from tutorials.exercises._sim import SimAllReduce  # noqa: E402  (graded in the simulator, chapter 14)

CHECKS = {
    "send_recv_ring": SendRecvRing(),
    "broadcast": Broadcast(),
    "reduce": Reduce(),
    "all_gather": AllGather(),
    "reduce_scatter": ReduceScatter(),
    "all_reduce": AllReduce(),
    "all_to_all": AllToAll(),
    "average_gradients": AverageGradients(),
    "zero1_step": Zero1Step(),
    "sim_all_reduce": SimAllReduce(),
}

from tutorials.exercises._checks_parallel_b import PARALLEL_B_CHECKS  # noqa: E402  (uses the helpers above)
CHECKS.update(PARALLEL_B_CHECKS)
from tutorials.exercises import _checks_parallel  # noqa: E402  (chapters 16 and 18; imports this module's helpers)
CHECKS.update(_checks_parallel.CHECKS)
from tutorials.exercises import _checks_zigzag  # noqa: E402  (chapter 20's zig-zag; imports this module's helpers)
CHECKS.update(_checks_zigzag.CHECKS)
from tutorials.exercises import _checks_ladder  # noqa: E402  (the steps that climb to a long exercise)
CHECKS.update(_checks_ladder.CHECKS)
