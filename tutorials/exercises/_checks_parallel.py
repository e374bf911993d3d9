"""Checks of the parallelism exercises of chapters 16 and 18 (registered in ``_checks.CHECKS``).

``pipeline_1f1b``: the learner writes one stage's 1F1B schedule and its messages. The
stage's arithmetic is given (:class:`Stage`: ``forward(i, x)`` and ``backward(i, grad)``
of one Linear + Tanh), so every rank can compute, locally, what every message must
hold and what the gradients must be. Graded on: the result (the stage's gradients);
the order of messages (each forward and backward must be handed the activation or
gradient of *its* micro-batch: messages between two ranks arrive in the order they
were sent); deadlock (the grader's); the order of work (1F1B's, exactly); and the
activations held at once (at most p - s on stage s, which is 1F1B's point).

``fsdp_step``: the learner writes one forward and backward of a fully sharded model
from its pieces. Graded on the gradient pieces, the traffic (two all-gathers and one
reduce-scatter per layer at most) and the full parameter vectors alive at once (at
most two: the layer computing and one prefetched).
"""
import math
import weakref

import torch

from collectives.parallel.pipeline import one_f_one_b
from tutorials.exercises import _common, _watch

WIDTH = 6


def _warm_autograd():
    """Run one tiny backward. A process's first backward starts autograd's engine, which
    took 1.5-3.5 s on a busy machine: done here, in ``cases()`` (before a rank reports
    ready), it is not mistaken for a rank that stopped making progress."""
    x = torch.ones(1, requires_grad=True)
    (x * 2).sum().backward()


def _progress(text):
    """Tell the grader this rank is busy in the stage's or the layers' own arithmetic (a
    busy machine can take seconds over it), so it is not taken for a rank that stopped."""
    _watch.set_status(text)


def _layer(stage, case):
    """Stage ``stage``'s Linear(W, W) weights and bias, float64, the same on every rank."""
    g = torch.Generator().manual_seed(1000 * case["salt"] + stage)
    return (torch.randn(WIDTH, WIDTH, generator=g, dtype=torch.float64) / 2,
            torch.randn(WIDTH, generator=g, dtype=torch.float64) / 2)


def _micro_batch(i, case):
    g = torch.Generator().manual_seed(10_000 + 1000 * case["salt"] + i)
    return (torch.randn(case["rows"], WIDTH, generator=g, dtype=torch.float64),
            torch.randn(case["rows"], WIDTH, generator=g, dtype=torch.float64))


def _stage_forward(weight, bias, x):
    return torch.tanh(x @ weight.t() + bias)


def _loss(y, target, m):
    return (y - target).pow(2).mean() / m


class Stage:
    """One pipeline stage as the learner sees it: arithmetic given, messages and order theirs.

    Attributes:
        rank (int): This stage, s (also its rank in the world).
        size (int): The number of stages, p.
        prev, next (int or None): The ranks of the previous and next stages (None at the ends).
    """

    def __init__(self, rank, p, m, case):
        self.rank, self.size, self.m, self.case = rank, p, m, case
        self.prev = rank - 1 if rank > 0 else None
        self.next = rank + 1 if rank < p - 1 else None
        self.weight, self.bias = (t.requires_grad_() for t in _layer(rank, case))
        self.work, self.held, self.peak, self.problems = [], {}, 0, []
        self.posted_peak = 0       # of the peak: activations in receive buffers not yet handed to forward
        self.used = set()          # storages of the activations handed to forward
        # What every message must hold: the whole pipeline, one micro-batch at a time, here.
        self.inputs, self.grads_in, self.upstream = [], [], []
        layers = [_layer(s, case) for s in range(p)]
        for i in range(m):
            _progress(f"(grader) computing what micro-batch {i}'s messages must hold")
            x, target = _micro_batch(i, case)
            xs, ys = [x.requires_grad_()], []        # each stage's input (a leaf) and output
            for w, b in layers:
                ys.append(_stage_forward(w, b, xs[-1]))
                xs.append(ys[-1].detach().requires_grad_())
            _loss(ys[-1], target, m).backward()
            for s in range(p - 2, -1, -1):          # the gradients back, stage by stage
                torch.autograd.backward(ys[s], xs[s + 1].grad)
            self.inputs.append(xs[rank].detach())
            self.upstream.append(xs[rank - 1].detach() if rank > 0 else None)   # the previous stage's input
            self.grads_in.append(xs[rank + 1].grad if rank < p - 1 else None)

    def empty(self):
        """A tensor shaped like one micro-batch's activation (and its gradient): to receive into."""
        return torch.empty(self.case["rows"], WIDTH, dtype=torch.float64)

    def _match(self, what, i, got, expected):
        if not isinstance(got, torch.Tensor) or got.shape != expected[i].shape:
            self.problems.append(f"stage {self.rank}: {what}({i}, ...) was given "
                                 f"{type(got).__name__ if not isinstance(got, torch.Tensor) else list(got.shape)}, "
                                 f"not a tensor of shape {list(expected[i].shape)} (use stage.empty())")
            return False
        if not torch.equal(got, expected[i]):
            other = [j for j, e in enumerate(expected) if e is not None and torch.equal(got, e)]
            passed_on = [j for j, e in enumerate(self.upstream) if what == "forward" and e is not None
                         and torch.equal(got, e)]
            if passed_on and not other:
                self.problems.append(f"stage {self.rank}: forward({i}, ...) was given micro-batch {passed_on[0]}'s "
                                     f"input to the previous stage, not its output: send on the y that "
                                     f"stage.forward returns, not the x it was given")
                return False
            source = "the previous stage" if what == "forward" else "the next stage"
            said = (f"micro-batch {other[0]}'s" if other else
                    "a tensor that is no micro-batch's (a buffer not yet received into, or reused)")
            self.problems.append(f"stage {self.rank}: {what}({i}, ...) was given {said} "
                                 f"{'activation' if what == 'forward' else 'gradient'} from {source}. Messages "
                                 f"from one rank arrive in the order they were sent: send micro-batches "
                                 f"in the order the receiver expects them, and receive before you compute")
            return False
        return True

    def forward(self, i, x=None):
        """Forward of micro-batch ``i``; ``x`` is what the previous stage sent (None on the first).

        Returns the activation to send to the next stage (None on the last stage).
        """
        self.work.append(("F", i))
        _progress(f"in stage.forward({i})")
        if self.prev is None:
            x = _micro_batch(i, self.case)[0]
        elif not self._match("forward", i, x, self.inputs):
            x = self.inputs[i]
        if self.prev is not None:
            self.used.add(x.untyped_storage().data_ptr())
        x = x.detach().clone().requires_grad_()
        y = _stage_forward(self.weight, self.bias, x)
        if self.next is None:
            y = _loss(y, _micro_batch(i, self.case)[1], self.m)
        self.held[i] = (x, y)
        posted = self._posted()
        if len(self.held) + posted > self.peak:
            self.peak, self.posted_peak = len(self.held) + posted, posted
        return None if self.next is None else y.detach()

    def _posted(self):
        """Activations this stage holds in receive buffers from the previous stage that no forward
        has used yet: a receive posted early holds its buffer from the moment it is posted."""
        if self.prev is None:
            return 0
        one = self.case["rows"] * WIDTH * 8
        held, seen = 0, set(self.used)
        for buffer in _watch.COUNTERS.receive_buffers(self.prev):
            storage = buffer.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                held += max(1, storage.nbytes() // one)
        return held

    def backward(self, i, grad=None):
        """Backward of micro-batch ``i``; ``grad`` is what the next stage sent (None on the last).

        Returns the gradient to send to the previous stage (None on the first stage).
        """
        self.work.append(("B", i))
        _progress(f"in stage.backward({i})")
        if i not in self.held:
            self.problems.append(f"stage {self.rank}: backward({i}) before forward({i}), or twice")
            return None if self.prev is None else self.empty().zero_()
        x, y = self.held.pop(i)
        if self.next is not None and not self._match("backward", i, grad, self.grads_in):
            grad = self.grads_in[i]
        torch.autograd.backward(y, grad)
        return None if self.prev is None else x.grad.detach()


class Pipeline1F1B:
    chapter = "chapter 16 (tutorials/16_pipeline_parallelism.md)"

    def cases(self, n, quick):
        _warm_autograd()
        ms = (1, n + 1) if quick else (1, max(n - 1, 1), 2 * n + 1)
        return [dict(m=m, rows=3, salt=salt) for salt, m in enumerate(dict.fromkeys(ms))]

    def label(self, case):
        return (f"{case['m']} micro-batch{'es' if case['m'] > 1 else ''} of {case['rows']}x{WIDTH} float64 "
                f"activations, one stage per rank")

    def run(self, fn, case, rank, n):
        m = case["m"]
        stage = Stage(rank, n, m, case)
        fn(stage, m)
        lines = list(stage.problems[:2])
        for kind in ("F", "B"):
            done = sorted(i for k, i in stage.work if k == kind)
            if done != list(range(m)):
                lines.append(f"stage {rank} ran {'forward' if kind == 'F' else 'backward'} of micro-batches "
                             f"{done}; every micro-batch 0..{m - 1} needs exactly one")
        if lines:
            return {"ok": False, "lines": lines}
        weight, bias = self.reference(rank, n, case)
        expected = [(f"stage {rank}: weight.grad", weight, stage.weight.grad),
                    (f"stage {rank}: bias.grad", bias, stage.bias.grad)]
        report = _common.compare([(what, e, g if g is not None else torch.zeros_like(e)) for what, e, g in expected])
        if not report["ok"]:
            return report
        want = one_f_one_b(n, m, rank)
        if stage.peak > n - rank:
            posted = ""
            if stage.posted_peak:
                posted = (f"; {stage.posted_peak} of them in receive buffers posted before their forward: a "
                          f"posted receive holds its buffer until it is used, so post each activation's "
                          f"receive when its forward is next")
            report["schedule"] = (f"stage {rank} held the activations of {stage.peak} micro-batches at once "
                                  f"({m} micro-batches, {n} stages{posted}); 1F1B holds at most p - s = {n - rank}: "
                                  f"after min(p - s - 1, m) warm-up forwards, run one backward after each "
                                  f"forward, so each backward frees what its forward kept.")
        elif stage.work != want:
            at = next(j for j, (a, b) in enumerate(zip(stage.work + [None] * len(want), want)) if a != b)
            report["schedule"] = (f"stage {rank} of {n} ran {_ops(stage.work)}; 1F1B runs {_ops(want)} "
                                  f"(they differ at step {at + 1}): min(p - s - 1, m) = "
                                  f"{min(n - rank - 1, m)} warm-up forwards, then one forward and one "
                                  f"backward in turn, then the remaining backwards.")
        return report

    def reference(self, rank, n, case):
        stage = Stage(rank, n, case["m"], case)    # its own arithmetic, in micro-batch order
        for i in range(case["m"]):
            stage.forward(i, stage.inputs[i] if rank > 0 else None)
            stage.backward(i, stage.grads_in[i])
        return stage.weight.grad, stage.bias.grad

    def need(self, case, n):
        if n == 1:
            return None
        a = case["rows"] * WIDTH * 8
        m = case["m"]
        return _common.Need(sent_bytes=2 * m * a, sent_messages=2 * m,
                    ideal=f"at most 2m = {2 * m} messages of A = {a} bytes (m activations forward, m gradients "
                          f"back)", algorithm="a pipeline stage", chapter=self.chapter)


def _ops(work):
    return " ".join(f"{k}{i}" for k, i in work) if len(work) <= 24 else \
        " ".join(f"{k}{i}" for k, i in work[:24]) + " ..."


# --- fsdp_step ------------------------------------------------------------------------------------

FSDP_LAYERS = [(5, 7), (7, 9), (9, 4), (4, 3)]      # (in, out) of each Linear, Tanh after all but the last


def _fsdp_weights(case):
    g = torch.Generator().manual_seed(case["salt"])
    return [torch.randn(o * i + o, generator=g, dtype=torch.float64) / 2 for i, o in FSDP_LAYERS]


def _fsdp_batch(rank, case):
    g = torch.Generator().manual_seed(100 + 10 * case["salt"] + rank)
    return (torch.randn(case["rows"], FSDP_LAYERS[0][0], generator=g, dtype=torch.float64),
            torch.randn(case["rows"], FSDP_LAYERS[-1][1], generator=g, dtype=torch.float64))


def _fsdp_loss(y, target):
    return (y - target).pow(2).mean()


class Layers(list):
    """``layers[i](flat, x)``: layer i computed with its full flat parameter vector ``flat``
    (at least its parameters' values; the padding after them is ignored). Counts the full
    vectors alive at once, as the grader's measure of parameter memory: those handed to a layer
    and still referenced (an autograd graph keeps them too), and, with ``made`` and ``full``,
    every tensor the solution made that holds a layer's full vector, handed over or not (a
    model gathered up front is alive at the first layer's forward)."""

    def __init__(self, made=None, full=None):
        self.alive, self.peak = [], 0
        self.made, self.full = made, full
        super().__init__(self._make(i) for i in range(len(FSDP_LAYERS)))

    def _gathered(self, flat):
        """How many layers' full vectors the solution's tensors hold now (one per storage and layer)."""
        if self.made is None:
            return 0
        self.made.paused = True
        try:
            held = set()
            for t in [flat, *self.made.alive()]:
                if t.dtype != torch.float64 or t.dim() != 1:
                    continue
                values = t.detach()
                for j, want in enumerate(self.full):
                    if values.numel() >= want.numel() and torch.equal(values[:want.numel()], want):
                        held.add((t.untyped_storage().data_ptr(), j))
            return len(held)
        finally:
            self.made.paused = False

    def _make(self, i):
        fan_in, fan_out = FSDP_LAYERS[i]

        def layer(flat, x):
            _progress(f"in layers[{i}]")
            base = flat._base if flat._base is not None else flat
            if not any(r() is base for r in self.alive):
                self.alive.append(weakref.ref(base))
            self.alive = [r for r in self.alive if r() is not None]
            self.peak = max(self.peak, len(self.alive), self._gathered(flat))
            weight = flat[:fan_out * fan_in].view(fan_out, fan_in)
            y = x @ weight.t() + flat[fan_out * fan_in:fan_out * fan_in + fan_out]
            return torch.tanh(y) if i < len(FSDP_LAYERS) - 1 else y
        return layer


class FsdpStep:
    chapter = "chapter 18 (tutorials/18_fully_sharded.md)"

    def cases(self, n, quick):
        _warm_autograd()
        cases = [dict(rows=4, salt=0)] if quick else [dict(rows=4, salt=0), dict(rows=1, salt=1)]
        return cases

    def label(self, case):
        numel = sum(i * o + o for i, o in FSDP_LAYERS)
        return f"{len(FSDP_LAYERS)} float64 layers ({numel} parameters), a batch of {case['rows']} per rank"

    def run(self, fn, case, rank, n):
        full = _fsdp_weights(case)
        pieces = [math.ceil(f.numel() / n) for f in full]
        padded = [torch.cat([f, f.new_zeros(k * n - f.numel())]) for f, k in zip(full, pieces)]
        shards = [p[rank * k:(rank + 1) * k].clone() for p, k in zip(padded, pieces)]
        made = _common.Allocations(keep=lambda t: t.dtype == torch.float64 and t.dim() == 1
                                     and t.numel() >= min(f.numel() for f in full))
        layers = Layers(made, full)
        x, target = _fsdp_batch(rank, case)
        handed = [[s.clone() for s in shards], x.clone(), target.clone()]
        with made:
            grads = fn(handed[0], layers, handed[1], handed[2], _fsdp_loss)
        _progress("(grader) computing the expected gradients")
        expected = self.reference(case, n, rank, pieces)
        if not isinstance(grads, (list, tuple)) or len(grads) != len(expected):
            return {"ok": False, "lines": [f"returned {type(grads).__name__}, not a list of {len(expected)} "
                                           f"gradient pieces (one per layer)"]}
        got = [g.detach() if isinstance(g, torch.Tensor) else torch.full_like(e, math.nan)
               for e, g in zip(expected, grads)]
        report = _common.compare([(f"grads[{i}]", e, g) for i, (e, g) in enumerate(zip(expected, got))])
        if report["ok"] and layers.peak > 2:
            report["schedule"] = (f"{layers.peak} layers' full parameter vectors were alive at once on rank "
                                  f"{rank}; a fully sharded model holds at most two (the layer computing and "
                                  f"the next one, prefetched). Gather a layer, use it, let it go (keeping an "
                                  f"autograd graph through it keeps it too): gather it again for its backward.")
        before = [(f"shards[{i}]", s, h) for i, (s, h) in enumerate(zip(shards, handed[0]))]
        return _common.untouched(report, before + [("x", x, handed[1]), ("target", target, handed[2])])

    def reference(self, case, n, rank, pieces):
        flats = [f.requires_grad_() for f in _fsdp_weights(case)]
        layers = Layers()
        xs, ts = zip(*[_fsdp_batch(r, case) for r in range(n)])
        y = torch.cat(xs)
        for layer, flat in zip(layers, flats):
            y = layer(flat, y)
        _fsdp_loss(y, torch.cat(ts)).backward()
        out = []
        for f, k in zip(flats, pieces):
            g = torch.cat([f.grad, f.grad.new_zeros(k * n - f.numel())])
            out.append(g[rank * k:(rank + 1) * k])
        return out

    def need(self, case, n):
        if n == 1:
            return None
        pieces = [math.ceil((i * o + o) / n) for i, o in FSDP_LAYERS]
        s = sum(pieces) * n * 8
        bound = 3 * (n - 1) * sum(pieces) * 8
        return _common.Need(sent_bytes=bound,
                    ideal=f"3(N-1)/N x S = {bound} bytes (S = {s} bytes of padded parameters: all-gather for "
                          f"forward, all-gather for backward, reduce-scatter of the gradients)",
                    algorithm="fully sharded data parallel with ring collectives", chapter=self.chapter)


CHECKS = {"pipeline_1f1b": Pipeline1F1B(), "fsdp_step": FsdpStep()}
