"""Reference solution, step 2 of pipeline_1f1b: receive, compute, post the send; wait for the sends at the end."""
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
            sends.append(dist.isend(y, stage.next))
    for request in sends:
        request.wait()
