"""Compressed gradients: send fewer bytes per step, at some cost in accuracy.

Data parallelism sends the whole gradient every step (2(N-1)/N x S bytes per
rank with a ring). Two ways to send less, the two that torch's DDP ships as
communication hooks (``torch.distributed.algorithms.ddp_comm_hooks``):

1. **Low precision** (:class:`HalfPrecision`): cast the bucket to float16 or
   bfloat16, all-reduce that, cast back. Half the bytes, exactly. float16 keeps
   10 bits of mantissa but overflows above 65504 (the bucket is divided by N
   before the cast, as torch's ``fp16_compress_hook`` does, so the sum stays in
   range); bfloat16 keeps float32's range but only 7 bits of mantissa.
2. **PowerSGD** (:class:`PowerSGD`; Vogels, Karimireddy and Jaggi, NeurIPS
   2019): each gradient matrix M (n x m; a conv kernel is reshaped to
   ``(out_channels, -1)``) is replaced by a rank-r approximation P Q^T, found
   with one step of power iteration that reuses last step's Q:

       P = M Q;  all_reduce(P);  P = orthonormalise(P)
       Q = M^T P;  all_reduce(Q);  M ~ P Q^T

   Each rank sends r (n + m) values per matrix instead of n m: for the MNIST
   net's fc1 weight (64 x 512) at r = 4, 2,304 instead of 32,768, 14 times fewer.
   What the approximation leaves out is not lost: **error feedback** keeps it
   (``error = M - P Q^T``) and adds it to the next step's gradient, so every
   component is applied eventually. Vectors (biases) and matrices too small to
   gain (r (n + m) >= n m) are sent whole, in one all-reduce with the P factors.

Both work on a bucket: ``start(keys, grads, flat, group, algorithm)`` begins
reducing ``flat`` (a flat buffer; ``grads`` are views of it shaped like the
parameters; whatever else ``flat`` holds beyond them, e.g.
:class:`~collectives.parallel.data_parallel.DataParallel`'s "used" flags, is
summed too, exactly by PowerSGD) and returns a handle whose ``wait()`` leaves in
``flat`` the sum over the ranks. ``keys`` (one per gradient: the parameter's
``id``) name PowerSGD's per-matrix state, so it survives DDP rebuilding its buckets.
``DataParallel(model, compression=...)`` and :func:`collectives.parallel.ddp_hook.ddp_comm_hook`
use them.

Example, the MNIST net (46,730 gradients, one bucket with 8 "used" flags: 46,738
values): float32 all-reduces 46,738 x 4 bytes per step, float16 46,738 x 2; PowerSGD
at r = 4 all-reduces 618 values (P factors, biases, flags) then 4,004 (Q factors),
4,622 x 4 bytes, 10 times fewer (``tests/test_compression.py`` counts them).
"""
import torch

from .. import api


class _Then:
    """A handle: wait for ``work`` (None: nothing to wait for), then run ``finish`` once."""

    def __init__(self, work, finish):
        self.work, self.finish, self.done = work, finish, False

    def wait(self):
        if not self.done:
            if self.work is not None:
                self.work.wait()
            self.finish()
            self.done = True
        return True


def _rest_mask(flat, grads):
    """Boolean mask over ``flat``: True where no gradient view lies (flags and the like)."""
    mask = torch.ones(flat.numel(), dtype=torch.bool, device=flat.device)
    base = flat.data_ptr()
    for g in grads:
        start = (g.data_ptr() - base) // flat.element_size()
        mask[start:start + g.numel()] = False
    return mask


class NoCompression:
    """Full precision: the bucket as it is (what DataParallel does without ``compression``)."""

    name = "none"

    def start(self, keys, grads, flat, group, algorithm):
        return api.all_reduce(flat, group=group, async_op=True, algorithm=algorithm)


class HalfPrecision:
    """Send the bucket as float16 or bfloat16: half the bytes of float32.

    Args:
        dtype: ``torch.float16`` or ``torch.bfloat16``.

    The bucket is divided by the group's size before the cast and multiplied
    back after, so a float16 sum of N gradients stays in range; ``flat`` ends
    with the sum, rounded to the low precision.
    """

    def __init__(self, dtype=torch.float16):
        if dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(f"HalfPrecision sends float16 or bfloat16, not {dtype}")
        self.dtype = dtype
        self.name = "fp16" if dtype == torch.float16 else "bf16"

    def start(self, keys, grads, flat, group, algorithm):
        n = torch.distributed.get_world_size(group)
        half = flat.div(n).to(self.dtype)
        work = api.all_reduce(half, group=group, async_op=True, algorithm=algorithm)

        def finish():
            flat.copy_(half.to(flat.dtype)).mul_(n)
        return _Then(work, finish)


class PowerSGD:
    """Rank-r approximation of each gradient matrix, with error feedback.

    Args:
        rank (int): r, the approximation's rank (1-4 is typical; higher is closer
            to full precision and sends more).
        seed (int): Seed of the first Q, the same on every rank.

    State (per bucket and matrix): the error left by the last approximation and
    the last Q (one power-iteration step per training step converges over steps,
    as Vogels et al. do). Each rank keeps its own error; Q is the same on every rank.
    """

    def __init__(self, rank=4, seed=0):
        if rank < 1:
            raise ValueError(f"PowerSGD's rank must be at least 1, got {rank}")
        self.rank, self.seed = rank, seed
        self.name = f"powersgd{rank}"
        self.errors, self.qs = {}, {}

    def state_dict(self, names):
        """This rank's state (errors and Qs) keyed by parameter name: ``names`` maps each key
        (an ``id``, valid in this process only) to its name. A checkpoint needs it: without
        it a resumed run starts from no error and a fresh Q and is no longer the same run."""
        return {"errors": {names[k]: v for k, v in self.errors.items()},
                "qs": {names[k]: v for k, v in self.qs.items()}}

    def load_state_dict(self, state, keys):
        """Restore :meth:`state_dict`'s output; ``keys`` maps each name to this process's key."""
        self.errors = {keys[n]: v.clone() for n, v in state["errors"].items()}
        self.qs = {keys[n]: v.clone() for n, v in state["qs"].items()}

    def compressed(self, grad):
        """True if ``grad`` is sent as rank-r factors (a matrix that gains from it)."""
        if grad.dim() < 2:
            return False
        n, m = grad.shape[0], grad.numel() // grad.shape[0]
        return self.rank * (n + m) < n * m

    def values_sent(self, shapes, extra=0):
        """Values one rank's two all-reduces carry for gradients of ``shapes`` (+ ``extra`` exact values)."""
        p = q = 0
        for shape in shapes:
            numel = torch.Size(shape).numel()
            if len(shape) >= 2 and self.rank * (shape[0] + numel // shape[0]) < numel:
                p += shape[0] * self.rank
                q += numel // shape[0] * self.rank
            else:
                extra += numel
        return p + extra, q

    def _q(self, key, m, like):
        if key not in self.qs:   # the first Q: the same on every rank (seeded by the seed and m alone)
            g = torch.Generator().manual_seed(self.seed * 1000003 + m)
            self.qs[key] = torch.randn(m, self.rank, generator=g, dtype=torch.float64).to(like)
        return self.qs[key]

    def start(self, keys, grads, flat, group, algorithm):
        n = torch.distributed.get_world_size(group)
        matrices, ms, ps = [], [], []
        for i, g in enumerate(grads):
            if not self.compressed(g):
                continue
            ekey = keys[i]
            m = g.reshape(g.shape[0], -1)
            if ekey in self.errors:
                m = m + self.errors[ekey]          # error feedback: what last step left out
            else:
                m = m.clone()
            q = self._q(ekey, m.shape[1], m)
            matrices.append((i, ekey))
            ms.append(m)
            ps.append(m @ q)
        mask = _rest_mask(flat, [grads[i] for i, _ in matrices])
        rest = flat[mask]
        first = torch.cat([p.flatten() for p in ps] + [rest]) if ps else rest.clone()
        work = api.all_reduce(first, group=group, async_op=True, algorithm=algorithm)

        def finish():
            # first: the P factors summed over ranks, then the exact values
            offset, orthos = 0, []
            for p in ps:
                summed = first[offset:offset + p.numel()].view_as(p)
                offset += p.numel()
                orthos.append(torch.linalg.qr(summed).Q)     # the same on every rank: same input
            flat[mask] = first[offset:]
            if not ps:
                return
            qs = [m.t() @ p_hat for m, p_hat in zip(ms, orthos)]
            second = torch.cat([q.flatten() for q in qs])
            api.all_reduce(second, group=group, algorithm=algorithm)
            offset = 0
            for (i, ekey), m, p_hat, q in zip(matrices, ms, orthos, qs):
                q_sum = second[offset:offset + q.numel()].view_as(q)
                offset += q.numel()
                approx_sum = p_hat @ q_sum.t()              # ~ the sum of every rank's m
                self.errors[ekey] = m - approx_sum / n        # this rank's share of what is left out
                self.qs[ekey] = q_sum.clone()                 # warm start for the next step
                grads[i].copy_(approx_sum.view_as(grads[i]))
        return _Then(work, finish)


def make(name, rank=4):
    """A compression by name: "none", "fp16", "bf16" or "powersgd" (``rank``: PowerSGD's r)."""
    if name in (None, "none"):
        return NoCompression()
    if name == "fp16":
        return HalfPrecision(torch.float16)
    if name == "bf16":
        return HalfPrecision(torch.bfloat16)
    if name == "powersgd":
        return PowerSGD(rank)
    raise ValueError(f"unknown compression {name!r}: none, fp16, bf16 or powersgd")
