"""Exercise, step 2 of 3 of fsdp_step: reduce-scatter one layer's gradients into this rank's shard.

Build ``fsdp_step_reduce_scatter(grads)``: ``grads`` are this rank's gradients of one layer's
parameters (one tensor per parameter, e.g. the weight's (out, in) and the bias's (out,)),
computed on this rank's batch. Return this rank's piece of their average over the ranks, in
the layout of step 1: the gradients laid end to end in one flat vector of ``numel`` values,
padded with zeros to N x k, k = ceil(numel / N); rank r keeps piece r, k values. The
batches are the same size, so the average is what one process training on all of them
would compute. Leave ``grads`` as they were.

Read: chapter 18, tutorials/18_fully_sharded.md, "The idea" and "The code".

Hint: flatten and concatenate the gradients (``torch.cat([g.reshape(-1) for g in grads])``),
pad with N x k - numel zeros, cut into N pieces of k and reduce-scatter them with your ring
``reduce_scatter`` (``from tutorials.exercises.reduce_scatter import reduce_scatter``; the
built-in is switched off while grading). That gives the sum: divide by N. Cutting numel // N
values per piece instead loses the last ones when N does not divide numel.

Traffic to reach: one reduce-scatter: (N-1) x k x 8 bytes per rank in N-1 messages
(float64), half an all-reduce.

Grade it:  python -m tutorials.exercises.grade fsdp_step --step 2
"""
import torch  # noqa: F401  (imports your solution will need)
import torch.distributed as dist  # noqa: F401


def fsdp_step_reduce_scatter(grads, group=None):
    """This rank's piece (k values) of the layer's gradients, flattened, padded and averaged over the ranks."""
    raise NotImplementedError("write the reduce-scatter of one layer's gradients here")
