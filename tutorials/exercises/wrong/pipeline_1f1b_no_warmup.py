"""Wrong (no warm-up): forward then backward of each micro-batch in turn, on every stage:
right gradients, one activation held, but the stages take turns instead of overlapping."""
import torch.distributed as dist


def pipeline_1f1b(stage, num_micro_batches):
    sends = []
    for i in range(num_micro_batches):
        x = None
        if stage.prev is not None:
            x = stage.empty()
            dist.recv(x, stage.prev)
        y = stage.forward(i, x)
        if stage.next is not None:
            sends.append(dist.isend(y, stage.next))
        grad = None
        if stage.next is not None:
            grad = stage.empty()
            dist.recv(grad, stage.next)
        dx = stage.backward(i, grad)
        if stage.prev is not None:
            sends.append(dist.isend(dx, stage.prev))
    for request in sends:
        request.wait()
