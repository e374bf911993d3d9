"""Checks for the exercises of chapters 17 and 19: ``tensor_parallel_mlp`` and ``moe_dispatch``.

Same shape as every check (cases, run, need, label: ``_checks.py`` says what each does);
registered in the registry ``_checks.CHECKS``. Every rank builds every rank's inputs from the case's
seed, so each computes the expected answer itself, in one process, with plain torch.
"""
import math

import torch
import torch.nn.functional as F

from tutorials.exercises._common import Need, compare, untouched

E = 8   # float64 throughout: tensor-parallel sums are reordered, float64 keeps them within 1e-12


class TensorParallelMLP:
    chapter = "chapter 17 (tutorials/17_tensor_and_sequence_parallelism.md)"

    def cases(self, n, quick):
        cases = [dict(batch=3, hidden=4, ffn=2 * n)]
        if not quick:
            cases.append(dict(batch=1, hidden=5, ffn=n))
        cases.append(dict(batch=280, hidden=120, ffn=2 * n))     # 33600 values of y: traffic is judged
        for salt, case in enumerate(cases):
            case["salt"] = salt
        return cases

    def label(self, case):
        return f"x float64[{case['batch']}, {case['hidden']}], F = {case['ffn']} hidden units, F/N per rank"

    def whole(self, case):
        g = torch.Generator().manual_seed(case["salt"])
        b, h, f = case["batch"], case["hidden"], case["ffn"]
        shapes = [(b, h), (f, h), (f,), (h, f), (h,), (b, h)]    # x, W1, b1, W2, b2, dy
        return [torch.randn(s, generator=g, dtype=torch.float64) for s in shapes]

    def run(self, fn, case, rank, n):
        x, w1, b1, w2, b2, dy = self.whole(case)
        ref = [t.clone().requires_grad_() for t in (x, w1, b1, w2, b2)]
        y_ref = F.linear(F.gelu(F.linear(ref[0], ref[1], ref[2])), ref[3], ref[4])
        y_ref.backward(dy)
        given = [x, w1.chunk(n, 0)[rank], b1.chunk(n, 0)[rank], w2.chunk(n, 1)[rank], b2]
        mine = [t.clone().contiguous().requires_grad_() for t in given]
        y = fn(*mine)
        if isinstance(y, torch.Tensor) and y.shape == y_ref.shape and not y.requires_grad:
            return {"ok": False, "lines": ["y does not require grad: build it from the inputs with torch "
                                           "operations and autograd Functions (no .detach(), no torch.no_grad())"]}
        if isinstance(y, torch.Tensor) and y.shape == y_ref.shape:
            y.backward(dy)
        names = ["x.grad", "w1.grad", "b1.grad", "w2.grad", "b2.grad"]
        expected = [ref[0].grad, ref[1].grad.chunk(n, 0)[rank], ref[2].grad.chunk(n, 0)[rank],
                    ref[3].grad.chunk(n, 1)[rank], ref[4].grad]
        report = compare([("y", y_ref.detach(), y.detach() if isinstance(y, torch.Tensor) else y)]
                         + [(name, e, p.grad) for name, e, p in zip(names, expected, mine)])
        got = mine[0].grad
        if not report["ok"] and n > 1 and isinstance(got, torch.Tensor) and got.shape == x.shape:
            part = x.clone().requires_grad_()
            F.linear(F.gelu(F.linear(part, *[t.detach() for t in mine[1:3]])), mine[3].detach()).backward(dy)
            if torch.allclose(got, part.grad, rtol=1e-9, atol=1e-9):
                report["lines"].append("(x.grad holds only this rank's part, the gradient through its own "
                                       "hidden units: the f operator in front of the first layer must "
                                       "all_reduce the gradient in its backward)")
        return untouched(report, [(what, before, now.detach()) for what, before, now
                                  in zip(("x", "w1", "b1", "w2", "b2"), given, mine)])

    def need(self, case, n):
        numel = case["batch"] * case["hidden"]
        if numel < 1000 or n == 1:
            return None
        s = numel * E
        return Need(sent_bytes=2 * 2 * (n - 1) * math.ceil(numel / n) * E, sent_messages=4 * (n - 1),
                    ideal=f"2 x 2(N-1)/N x S = {4 * (n - 1) * s // n} bytes in 4(N-1) = {4 * (n - 1)} messages "
                          f"(one ring all_reduce of y forward, one of dL/dx backward; S = B x H x 8 = {s} bytes)",
                    algorithm="Megatron's f and g on the ring", chapter=self.chapter)


class MoeDispatch:
    chapter = "chapter 19 (tutorials/19_expert_parallelism.md)"

    def cases(self, n, quick):
        cases = [dict(tokens=[5, 0, 7, 2, 6], hidden=3, skew=False),       # rank 1 has no tokens
                 dict(tokens=[4, 3, 1, 6, 2], hidden=2, skew="hot")]       # every token to the last expert
        if not quick:
            cases.append(dict(tokens=[1, 1, 1, 1, 1], hidden=1, skew=False))
        cases.append(dict(tokens=[700, 650, 700, 600, 700], hidden=48, skew=True))   # traffic is judged
        for salt, case in enumerate(cases):
            case["salt"] = salt
        return cases

    def label(self, case):
        how = {False: "random experts", True: "skewed routing", "hot": "every token to the last expert"}
        return (f"tokens float64[T, {case['hidden']}], T by rank from {case['tokens']}, "
                f"{how[case['skew']]}")

    def inputs(self, r, n, case):
        """Rank r's tokens (value = 100000 r + 100 row + column: readable) and the expert of each."""
        t = case["tokens"][r % len(case["tokens"])]
        g = torch.Generator().manual_seed(100 * case["salt"] + r)
        if case["skew"] == "hot":
            expert = torch.full((t,), n - 1, dtype=torch.int64)
        elif case["skew"]:
            weights = torch.arange(1, n + 1, dtype=torch.float64) ** 2      # expert n-1 gets the most
            expert = torch.multinomial(weights, t, replacement=True, generator=g) if t else \
                torch.zeros(0, dtype=torch.int64)
        else:
            expert = torch.randint(0, n, (t,), generator=g)
        rows = torch.arange(t, dtype=torch.float64).unsqueeze(1)
        cols = torch.arange(case["hidden"], dtype=torch.float64)
        return 100000 * r + 100 * rows + cols, expert

    def run(self, fn, case, rank, n):
        tokens, expert = self.inputs(rank, n, case)
        everyone = [self.inputs(j, n, case) for j in range(n)]
        expected = torch.cat([t[e == rank] for t, e in everyone])
        counts = torch.tensor([int((e == rank).sum()) for _, e in everyone])
        handed = [tokens.clone(), expert.clone()]
        result = fn(*handed)
        if not (isinstance(result, tuple) and len(result) == 2):
            return {"ok": False, "lines": [f"expected (received, counts), found {type(result).__name__}"]}
        received, got_counts = result
        try:
            got_counts = torch.as_tensor(got_counts, dtype=torch.int64)
        except (TypeError, ValueError):
            pass
        report = compare([("received", expected, received), ("counts", counts, got_counts)])
        own = int(counts[rank])
        if (not report["ok"] and own and isinstance(received, torch.Tensor)
                and received.shape[0] == expected.shape[0] - own):
            report["lines"].append(f"(received misses {own} rows: the tokens rank {rank} routes to its own "
                                   f"expert stay here, copied into place without a message)")
        return untouched(report, [("tokens", tokens, handed[0]), ("expert", expert, handed[1])])

    def need(self, case, n):
        if case["hidden"] < 10 or n == 1:
            return None
        worst = 0
        for r in range(n):
            _, expert = self.inputs(r, n, case)
            worst = max(worst, int((expert != r).sum()))
        bound = 8 * (n - 1) + worst * case["hidden"] * E
        return Need(sent_bytes=bound, sent_messages=2 * (n - 1),
                    ideal=f"at most {bound} bytes in 2(N-1) = {2 * (n - 1)} messages (N-1 counts of 8 bytes, "
                          f"then each token once, to its expert's rank only, no padding)",
                    algorithm="the dispatch", chapter=self.chapter)


PARALLEL_B_CHECKS = {"tensor_parallel_mlp": TensorParallelMLP(), "moe_dispatch": MoeDispatch()}


class RingAttention:
    chapter = "chapter 20 (tutorials/20_context_parallelism.md)"

    def cases(self, n, quick):
        cases = [dict(rows=2, dim=3)]
        if not quick:
            cases.append(dict(rows=1, dim=1))
        cases.append(dict(rows=3, dim=4))
        # scores in the thousands: exp(s) overflows float64 (past 709) unless the running maximum is
        # subtracted first, so an online softmax without it returns nan where the right one is exact
        cases.append(dict(rows=3, dim=4, scale=60))
        cases.append(dict(rows=64, dim=32))        # 16 KiB per chunk: traffic is judged
        for salt, case in enumerate(cases):
            case["salt"] = salt
        return cases

    def label(self, case):
        text = f"q, k, v float64[{case['rows']}, {case['dim']}] per rank (S = {case['rows']} x N positions)"
        if "scale" in case:
            text += f", entries scaled by {case['scale']} so the scores reach the thousands"
        return text

    def whole(self, case, n):
        """Q, K, V of the whole sequence; scaled by 3 (or the case's scale) so that the row maxima change
        from chunk to chunk."""
        g = torch.Generator().manual_seed(case["salt"])
        scale = case.get("scale", 3)
        return [scale * torch.randn(n * case["rows"], case["dim"], generator=g, dtype=torch.float64)
                for _ in range(3)]

    @staticmethod
    def unrescaled(q, ks, vs):
        """What an online softmax that never rescales returns, visiting the chunks in this order."""
        m = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype)
        l, o = torch.zeros_like(m), torch.zeros_like(q)
        for k, v in zip(ks, vs):
            m = torch.maximum(m, (q @ k.T / math.sqrt(q.shape[-1])).amax(-1))
            p = torch.exp(q @ k.T / math.sqrt(q.shape[-1]) - m.unsqueeze(-1))
            l, o = l + p.sum(-1), o + p @ v
        return o / l.unsqueeze(-1)

    def run(self, fn, case, rank, n):
        q_all, k_all, v_all = self.whole(case, n)
        qs, ks, vs = (t.split(case["rows"]) for t in (q_all, k_all, v_all))
        expected = torch.softmax(qs[rank] @ k_all.T / math.sqrt(case["dim"]), -1) @ v_all
        mine = [qs[rank].clone(), ks[rank].clone(), vs[rank].clone()]
        out = fn(*mine)
        report = compare([("out", expected, out)])
        untouched(report, [(what, before, now) for what, before, now in zip("qkv", (qs[rank], ks[rank], vs[rank]),
                                                                             mine)])
        if not report["ok"] and n > 1 and isinstance(out, torch.Tensor) and out.shape == expected.shape:
            for order in ([(rank - s) % n for s in range(n)], [(rank + s) % n for s in range(n)]):
                if torch.allclose(out, self.unrescaled(qs[rank], [ks[j] for j in order], [vs[j] for j in order]),
                                  rtol=1e-9, atol=1e-12):
                    report["lines"].append("(this is the online softmax without its rescale: when a chunk raises "
                                           "a row's maximum from m to m_new, multiply the running sum l and output "
                                           "o by exp(m - m_new) before adding the new chunk's terms)")
                    break
        return report

    def need(self, case, n):
        if case["rows"] * case["dim"] < 1000 or n == 1:
            return None
        c = case["rows"] * case["dim"] * E
        return Need(sent_bytes=2 * (n - 1) * c, sent_messages=2 * (n - 1),
                    ideal=f"2(N-1) x S/N x d x 8 = {2 * (n - 1) * c} bytes in at most 2(N-1) = {2 * (n - 1)} "
                          f"messages (N-1 key chunks and N-1 value chunks, {c} bytes each; the queries stay)",
                    algorithm="ring attention", chapter=self.chapter)


PARALLEL_B_CHECKS["ring_attention"] = RingAttention()   # chapter 20
