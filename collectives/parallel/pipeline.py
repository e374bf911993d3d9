"""Pipeline parallelism: the model's layers cut into stages, one stage per rank, and the
batch cut into micro-batches that flow through them.

What it teaches. Stage s holds only its own layers. A micro-batch's activation goes
forward from stage s to s+1 (one message), and its gradient comes back from s+1 to s
(one message): point-to-point messages between neighbours, nothing else. Each stage
runs, per micro-batch i, a forward ``F i`` and later a backward ``B i``; the order of
those on one stage is its *schedule*:

* **GPipe** (Huang et al., 2019): every forward, then every backward
  (``F0 F1 .. Fm-1 B0 B1 .. Bm-1``). Simple, but a stage holds the activations of all
  m micro-batches at once.
* **1F1B** (PipeDream-Flush, Narayanan et al., 2021; Megatron-LM's default): stage s
  runs ``w = min(p - s - 1, m)`` warm-up forwards, then alternates one forward and
  one backward, then drains the last w backwards. The same messages, the same
  result, but a stage never holds more than ``p - s`` micro-batches' activations.

Either way a stage waits at the start (the first micro-batch has not reached it)
and at the end (the last gradient has not come back): with every F taking t_f and
every B taking t_b on every stage, a step takes (m + p - 1)(t_f + t_b) of which each
stage computes m(t_f + t_b), so the idle fraction, the *bubble*, is
(p - 1) / (m + p - 1). More micro-batches shrink it; 1F1B does not (it saves memory).

Messages per step, per stage, for micro-batches whose activation at the boundary has
A bytes: stage s sends m activations forward (if s < p - 1) and m gradients back
(if s > 0), each A bytes, and receives as many: 2mA bytes sent by a middle stage, mA
by the first and the last. They go through :mod:`collectives.p2p_api`, the door's
point-to-point calls: counted, traced, tagged and bounded like every collective.

Before the first activation, one check (:func:`check_step`) walks the pipeline and back:
stage 0 sends stage 1 a header of 16 bytes (its m, and the length of its complaint,
if any), stage 1 adds its own complaint (m differs from stage 0's, too few targets, ...)
and sends it on, and the last stage sends the verdict back the same way. A bad step
(a batch of 10 cut into 3, 3, 3, 1: the next stage receives one shape) is then refused
on every stage with the same ValueError, whichever stage saw it, before any activation
moves; a complaint's words follow its header as one more message. Cost: one 16-byte
message to each neighbour (:func:`cost`), and 2(p - 1) small-message latencies before
stage 0's first forward.

Each stage's backward runs micro-batches in the order 0, 1, .., m-1 in both
schedules, so its gradients accumulate in the same order as one process running the
micro-batches one after another: the parameters after a step are bitwise equal.

References: Y. Huang et al., "GPipe", NeurIPS 2019; D. Narayanan et al., "Efficient
Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", SC 2021.
"""
import time

import torch
import torch.distributed as dist

from .. import api, p2p_api
from ..group import group_info


def gpipe(p, m, s):
    """Stage ``s``'s order of work in GPipe: ``[("F", 0), ..., ("F", m-1), ("B", 0), ..., ("B", m-1)]``."""
    return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]


def one_f_one_b(p, m, s):
    """Stage ``s``'s order of work in 1F1B: w = min(p-s-1, m) forwards, then F/B pairs, then w backwards."""
    warmup = min(p - s - 1, m)
    ops = [("F", i) for i in range(warmup)]
    for i in range(m - warmup):
        ops += [("F", warmup + i), ("B", i)]
    return ops + [("B", i) for i in range(m - warmup, m)]


SCHEDULES = {"gpipe": gpipe, "1f1b": one_f_one_b}
ACTIVATION, GRADIENT, CHECK = 0, 1, 2    # message tags (a trace's "step"): forward, backward, the check
HEADER_BYTES = 16                         # the check's header: stage 0's m, the complaint's length (int64)


def cost(p, m, s, activation_bytes):
    """Messages and bytes stage ``s`` of ``p`` sends in one step of ``m`` micro-batches (no complaint)."""
    neighbours = (s < p - 1) + (s > 0)
    return dict(messages=neighbours * (m + 1), bytes=neighbours * (m * activation_bytes + HEADER_BYTES))


def _complaint(stage, m, m0, micro_batches, targets, loss_fn):
    """What is wrong with this stage's part of a step, in words; None if nothing (``m0``: stage 0's m)."""
    s, p = stage.stage, stage.num_stages
    who = f"stage {s} (rank {stage.ranks[s]})"
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        return f"{who}: m={m!r} must be an int >= 1 (the number of micro-batches)"
    if s > 0 and m != m0:
        return f"{who} was given m={m} micro-batches where stage 0 was given m={m0}"
    if s == 0:
        if micro_batches is None or len(micro_batches) != m:
            got = "none" if micro_batches is None else len(micro_batches)
            return f"{who}: the first stage needs m={m} micro_batches, got {got}"
        shapes = [tuple(x.shape) for x in micro_batches]
        if len(set(shapes)) > 1:
            # the next stage receives every activation into one recv_shape: an unequal
            # micro-batch would wait there until the timeout
            return (f"{who}: micro-batches of unequal size {shapes}; every stage receives one shape, "
                    f"so split the batch into {m} equal micro-batches (a batch size divisible by m)")
    if s == p - 1 and (targets is None or len(targets) != m or loss_fn is None):
        got = "no" if targets is None else len(targets)
        return (f"{who}: the last stage needs m={m} targets and a loss_fn, got {got} targets"
                f"{'' if loss_fn is not None else ' and no loss_fn'}")
    return None


def check_step(stage, where, m, micro_batches, targets, loss_fn, problem=None):
    """Refuse a bad step on every stage alike, before any activation moves.

    Stage 0's header (its m, its complaint's length, then the complaint's words) goes
    down the pipeline, each stage adding its own complaint if none came, and the last
    stage's verdict comes back up the same way; every stage then raises the same
    ValueError, or none does. ``stage`` has ``stage``, ``num_stages``, ``ranks`` (global,
    in stage order) and ``group``; ``problem``: a complaint the caller found (a schedule's
    own rule, for an m that is an int >= 1), in words without the stage's name.
    """
    s, p, group = stage.stage, stage.num_stages, stage.group
    prev = stage.ranks[s - 1] if s > 0 else None
    nxt = stage.ranks[s + 1] if s < p - 1 else None

    def send(m0, words, to):
        text = words.encode()
        p2p_api.send(torch.tensor([m0, len(text)], dtype=torch.int64), to, group, tag=CHECK)
        if text:
            p2p_api.send(torch.tensor(list(text), dtype=torch.uint8), to, group, tag=CHECK)

    def recv(frm):
        header = torch.zeros(2, dtype=torch.int64)
        p2p_api.recv(header, frm, group, tag=CHECK)
        m0, length = header.tolist()
        if not length:
            return m0, ""
        text = torch.zeros(length, dtype=torch.uint8)
        p2p_api.recv(text, frm, group, tag=CHECK)
        return m0, bytes(text.tolist()).decode()

    m0, words = (m if isinstance(m, int) else -1), ""
    if prev is not None:
        m0, words = recv(prev)
    if not words:
        mine = _complaint(stage, m, m0, micro_batches, targets, loss_fn) or \
            (problem and f"stage {s} (rank {stage.ranks[s]}): {problem}")
        words = f"{where}: {mine}" if mine else ""
    if nxt is not None:
        send(m0, words, nxt)
        m0, words = recv(nxt)              # the last stage's verdict, on its way back
    if prev is not None:
        send(m0, words, prev)
    if words:
        raise ValueError(words)


def bubble_fraction(p, m):
    """The idle fraction of a pipeline of ``p`` stages and ``m`` micro-batches: (p-1)/(m+p-1)."""
    return (p - 1) / (m + p - 1)


def meet(group):
    """Every stage of ``group`` at once, before any activation moves: one barrier.

    Its point is the group's first collective: the group agrees (hosts, tables) and stages on
    one host set their shared memory up there, which a point-to-point message only takes once
    a collective has made it (:func:`collectives.p2p_communications.p2p_transport`). Without
    it a pipeline's activations and gradients would go over gloo for its whole life.
    """
    api.barrier(group)


class PipelineStage:
    """This rank's stage of a pipeline: its layers, and its neighbours in ``group``.

    Stage s is rank s of ``group`` (the world if None): it receives activations from
    stage s-1 and sends its output to stage s+1.

    Args:
        module (nn.Module): This stage's layers.
        recv_shape (tuple): Shape of one micro-batch's activation arriving from the
            previous stage (not needed on the first stage).
        group (ProcessGroup, optional): The stages, in order; None for the world. Every
            stage constructs its own at the same point: construction is collective (one
            barrier on ``group``, :func:`meet`).
        dtype (torch.dtype): dtype of the activations between stages.

    Example::

        >>> stage = PipelineStage(layers_of_stage[rank], recv_shape=(8, 64))
        >>> loss = stage.step(m, micro_batches if rank == 0 else None,
        ...                   targets if rank == p - 1 else None, loss_fn, schedule="1f1b")
        >>> optimizer.step()          # each stage updates its own layers
    """

    def __init__(self, module, recv_shape=None, group=None, dtype=torch.float32):
        info = group_info(group, type(self).__module__)
        self.module, self.group, self.dtype = module, group, dtype
        self.stage, self.num_stages, self.ranks = info.rank, info.size, info.ranks
        self.first, self.last = self.stage == 0, self.stage == self.num_stages - 1
        self.prev = None if self.first else info.ranks[self.stage - 1]     # global ranks
        self.next = None if self.last else info.ranks[self.stage + 1]
        if not self.first and recv_shape is None:
            raise ValueError(f"{type(self).__name__}: recv_shape (the activation's shape arriving from the "
                             f"previous stage) is required on every stage but the first")
        self.recv_shape = tuple(recv_shape) if recv_shape is not None else None
        self.spans = []          # (global rank, "F3", start, end) of the last step: for timelines
        self.peak_held = 0       # most micro-batches whose activations this stage held at once
        meet(group)              # every stage constructs its own: collective, like torch's

    def forward(self, i, m, micro_batches, targets, loss_fn, sends):
        """Micro-batch ``i``'s forward: its input (received, but on the first stage), this stage's
        layers, its loss / m on the last stage, its output sent on. Returns (input, output or
        loss, the loss as a float or 0.0); its span (from the input's arrival) goes to
        ``spans``, the send's handle to ``sends``."""
        if self.first:
            x = micro_batches[i]
        else:
            x = torch.empty(self.recv_shape, dtype=self.dtype)
            p2p_api.recv(x, self.prev, self.group, tag=ACTIVATION)
            x.requires_grad_()
        start = time.time()
        y, loss = self.module(x), 0.0
        if self.last:
            y = loss_fn(y, targets[i]) / m
            loss = y.item()
        self.spans.append((dist.get_rank(), f"F{i}", start, time.time()))
        if not self.last:
            # sent without waiting: the next stage takes it when its schedule gets there
            sends.append(p2p_api.isend(y.detach(), self.next, self.group, tag=ACTIVATION))
        return x, y, loss

    def step(self, m, micro_batches=None, targets=None, loss_fn=None, schedule="1f1b"):
        """Forward and backward of every micro-batch on this stage, in ``schedule``'s order.

        Args:
            m (int): The number of micro-batches (the same on every stage).
            micro_batches (list[Tensor]): The m inputs, on the first stage; None elsewhere.
            targets (list): One per micro-batch, on the last stage; None elsewhere.
            loss_fn: ``loss_fn(output, target)``, on the last stage; each micro-batch's loss
                is divided by m, so the gradients are those of the mean over the batch.
            schedule (str): "gpipe" or "1f1b".

        Returns:
            The summed loss (a float) on the last stage, None on the others. Gradients
            are accumulated into this stage's parameters' ``.grad``.

        Raises:
            ValueError: on every stage alike, before any activation moves, if any stage's
                part is wrong (:func:`check_step`): m differs between stages, the first
                stage's micro-batches are not m of one shape, the last lacks targets or loss_fn.
        """
        unknown = None if schedule in SCHEDULES else f"schedule must be one of {list(SCHEDULES)}, got {schedule!r}"
        check_step(self, "PipelineStage.step", m, micro_batches, targets, loss_fn, unknown)
        self.spans, self.peak_held = [], 0
        me = dist.get_rank()
        held = {}           # micro-batch -> (input, output or loss): what its backward needs
        sends = []          # handles of sends still in flight
        total = 0.0
        order = SCHEDULES[schedule]
        for kind, i in order(self.num_stages, m, self.stage):
            if kind == "F":
                x, y, loss = self.forward(i, m, micro_batches, targets, loss_fn, sends)
                total += loss
                held[i] = (x, y)
                self.peak_held = max(self.peak_held, len(held))
            else:
                x, y = held.pop(i)
                dy = None
                if not self.last:
                    dy = torch.empty_like(y)
                    p2p_api.recv(dy, self.next, self.group, tag=GRADIENT)
                start = time.time()
                torch.autograd.backward(y, dy)
                self.spans.append((me, f"B{i}", start, time.time()))
                if not self.first:
                    sends.append(p2p_api.isend(x.grad, self.prev, self.group, tag=GRADIENT))
            # let go of what has been delivered (wait() on a finished send only raises its error)
            sends = [work for work in sends if not (work.is_completed() and work.wait())]
        for work in sends:
            work.wait()
        return total if self.last else None


def split_sizes(n_layers, p):
    """How many of ``n_layers`` layers each of ``p`` stages gets (the first ones one more if uneven)."""
    return [n_layers // p + (s < n_layers % p) for s in range(p)]
