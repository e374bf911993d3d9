"""SyncBatchNorm: batch normalization whose statistics cover the global batch, from our collectives.

What it teaches. BatchNorm normalizes each channel with the mean and variance
of the batch. Under data parallelism each rank sees only its slice of the
batch, so plain ``nn.BatchNorm`` normalizes with *local* statistics: with 4
ranks of 8 samples, every rank normalizes by the statistics of 8 samples, not
32. That is fine when the per-rank batch is large, and hurts when it is small
(detection and segmentation models often fit 1-4 images per GPU): the
statistics get noisy and training and evaluation disagree. SyncBatchNorm
computes the statistics of the whole global batch instead, so N ranks of B
samples behave exactly like one process with N x B samples.

Forward: each rank computes its per-channel count, mean and (biased) variance;
one ``all_gather`` collects them from every rank, and every rank combines them
into the global mean and variance (the parallel form of Welford's update, as
torch's SyncBatchNorm does: stable, and ranks may hold different batch sizes).

Backward: with x_hat = (x - mean) / std and y = weight * x_hat + bias, the
gradient of x needs two sums over the *global* batch, sum(dy) and
sum(dy * x_hat) per channel; one ``all_reduce`` of both gives them:

    dx = weight / std * (dy - sum(dy) / M - x_hat * sum(dy * x_hat) / M)

where M is the global count. The gradients of weight and bias are this rank's
own sums, as in torch's SyncBatchNorm: data parallel training all-reduces
them with the other parameters' gradients.

Cost per call: one all_gather of 2C+1 values forward, one all_reduce of 2C
values backward, both small and latency-bound; and they sit in the middle of
the forward and backward passes, where nothing else can overlap them.
"""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from .. import api


def _per_channel(t, x):
    """Shape a per-channel vector (C,) to broadcast against x of shape (B, C, ...)."""
    return t.view(1, -1, *([1] * (x.dim() - 2)))


class _SyncBatchNormFunction(torch.autograd.Function):

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum, group):
        channels = x.shape[1]
        dims = [0] + list(range(2, x.dim()))
        count = x.numel() // channels
        # Local statistics in float64, so combining them loses nothing for float32 inputs.
        if count > 0:
            local_mean = x.double().mean(dims)
            local_var = x.double().var(dims, unbiased=False)
        else:
            local_mean = local_var = torch.zeros(channels, dtype=torch.float64, device=x.device)
        stats = torch.cat([local_mean, local_var, torch.tensor([float(count)], dtype=torch.float64,
                                                                  device=x.device)])
        gathered = [torch.empty_like(stats) for _ in range(dist.get_world_size(group))]
        api.all_gather(gathered, stats, group=group)
        table = torch.stack(gathered)                  # one row per rank: means, variances, count
        means, variances, counts = table[:, :channels], table[:, channels:2 * channels], table[:, -1:]
        total = counts.sum()
        if total == 0:
            raise ValueError("SyncBatchNorm got an empty batch on every rank")
        if total == 1:
            # nn.BatchNorm's refusal: one value has no variance (it returned zeros and dragged
            # running_var toward 0). The count is the all-gathered one: every rank raises.
            raise ValueError(f"Expected more than 1 value per channel when training, got input size "
                             f"{tuple(x.shape)} on this rank and 1 value in the batch of every rank together")
        mean = (counts * means).sum(0) / total
        # Parallel variance: each rank's spread around its own mean, plus its mean's distance to the global one.
        var = (counts * (variances + (means - mean) ** 2)).sum(0) / total

        if running_mean is not None:
            with torch.no_grad():
                unbiased = var * total / max(total - 1, 1)
                running_mean.mul_(1 - momentum).add_(momentum * mean.to(running_mean.dtype))
                running_var.mul_(1 - momentum).add_(momentum * unbiased.to(running_var.dtype))

        invstd = (var + eps).rsqrt().to(x.dtype)
        x_hat = (x - _per_channel(mean.to(x.dtype), x)) * _per_channel(invstd, x)
        ctx.save_for_backward(x_hat, weight, invstd)
        ctx.total, ctx.group = float(total), group
        y = x_hat
        if weight is not None:
            y = y * _per_channel(weight, x) + _per_channel(bias, x)
        return y

    @staticmethod
    def backward(ctx, dy):
        x_hat, weight, invstd = ctx.saved_tensors
        channels = x_hat.shape[1]
        dims = [0] + list(range(2, x_hat.dim()))
        sum_dy = dy.sum(dims)
        sum_dy_xhat = (dy * x_hat).sum(dims)
        # This rank's share of the weight and bias gradients, before the sums become global.
        grad_weight = sum_dy_xhat.clone() if weight is not None else None
        grad_bias = sum_dy.clone() if weight is not None else None
        both = torch.cat([sum_dy, sum_dy_xhat])
        api.all_reduce(both, group=ctx.group)
        sum_dy, sum_dy_xhat = both[:channels], both[channels:]
        scale = invstd if weight is None else weight * invstd
        dx = _per_channel(scale, dy) * (dy - _per_channel(sum_dy, dy) / ctx.total
                                        - x_hat * _per_channel(sum_dy_xhat, dy) / ctx.total)
        return dx, grad_weight, grad_bias, None, None, None, None, None


class SyncBatchNorm(nn.modules.batchnorm._BatchNorm):
    """BatchNorm over the batch of every rank in ``group`` together.

    A drop-in for ``nn.BatchNorm1d/2d/3d`` (same arguments, parameters and
    buffers, so state dicts load either way) and for ``torch.nn.SyncBatchNorm``,
    which needs GPUs where this one runs on CPU too. In training mode it
    normalizes with the mean and variance of the global batch and updates the
    running statistics with them (identical on every rank); in eval mode it
    uses the running statistics and communicates nothing.

    Args:
        num_features (int): C, the channel dimension of inputs (B, C, ...).
        eps, momentum, affine, track_running_stats: As in ``nn.BatchNorm2d``.
        group (ProcessGroup, optional): Ranks whose batches are normalized together.

    Example::

        >>> model = SyncBatchNorm.convert_sync_batchnorm(model)   # every BatchNorm*d replaced
        >>> y = SyncBatchNorm(16)(x)   # x: this rank's (B, 16, H, W); statistics over all ranks
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True,
                 group=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.group = group

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (batch, channels, ...), got {input.dim()}D")

    def forward(self, x):
        self._check_input_dim(x)
        if not self.training and self.running_mean is not None:   # eval: running statistics, no messages
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                                False, 0.0, self.eps)
        momentum = self.momentum
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:     # cumulative average, as nn.BatchNorm does
                momentum = 1.0 / float(self.num_batches_tracked)
        running = self.training and self.track_running_stats
        return _SyncBatchNormFunction.apply(x, self.weight, self.bias,
                                            self.running_mean if running else None,
                                            self.running_var if running else None,
                                            self.eps, momentum, self.group)

    @classmethod
    def convert_sync_batchnorm(cls, module, group=None):
        """Return ``module`` with every ``nn.BatchNorm*d`` replaced by a SyncBatchNorm holding its state."""
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and not isinstance(module, cls):
            converted = cls(module.num_features, module.eps, module.momentum, module.affine,
                            module.track_running_stats, group)
            like = module.weight if module.weight is not None else module.running_mean
            if like is not None:
                converted.to(device=like.device, dtype=like.dtype)   # integer buffers keep their dtype
            converted.load_state_dict(module.state_dict())
            converted.train(module.training)
            return converted
        for name, child in module.named_children():
            module.add_module(name, cls.convert_sync_batchnorm(child, group))
        return module
