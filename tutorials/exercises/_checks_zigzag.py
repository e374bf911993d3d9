"""Check of the zig-zag ring attention exercise of chapter 20 (registered in ``_checks.CHECKS``).

The learner writes the causal forward of one rank that holds chunks r and 2N-1-r of 2N
(``collectives/parallel/ring_attention_zigzag.py`` is the library's, switched off while
grading). A right answer is not enough here: zig-zag exists for its balance, every rank
computing the same 2N + 1 blocks of c x c scores (c = S/2N). A solution that computes the
fully masked blocks too (and masks them) returns the same numbers for about twice the work,
so the grader measures the work: every matrix product the solution calls (``@``,
``torch.matmul``, ``mm``, ``bmm``, ``einsum``, ``scaled_dot_product_attention``) is counted,
in multiply-adds, by a torch-function mode (:class:`Watch`) around the call, and compared with
2N + 1 blocks of 2 c^2 d (one c x c x d product for the scores, one for ``p @ v``). The same
mode keeps weak references to the tensors the solution makes, and at every product counts the
other ranks whose keys or values it holds: the ring holds two at most (the chunk in use and the
one arriving), a solution that collects every chunk first holds N - 1.
"""
import math
import weakref

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from tutorials.exercises import _common

E = 8   # float64


def part(x, n, r):
    """Rank r's zig-zag part of a whole sequence (rows): chunk r, then chunk 2n-1-r, of 2n."""
    chunks = x.chunk(2 * n)
    return torch.cat([chunks[r], chunks[2 * n - 1 - r]])


def causal_attention(q, k, v):
    """One process's causal attention over the whole sequence: position i sees keys 0..i."""
    s = q @ k.T / math.sqrt(q.shape[-1])
    future = torch.ones(s.shape, dtype=torch.bool).triu(1)
    return torch.softmax(s.masked_fill(future, float("-inf")), -1) @ v


def _macs(func, args, kwargs):
    """Multiply-adds of one matrix product, or 0 for any other torch function."""
    name = getattr(func, "__name__", "")
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if name in ("matmul", "__matmul__", "__rmatmul__", "mm", "bmm") and len(tensors) >= 2:
        a, b = (tensors[1], tensors[0]) if name == "__rmatmul__" else tensors[:2]
        m = a.shape[-2] if a.dim() > 1 else 1
        n = b.shape[-1] if b.dim() > 1 else 1
        batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]) if a.dim() > 2 or b.dim() > 2 else ()
        return math.prod(batch) * m * a.shape[-1] * n
    if name in ("addmm", "baddbmm", "addbmm") and len(tensors) >= 3:
        return _macs(torch.matmul, tensors[1:3], {})
    if name == "linear" and len(tensors) >= 2:
        return tensors[0].numel() * tensors[1].shape[0]
    if name == "einsum" and args and isinstance(args[0], str):
        operands = tensors if len(tensors) > 1 else list(args[1]) if len(args) > 1 else []
        if len(operands) < 2:
            return 0
        sizes = {}
        for letters, t in zip(args[0].split("->")[0].replace(" ", "").split(","), operands):
            sizes.update(zip(letters.replace("...", ""), t.shape[-len(letters.replace("...", "")):]))
        return math.prod(sizes.values())
    if name == "scaled_dot_product_attention" and len(tensors) >= 3:
        q, k, v = tensors[:3]
        return math.prod(q.shape[:-1]) * k.shape[-2] * (q.shape[-1] + v.shape[-1])
    return 0


class Watch(TorchFunctionMode):
    """While the learner's function runs: the multiply-adds of its matrix products, and at each
    product, how many other ranks' keys or values are alive in tensors it made.

    Args:
        chunks (list): ``chunks[i]`` = (K, V) of chunk i of the 2N, each ``(c, d)``.
        rank, n (int): This rank and the world's size (chunk i belongs to rank min(i, 2N-1-i)).
    """

    def __init__(self, chunks, rank, n):
        super().__init__()
        self.rank, self.n, self.macs, self.peak = rank, n, 0, 0
        self.made = []
        self.patterns = [t.flatten() for kv in chunks for t in kv]        # 2 per chunk: K, V
        self.owner = [min(i, 2 * n - 1 - i) for i in range(2 * n) for _ in (0, 1)]
        self.size = self.patterns[0].numel() if self.patterns else 0
        self.firsts = torch.stack([p[0] for p in self.patterns]) if self.size else None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        macs = _macs(func, args, kwargs)
        if macs:
            self.macs += macs
            if self.n > 2 and self.size:
                self.peak = max(self.peak, len(self.held()))
        out = func(*args, **kwargs)
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.dtype == torch.float64 and t.numel() >= self.size > 0:
                self.made.append(weakref.ref(t))
        return out

    def held(self):
        """The other ranks whose key or value chunk sits, whole, in a tensor the solution made."""
        self.made = [r for r in self.made if r() is not None]
        owners, seen = set(), set()
        for t in (r() for r in self.made):
            if t is None:
                continue
            storage = t.untyped_storage()
            if storage.data_ptr() in seen or storage.nbytes() < self.size * E:
                continue
            seen.add(storage.data_ptr())
            flat = torch.empty(0, dtype=torch.float64).set_(storage, 0, (storage.nbytes() // E,))
            for at in torch.isin(flat, self.firsts).nonzero().flatten().tolist():
                if at + self.size > flat.numel():
                    continue
                for i in (self.firsts == flat[at]).nonzero().flatten().tolist():
                    if self.owner[i] != self.rank and torch.equal(flat[at:at + self.size], self.patterns[i]):
                        owners.add(self.owner[i])
        return owners


class RingAttentionZigzag:
    chapter = "chapter 20 (tutorials/20_context_parallelism.md)"

    def cases(self, n, quick):
        cases = [dict(rows=1, dim=3), dict(rows=2, dim=4)]       # rows = c: one position per chunk first
        if not quick:
            cases.append(dict(rows=3, dim=1))
        # scores in the thousands: exp overflows float64 unless the running maximum is subtracted
        cases.append(dict(rows=3, dim=4, scale=60))
        cases.append(dict(rows=16, dim=32))       # 8 KiB of keys per rank: traffic is judged
        for salt, case in enumerate(cases):
            case["salt"] = salt
        return cases

    def label(self, case):
        c, d = case["rows"], case["dim"]
        text = (f"q, k, v float64[2c = {2 * c}, {d}] per rank: chunks r and 2N-1-r of 2N, c = {c} "
                f"(S = 2N x {c} positions)")
        if "scale" in case:
            text += f", entries scaled by {case['scale']} so the scores reach the thousands"
        return text

    def whole(self, case, n):
        g = torch.Generator().manual_seed(case["salt"])
        return [case.get("scale", 3) * torch.randn(2 * n * case["rows"], case["dim"], generator=g,
                                                   dtype=torch.float64) for _ in range(3)]

    def run(self, fn, case, rank, n):
        c, d = case["rows"], case["dim"]
        q_all, k_all, v_all = self.whole(case, n)
        expected = part(causal_attention(q_all, k_all, v_all), n, rank)
        given = [part(t, n, rank) for t in (q_all, k_all, v_all)]
        mine = [t.clone() for t in given]
        watch = Watch(list(zip(k_all.split(c), v_all.split(c))), rank, n)
        with watch:
            out = fn(*mine)
        report = _common.compare([("out", expected, out)])
        if not report["ok"] and isinstance(out, torch.Tensor) and out.shape == expected.shape:
            report["lines"] += self.diagnose(out, expected, (q_all, k_all, v_all), rank, n, c)
        _common.untouched(report, [(what, before, now) for what, before, now in zip("qkv", given, mine)])
        if not report["ok"]:
            return report
        blocks = watch.macs / (2 * c * c * d)
        report["blocks"] = blocks
        if blocks > 2 * n + 1:
            report["work"] = (f"rank {rank} computed {blocks:g} blocks' worth of attention products (one "
                              f"block: c x c scores and their p @ v, 2 c^2 d = {2 * c * c * d} multiply-adds, "
                              f"counted in every matrix product it called) where zig-zag computes "
                              f"2N + 1 = {2 * n + 1} on every rank ({self.label(case)}, {n} ranks). A block "
                              f"whose key chunk comes after its query chunk is entirely in the future: skip "
                              f"it, do not compute it and mask it. Holding rank j's chunks, rank r needs two "
                              f"blocks (three at its own stop, two of them diagonals, masked): computing all "
                              f"four everywhere gives the same numbers for 4N / (2N + 1) = "
                              f"{4 * n / (2 * n + 1):.2f} times the work, the imbalance zig-zag removes.")
        elif n > 1 and blocks < (2 * n + 1) / 2:
            # the bound above is only as good as the count: work done outside matrix products
            # (elementwise products and sums) is invisible to it, so it must not pass unseen
            report["work"] = (f"rank {rank} computed {blocks:g} blocks' worth of matrix products where "
                              f"zig-zag computes 2N + 1 = {2 * n + 1} per rank ({self.label(case)}, {n} "
                              f"ranks): the grader measures the work through the matrix products (@, "
                              f"torch.matmul, mm, bmm, einsum, scaled_dot_product_attention), so compute "
                              f"the scores q @ k.T and the outputs p @ v with them, not with elementwise "
                              f"products and sums.")
        if watch.peak > 2:
            report["schedule"] = (f"rank {rank} held the keys or values of {watch.peak} other ranks at once "
                                  f"({n} ranks, {self.label(case)}); the ring holds at most two: the chunk "
                                  f"it computes with and the one arriving. Fold each chunk into the online "
                                  f"softmax at its stop, pass it on and let it go, rather than collecting "
                                  f"every chunk first (that is a gather: memory growing with N).")
        return report

    @staticmethod
    def diagnose(out, expected, whole, rank, n, c):
        """Name a recognisable mistake: which of the two query chunks is wrong, and whether the output
        is the attention without the mask, or of the contiguous layout."""
        lines = []
        q_all, k_all, v_all = whole
        close = lambda a, b: torch.allclose(a, b, rtol=1e-9, atol=1e-9)     # noqa: E731
        if n > 1:
            seq = [torch.cat([part(t, n, j) for j in range(n)]) for t in whole]   # the parts in rank order
            contiguous = causal_attention(*seq).split(2 * c)[rank]
            if close(out, contiguous):
                lines.append(f"(this is causal attention as if rank r held positions 2cr to 2c(r+1) - 1, the "
                             f"contiguous layout; here rank {rank} holds chunks {rank} and {2 * n - 1 - rank} "
                             f"of 2N = {2 * n}, positions {rank * c} to {(rank + 1) * c - 1} and "
                             f"{(2 * n - 1 - rank) * c} to {(2 * n - rank) * c - 1}: queries and keys alike)")
                return lines
        s = q_all @ k_all.T / math.sqrt(q_all.shape[-1])
        if close(out, part(torch.softmax(s, -1) @ v_all, n, rank)):
            lines.append("(this is attention without the causal mask: every query saw the keys after it)")
            return lines
        halves = [close(o, e) for o, e in zip(out.split(c), expected.split(c))]
        if any(halves) and not all(halves):
            good, bad = (rank, 2 * n - 1 - rank) if halves[0] else (2 * n - 1 - rank, rank)
            lines.append(f"(the rows of chunk {good}'s queries (positions {good * c} to {(good + 1) * c - 1}) are "
                         f"right, those of chunk {bad} (positions {bad * c} to {(bad + 1) * c - 1}) wrong: check "
                         f"which key chunks chunk {bad}'s queries skip (later ones), mask (chunk {bad} itself) "
                         f"and attend in full (earlier ones), and that rank r's second chunk is 2N-1-r)")
        return lines

    def need(self, case, n):
        kv = 2 * case["rows"] * case["dim"] * E
        if kv < 1000 * E or n == 1:
            return None
        return _common.Need(sent_bytes=2 * (n - 1) * kv, sent_messages=2 * (n - 1),
                    ideal=f"2(N-1) x 2c x d x 8 = {2 * (n - 1) * kv} bytes in at most 2(N-1) = {2 * (n - 1)} "
                          f"messages (N-1 key chunks and N-1 value chunks of both halves, {kv} bytes each; the "
                          f"queries stay)", algorithm="zig-zag ring attention", chapter=self.chapter)


CHECKS = {"ring_attention_zigzag": RingAttentionZigzag()}
