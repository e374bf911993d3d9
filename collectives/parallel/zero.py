"""ZeRO stages 1 and 2: each rank keeps the optimizer state of 1/N of the parameters.

What it teaches. In data parallel training every rank holds the same model,
the same gradients after the all-reduce, and the same optimizer state, and
then takes the same step: N copies of everything. The optimizer state is the
largest of these (Adam keeps two values per parameter, and with mixed precision
an fp32 master copy too). ZeRO (Rajbhandari et al., 2020) removes the copies
of the state without adding traffic, because a ring all-reduce is already a
reduce-scatter followed by an all-gather (chapter 4):

1. **reduce-scatter** the gradients: rank r gets the sum of shard r only
   (the first half of the ring all-reduce);
2. rank r runs the optimizer on shard r only: it is the only rank that keeps
   that shard's optimizer state;
3. **all-gather** the updated parameter shards, so every rank has the whole
   model again (the second half of the ring all-reduce, moving parameters
   instead of gradients).

Per step each rank sends 2(N-1)/N x S bytes, exactly what the ring all-reduce
of DDP sends, and the optimizer state per rank falls from S_opt to S_opt/N.
That is stage 1. **Stage 2** also drops the full gradients once they are
reduced and keeps only its shard of them (the gradient memory held between
steps falls as 1/N too). DeepSpeed's stage 2 reduces gradients bucket by
bucket during backward, so the full gradient never exists at once; here they
are reduced after backward, which keeps the code short and the peak memory
unchanged. Stage 3 (sharding the parameters themselves, as FSDP does) is
``collectives/parallel/fsdp.py`` (chapter 18).

Reference: S. Rajbhandari, J. Rasley, O. Ruwase, Y. He, "ZeRO: Memory
Optimizations Toward Training Trillion Parameter Models", SC 2020.
"""
import math

import torch
import torch.distributed as dist

from .. import api


class ZeroOptimizer:
    """Shard ``optimizer_class``'s state over the ranks of ``group`` (ZeRO stage 1 or 2).

    The parameters of each dtype are viewed as one flat vector, padded with
    zeros to N equal shards; rank r owns shard r of every such vector and keeps
    one ``optimizer_class`` over its shards only. Each parameter keeps its own
    dtype (a bf16 parameter never turns an fp32 one into bf16), as torch's
    ``ZeroRedundancyOptimizer`` does. Call :meth:`step` after
    ``loss.backward()`` (on this rank's own data, gradients not averaged): it
    averages the gradients, updates the shards, and leaves every rank with the
    same new parameters.

    Args:
        params (iterable of Tensor): The model's parameters, identical on every
            rank (rank 0's are broadcast at construction, as DDP does).
        optimizer_class: A ``torch.optim`` optimizer class, e.g. ``torch.optim.Adam``.
        group (ProcessGroup, optional): Ranks to shard over; None for all.
        stage (int): 1 (shard the optimizer state) or 2 (also keep only this
            rank's shard of the gradients after the step).
        algorithm (str): Algorithm of the reduce-scatter and the all-gather.
        **defaults: Passed to ``optimizer_class`` (lr, betas, momentum, ...).

    Example::

        >>> opt = ZeroOptimizer(model.parameters(), torch.optim.Adam, lr=1e-3)
        >>> loss_fn(model(x), y).backward()
        >>> opt.step()          # the same parameters as DDP + Adam on every rank
        >>> opt.zero_grad()
        >>> opt.state_bytes()   # 1/N of what torch.optim.Adam keeps on one rank
    """

    def __init__(self, params, optimizer_class, group=None, stage=1, algorithm="ring", **defaults):
        if stage not in (1, 2):
            raise ValueError(f"stage must be 1 or 2, got {stage}")
        self.params = [p for p in params if p.requires_grad]
        self.group, self.stage, self.algorithm = group, stage, algorithm
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        src = dist.get_process_group_ranks(group)[0] if group is not None else 0
        # One flat vector per (device, dtype), in the order of first appearance: a
        # single vector in the first parameter's dtype would round every other one.
        kinds = {}
        for p in self.params:
            kinds.setdefault((p.device, p.dtype), []).append(p)
        self.buckets = []
        for members in kinds.values():
            shard_size = math.ceil(sum(p.numel() for p in members) / self.world_size)
            bucket = dict(params=members, shard_size=shard_size, padded_size=shard_size * self.world_size)
            flat = self._flatten(bucket, [p.detach() for p in members])
            api.broadcast(flat, src=src, group=group)        # every rank starts from the same weights
            self._unflatten_into_params(bucket, flat)
            start = self.rank * shard_size
            # The only copy of "my" parameters the optimizer sees: its state is allocated for this alone.
            bucket["shard"] = torch.nn.Parameter(flat[start:start + shard_size].clone())
            self.buckets.append(bucket)
        self.padded_size = sum(b["padded_size"] for b in self.buckets)
        self.shards = [b["shard"] for b in self.buckets]
        self.optimizer = optimizer_class(self.shards, **defaults)

    @staticmethod
    def _flatten(bucket, tensors):
        """One flat vector of a bucket's tensors, zero-padded to N equal shards."""
        first = bucket["params"][0]
        flat = torch.zeros(bucket["padded_size"], dtype=first.dtype, device=first.device)
        offset = 0
        for t in tensors:
            flat[offset:offset + t.numel()].copy_(t.reshape(-1))
            offset += t.numel()
        return flat

    @staticmethod
    def _unflatten_into_params(bucket, flat):
        offset = 0
        with torch.no_grad():
            for p in bucket["params"]:
                p.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()

    def step(self):
        """Average the gradients, update this rank's shards, gather the new parameters."""
        for bucket in self.buckets:
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in bucket["params"]]
            flat_grad = self._flatten(bucket, grads)
            grad_shard = torch.empty(bucket["shard_size"], dtype=flat_grad.dtype, device=flat_grad.device)
            # 1. reduce-scatter: the sum of shard r over all ranks arrives on rank r.
            api.reduce_scatter(grad_shard, list(flat_grad.split(bucket["shard_size"])), group=self.group,
                               algorithm=self.algorithm)
            bucket["shard"].grad = grad_shard.div_(self.world_size)
        if self.stage == 2:
            for p in self.params:     # keep only the reduced shard of the gradients
                p.grad = None
        # 2. the optimizer, on my shards only.
        self.optimizer.step()
        # 3. all-gather: every rank's updated shard, into one flat parameter vector per dtype.
        for bucket in self.buckets:
            shard = bucket["shard"]
            flat = torch.empty(bucket["padded_size"], dtype=shard.dtype, device=shard.device)
            api.all_gather(list(flat.split(bucket["shard_size"])), shard.detach(), group=self.group,
                           algorithm=self.algorithm)
            self._unflatten_into_params(bucket, flat)

    def zero_grad(self, set_to_none=True):
        """Clear the model's gradients (and the gradient shards)."""
        for p in self.params + self.shards:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def state_bytes(self):
        """Bytes of optimizer state this rank holds (e.g. Adam's exp_avg and exp_avg_sq of its shards)."""
        return optimizer_state_bytes(self.optimizer)

    def grad_bytes(self):
        """Bytes of gradients this rank holds now: the full ones (stage 1) or the shards' (stage 2)."""
        held = [p.grad for p in self.params + self.shards if p.grad is not None]
        return sum(g.numel() * g.element_size() for g in held)


def optimizer_state_bytes(optimizer):
    """Bytes of the tensors in a torch optimizer's state (for comparing with an unsharded one)."""
    return sum(v.numel() * v.element_size() for state in optimizer.state.values()
               for v in state.values() if isinstance(v, torch.Tensor))
