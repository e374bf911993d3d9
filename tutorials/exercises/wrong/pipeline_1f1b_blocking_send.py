"""Wrong (deadlock): the 1F1B order, but blocking sends: in the steady state stage s sends
an activation forward while stage s+1 sends a gradient back, and each waits for the other."""
import torch.distributed as dist


def pipeline_1f1b(stage, num_micro_batches):
    p, s, m = stage.size, stage.rank, num_micro_batches

    def forward(i):
        x = None
        if stage.prev is not None:
            x = stage.empty()
            dist.recv(x, stage.prev)
        y = stage.forward(i, x)
        if stage.next is not None:
            dist.send(y, stage.next)

    def backward(i):
        grad = None
        if stage.next is not None:
            grad = stage.empty()
            dist.recv(grad, stage.next)
        dx = stage.backward(i, grad)
        if stage.prev is not None:
            dist.send(dx, stage.prev)

    warmup = min(p - s - 1, m)
    for i in range(warmup):
        forward(i)
    for i in range(m - warmup):
        forward(warmup + i)
        backward(i)
    for i in range(m - warmup, m):
        backward(i)
