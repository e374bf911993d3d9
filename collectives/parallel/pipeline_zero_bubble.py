"""Zero-bubble pipeline (ZB-H1): the backward split in two, and the half nobody waits for
moved into the bubble.

Semantics. A stage's backward does two things: the gradient with respect to its input
(``B``: the previous stage is waiting for it) and the gradients with respect to its
weights (``W``: nobody waits for them until the optimizer step). 1F1B runs them together,
so the gradient travels back through p stages at t_b + t_w each. ZB-H1 sends it back
after B alone and runs W later, in the time a stage would otherwise sit idle. Same
messages as 1F1B, same result: every stage runs its W's in micro-batch order, so the
parameters after a step are bitwise those of one process.

Steps, stage s of p, m micro-batches (m >= p for the full gain):

1. Warm up with ``min(p - s - 1, m)`` forwards, as 1F1B.
2. Steady: ``F`` of the next micro-batch, ``B`` of the oldest; after each ``B`` run the
   oldest pending ``W``s until at most s are pending (stage s defers s W's: the
   later the stage, the more of the drain it fills).
3. Drain: the remaining ``B``s, each followed by ``W``s down to s pending; then the
   last s ``W``s.

Worked example, p = 4, m = 8, unit times (one slot each for F, B and W); "." is idle::

    s0  F0 F1 F2 F3  .  .  . B0 W0 F4 B1 W1 F5 B2 W2 F6 B3 W3 F7 B4 W4 B5 W5 B6 W6 B7 W7
    s1   . F0 F1 F2  .  . B0 F3 B1 W0 F4 B2 W1 F5 B3 W2 F6 B4 W3 F7 B5 W4 B6 W5 B7 W6 W7
    s2   .  . F0 F1  . B0 F2 B1 F3 B2 W0 F4 B3 W1 F5 B4 W2 F6 B5 W3 F7 B6 W4 B7 W5 W6 W7
    s3   .  .  . F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 F6 B6 W3 F7 B7 W4 W5 W6 W7

27 slots where 1F1B (B and W together) takes 33 (:func:`makespan` computes both).

Cost. A step takes m(t_f + t_b + t_w) + (p - 1)(t_f + t_b - t_w): the ramp is paid in
t_f + t_b (the gradient no longer waits for W), less the t_w each stage fills with
deferred W's. The bubble is therefore (p-1)(t_f+t_b-t_w) / (m(t_f+t_b+t_w) +
(p-1)(t_f+t_b-t_w)) (:func:`bubble_fraction`), (p-1)/(3m+p-1) when the three are
equal, against 1F1B's 3(p-1)/(3m+3(p-1)) = (p-1)/(m+p-1). A stage holds at most p
micro-batches' activations, like 1F1B's first stage (a pending W keeps its stage's
input and output gradient). Messages: those of 1F1B (:func:`collectives.parallel.pipeline`).
Before them, the step's check (:func:`collectives.parallel.pipeline.check_step`: 16 bytes
to each neighbour, a bad step refused on every stage alike). Here ``W`` re-walks the
stage's autograd graph for the weights (``torch.autograd.backward``
with ``inputs=`` the parameters), so a stage of several layers recomputes the
intermediate input-gradients once more; a stage of one layer pays nothing extra.

Reference: P. Qi, X. Wan, G. Huang, M. Lin, "Zero Bubble Pipeline Parallelism",
ICLR 2024 (the ZB-H1 schedule, figure 3).
"""
import time

import torch
import torch.distributed as dist

from .. import p2p_api
from .pipeline import GRADIENT, PipelineStage, check_step


def zb_h1(p, m, s):
    """Stage ``s``'s order of work: ``("F" | "B" | "W", micro-batch)``, s W's kept pending."""
    warmup = min(p - s - 1, m)
    ops, pending = [("F", i) for i in range(warmup)], []
    for i in range(m):
        if i + warmup < m:
            ops.append(("F", i + warmup))
        ops.append(("B", i))
        pending.append(i)
        while len(pending) > s:
            ops.append(("W", pending.pop(0)))
    return ops + [("W", i) for i in pending]


def makespan(orders, t_f=1.0, t_b=1.0, t_w=1.0):
    """The step time of per-stage ``orders`` with free messages, and each stage's idle fraction.

    An order's ops are ("F", i), ("B", i), ("W", i), or ("BW", i) (B and W together, as
    1F1B runs them). F i needs F i on the previous stage; B i needs B i on the next
    (the last stage: its own F i); W i needs its own B i.
    """
    p = len(orders)
    done, clock, busy, at = {}, [0.0] * p, [0.0] * p, [0] * p
    took = {"F": t_f, "B": t_b, "W": t_w, "BW": t_b + t_w}
    moved = True
    while moved:
        moved = False
        for s in range(p):
            while at[s] < len(orders[s]):
                kind, i = orders[s][at[s]]
                if kind == "F":
                    need = (s - 1, "F", i) if s else None
                elif kind in ("B", "BW"):
                    need = (s + 1, "B", i) if s < p - 1 else (s, "F", i)
                else:
                    need = (s, "B", i)
                if need is not None and need not in done:
                    break
                clock[s] = max(clock[s], done[need] if need else 0.0) + took[kind]
                busy[s] += took[kind]
                done[s, kind[0], i] = clock[s]
                at[s] += 1
                moved = True
    if any(at[s] < len(orders[s]) for s in range(p)):
        raise ValueError("makespan: the orders wait on each other (deadlock)")
    total = max(clock)
    return total, [1 - b / total for b in busy]


def bubble_fraction(p, m, t_f=1.0, t_b=1.0, t_w=1.0):
    """ZB-H1's idle fraction for m >= p: (p-1)(t_f+t_b-t_w) / (m(t_f+t_b+t_w) + (p-1)(t_f+t_b-t_w))."""
    ramp = (p - 1) * (t_f + t_b - t_w)
    return ramp / (m * (t_f + t_b + t_w) + ramp)


class ZeroBubbleStage(PipelineStage):
    """This rank's stage of a ZB-H1 pipeline: the arguments of :class:`~collectives.parallel.pipeline.PipelineStage`,
    and its forward; only the order of work and the split backward are its own.

    Example::

        >>> stage = ZeroBubbleStage(layers_of_stage[rank], recv_shape=(8, 64))
        >>> loss = stage.step(m, micro_batches if rank == 0 else None,
        ...                   targets if rank == p - 1 else None, loss_fn)
        >>> optimizer.step()
    """

    def step(self, m, micro_batches=None, targets=None, loss_fn=None):
        """Forward, input-gradient and weight-gradient passes of every micro-batch, in ZB-H1's order.

        Args and Returns as :meth:`collectives.parallel.pipeline.PipelineStage.step`. On the
        first stage ``B`` computes the input's gradient only if the input requires one.
        """
        check_step(self, "ZeroBubbleStage.step", m, micro_batches, targets, loss_fn)
        self.spans, self.peak_held = [], 0
        me = dist.get_rank()
        weights = [q for q in self.module.parameters() if q.requires_grad]
        held, grads, sends, total = {}, {}, [], 0.0
        for kind, i in zb_h1(self.num_stages, m, self.stage):
            start = time.time()
            if kind == "F":
                x, y, loss = self.forward(i, m, micro_batches, targets, loss_fn, sends)
                total += loss
                held[i] = (x, y)
                self.peak_held = max(self.peak_held, len(held))
            elif kind == "B":
                x, y = held[i]
                dy = None
                if not self.last:
                    dy = torch.empty_like(y)
                    p2p_api.recv(dy, self.next, self.group, tag=GRADIENT)
                    start = time.time()
                grads[i] = dy
                if x.requires_grad:
                    # the graph is kept for W; only x's gradient is computed now
                    dx, = torch.autograd.grad(y, x, dy, retain_graph=bool(weights))
                    if not self.first:
                        sends.append(p2p_api.isend(dx, self.prev, self.group, tag=GRADIENT))
            else:
                x, y = held.pop(i)
                if weights:
                    torch.autograd.backward(y, grads.pop(i), inputs=weights)
                else:
                    grads.pop(i)
            if kind != "F":                  # the forward keeps its own span
                self.spans.append((me, f"{kind}{i}", start, time.time()))
            sends = [work for work in sends if not (work.is_completed() and work.wait())]
        for work in sends:
            work.wait()
        return total if self.last else None
