"""Checks of the exercises of chapters 2-12: send_recv_ring, the seven collectives, averaged
gradients and ZeRO-1 (registered in ``_checks.CHECKS``; the helpers are in ``_common``)."""
import copy
import math

import torch
import torch.nn as nn

from tutorials.exercises._common import (Allocations, LARGE, Need, bits, cancel_input, compare,
                                         compare_rounded, log2_ceil, name_of, pattern, reduce_input,
                                         reduced_values, reduction_cases, show, storage_numel, tagged_input,
                                         tagged_values, tensor_cases, tensor_label, untouched)


class SendRecvRing:
    chapter = "chapter 2 (tutorials/02_point_to_point.md)"

    values = staticmethod(tagged_values)

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

    values = staticmethod(tagged_values)

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

    values = staticmethod(reduced_values)

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

    values = staticmethod(tagged_values)

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

    values = staticmethod(reduced_values)

    def cases(self, n, quick):
        return reduction_cases(n, quick)

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

    values = staticmethod(reduced_values)

    def cases(self, n, quick):
        return reduction_cases(n, quick)

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

    def values(self, case):
        return "the piece rank s sends to rank d holds 10 s + a number from 0 to 6, so 23 came from rank 2"

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
}
