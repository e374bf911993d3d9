"""Wrong (message order): the last backwards run in reverse order (B m-1 first), but the next
stage sends its gradients in micro-batch order, and messages arrive in the order they were sent:
backward(m-1) gets the gradient of another micro-batch."""
import torch.distributed as dist


def pipeline_1f1b(stage, num_micro_batches):
    p, s, m = stage.size, stage.rank, num_micro_batches
    sends = []

    def forward(i):
        x = None
        if stage.prev is not None:
            x = stage.empty()
            dist.recv(x, stage.prev)
        y = stage.forward(i, x)
        if stage.next is not None:
            sends.append(dist.isend(y, stage.next))

    def backward(i):
        grad = None
        if stage.next is not None:
            grad = stage.empty()
            dist.recv(grad, stage.next)
        dx = stage.backward(i, grad)
        if stage.prev is not None:
            sends.append(dist.isend(dx, stage.prev))

    warmup = min(p - s - 1, m)
    for i in range(warmup):                 # fill the pipeline
        forward(i)
    for i in range(m - warmup):             # steady state: one forward, one backward
        forward(warmup + i)
        backward(i)
    for i in reversed(range(m - warmup, m)):   # drain it, last first
        backward(i)
    for request in sends:
        request.wait()
