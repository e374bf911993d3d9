"""Wrong (GPipe, not 1F1B): every forward, then every backward: right gradients, no deadlock,
but a stage holds all m micro-batches' activations at once instead of at most p - s."""
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
    for i in range(num_micro_batches):
        grad = None
        if stage.next is not None:
            grad = stage.empty()
            dist.recv(grad, stage.next)
        dx = stage.backward(i, grad)
        if stage.prev is not None:
            sends.append(dist.isend(dx, stage.prev))
    for request in sends:
        request.wait()
