"""Exercise: one stage of a pipeline, scheduled 1F1B.

Build ``pipeline_1f1b(stage, num_micro_batches)``: this rank is stage s = ``stage.rank``
of p = ``stage.size`` stages (one per rank; ``stage.prev`` and ``stage.next`` are the
neighbours' ranks, None at the ends). Run the forward and the backward of each of the m
micro-batches on this stage, in the 1F1B order, and move the messages between stages:

* ``y = stage.forward(i, x)``: micro-batch i's forward; ``x`` is the activation the
  previous stage sent (None on the first stage). Send ``y`` to the next stage (on the
  last stage ``y`` is None: the loss is kept inside).
* ``dx = stage.backward(i, grad)``: micro-batch i's backward; ``grad`` is the gradient
  the next stage sent (None on the last stage). Send ``dx`` to the previous stage (None
  on the first).
* ``stage.empty()``: a tensor to receive an activation or a gradient into.

1F1B on stage s: w = min(p - s - 1, m) warm-up forwards (F0 .. Fw-1), then one forward
and one backward in turn (Fw B0 Fw+1 B1 ...), then the last w backwards. Stage s then
never holds more than p - s micro-batches' activations (all-forwards-first would hold m).

Read: chapter 16, tutorials/16_pipeline_parallelism.md.

Hint: receive before you compute (``dist.recv(x, stage.prev)``), then send. A blocking
``dist.send`` waits until the receiver has posted its receive, and in the steady state
stage s sends an activation forward while stage s+1 sends a gradient back: both would
wait forever. Send with ``dist.isend``, keep the handles, and ``wait()`` for them all
at the end.

Traffic to reach: per stage m activations forward (not on the last stage) and m
gradients back (not on the first), one message each: at most 2m messages.

Steps, each graded on its own: ``--step 1``, the 1F1B order as a list, no messages
(pipeline_1f1b_order.py); ``--step 2``, the forwards alone with their messages
(pipeline_1f1b_forward.py); ``--step 3``, this exercise.

Grade it:  python -m tutorials.exercises.grade pipeline_1f1b
"""
import torch  # noqa: F401  (imports your solution will need)
import torch.distributed as dist  # noqa: F401


def pipeline_1f1b(stage, num_micro_batches):
    """Run this stage's forwards and backwards in 1F1B order, sending and receiving between stages."""
    raise NotImplementedError("write the 1F1B schedule of one stage here")
