"""Exercise, step 2 of 3 of pipeline_1f1b: the forwards of one stage, with their messages.

Build ``pipeline_1f1b_forward(stage, num_micro_batches)``: this rank is stage s =
``stage.rank`` of p = ``stage.size`` (``stage.prev``, ``stage.next``: the neighbours' ranks,
None at the ends). Run the m forwards in micro-batch order: ``y = stage.forward(i, x)``,
``x`` the activation the previous stage sent (None on the first stage), and send ``y`` to
the next stage (None on the last: the loss stays there). ``stage.empty()`` gives a tensor to
receive into. No backward yet: step 3 (pipeline_1f1b) interleaves both in step 1's order.

Read: chapter 16, tutorials/16_pipeline_parallelism.md.

Hint: receive before you compute (``dist.recv(x, stage.prev)`` into ``stage.empty()``),
then send. The forwards only flow one way, so a blocking ``dist.send`` cannot deadlock here;
it will in step 3, where gradients flow back at the same time: use ``dist.isend`` now, keep
the requests and ``wait()`` for them all before returning.

Traffic to reach: per stage (not the last) m activations, one message each: m messages.

Grade it:  python -m tutorials.exercises.grade pipeline_1f1b --step 2
"""
import torch  # noqa: F401  (imports your solution will need)
import torch.distributed as dist  # noqa: F401


def pipeline_1f1b_forward(stage, num_micro_batches):
    """Run this stage's forwards in micro-batch order, receiving from the previous stage and sending to the next."""
    raise NotImplementedError("write the forwards of one stage here")
