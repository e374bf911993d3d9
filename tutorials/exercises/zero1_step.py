"""Exercise: one ZeRO-1 optimizer step (SGD with momentum, optimizer state sharded).

Build ``zero1_step(params, state, lr, momentum)``: ``params`` is a list of
parameters whose ``.grad`` holds this rank's own gradients (not averaged). After
the call every rank's parameters must equal what ``torch.optim.SGD(params, lr,
momentum)`` would give with the gradients averaged over the ranks; but each rank
keeps the momentum buffer only for its own 1/N of the parameters, in ``state``
(a dict you own: empty at the first call, passed back at every call).

Read: chapter 10, tutorials/10_zero.md.

Hint: flatten all gradients into one vector g (``torch.cat([p.grad.flatten() ...])``)
and cut it into N shards with ``g.tensor_split(N)``; rank r owns shard r.
1. reduce-scatter g (a ring: N-1 steps, as in the reduce_scatter exercise), so
   rank r holds the sum of shard r; divide by N.
2. update your shard only: ``buf = grad`` at the first step, else
   ``buf = momentum * buf + grad``; ``p_shard -= lr * buf`` (``state["momentum"] = buf``).
3. all-gather the updated parameter shards (N-1 ring steps) and copy the flat
   vector back into the parameters.

Traffic to reach: 2(N-1)/N x S bytes sent per rank, S the bytes of all parameters
(the same as one ring all_reduce); optimizer state per rank: about P/N values.

Grade it:  python -m tutorials.exercises.grade zero1_step
"""
import torch
import torch.distributed as dist


def zero1_step(params, state, lr, momentum=0.9, group=None):
    """One SGD-with-momentum step on averaged gradients, keeping only this rank's shard of momentum."""
    raise NotImplementedError("write the ZeRO-1 step here")
