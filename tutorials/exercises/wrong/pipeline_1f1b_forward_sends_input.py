"""Wrong, step 2 of pipeline_1f1b: sends on the activation it received (its input x) instead of
the one it computed (y): the next stage computes on the wrong values."""
import torch.distributed as dist


def pipeline_1f1b_forward(stage, num_micro_batches):
    sends = []
    for i in range(num_micro_batches):
        x = None
        if stage.prev is not None:
            x = stage.empty()
            dist.recv(x, stage.prev)
        y = stage.forward(i, x)
        if stage.next is not None:
            sends.append(dist.isend(x if x is not None else y, stage.next))   # the mistake: x, not y
    for request in sends:
        request.wait()
