"""Wrong (holds m activations): posts the receives of all m activations at the start, then runs
1F1B's order of work. Right gradients, right order of forwards and backwards, but every posted
receive holds a buffer of one activation until it is used: m of them, not 1F1B's p - s."""
import torch.distributed as dist


def pipeline_1f1b(stage, num_micro_batches):
    p, s, m = stage.size, stage.rank, num_micro_batches
    inbox = []
    if stage.prev is not None:                     # every activation this stage will ever get
        for i in range(m):
            x = stage.empty()
            inbox.append((x, dist.irecv(x, stage.prev)))
    sends = []

    def forward(i):
        x = None
        if inbox:
            x, request = inbox[i]
            request.wait()
            inbox[i] = (None, None)
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
    for i in range(warmup):
        forward(i)
    for i in range(m - warmup):
        forward(warmup + i)
        backward(i)
    for i in range(m - warmup, m):
        backward(i)
    for request in sends:
        request.wait()
