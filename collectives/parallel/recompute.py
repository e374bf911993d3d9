"""Activation memory, and recomputation: keep a block's input, run its forward again in backward.

Semantics. Autograd keeps, for every operation, the tensors its backward will read: a
Linear its input, a GeLU its input, a LayerNorm its input and two statistics per row,
attention its Q, K, V, output and log-sum-exp. Those *activations* grow with sequence
and batch, and for long sequences they, not the parameters, fill the memory.
:func:`checkpoint` trades them for compute: the block runs forward without keeping
anything but its input, and backward runs the forward once more (with the same random
state) before differentiating it. Collectives inside the block (tensor parallelism) are
called again in the same order on every rank, so they pair as they did forward.

Steps of :func:`checkpoint` (``torch.utils.checkpoint``'s "reentrant" variant):

1. forward: save the inputs and the random-number state; run ``function`` under
   ``torch.no_grad()`` (nothing is kept);
2. backward: restore the random state, run ``function`` again with gradients on, on
   detached copies of the inputs, and backpropagate the incoming gradient through it:
   the parameters' gradients accumulate, the inputs' gradients are returned.

Activation memory of one :class:`~collectives.parallel.tensor_parallel.ParallelBlock`
(pre-LayerNorm, attention with a fused kernel, GeLU MLP), S positions, B sequences,
hidden H, A heads, MLP width F, over a tensor-parallel group of t ranks, counted in
elements of the activations' dtype (:func:`block_activation_elements`):

* without sequence parallelism: ``4SBH + 4SBH/t + 2SBF/t + SBA/t + 4SB``: the two
  LayerNorms' inputs (the first is the block's input) and outputs, whole on every rank
  (4SBH); Q, K, V and attention's output, this rank's heads (4SBH/t: the fused kernel
  writes its output in the (S, B, heads) order, so the output projection's input is a
  view of it, not a copy); the MLP's
  hidden activation before and after GeLU (2SBF/t), attention's log-sum-exp (SBA/t), the
  LayerNorms' mean and 1/std (4SB);
* with sequence parallelism (``sequence_parallel="regather"``: the all-gathered input of
  each column-parallel Linear is gathered again in backward, not kept): everything /t,
  ``(8SBH + 2SBF + SBA + 4SB)/t``;
* with the block checkpointed: its input only, ``SBH`` (``SBH/t`` with sequence
  parallelism), for one extra forward of the block per step (its collectives included:
  one more all_reduce of SBH per block without sequence parallelism).

This is Korthikanti et al.'s method applied to this block (their ``sbh(34 + 5as/h)``
bytes counts 16-bit activations, dropout masks, and the unfused attention's S x S
matrices, which a fused kernel does not keep). :func:`saved_activation_bytes` measures
the same thing from a run: the tensors autograd packs for backward, each storage once,
parameters left out.

Worked example, 4 ranks (t = 4) of S = 8, B = 2, H = 16, A = 4, F = 64, float64: without
sequence parallelism 4*256 + 4*256/4 + 2*1024/4 + 64/4 + 64 = 1,872 elements
(14,976 bytes) per rank; with it (8*256 + 2*1024 + 64 + 64)/4 = 1,056; checkpointed
256 (64 with sequence parallelism).

Reference: V. Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
Models", MLSys 2023; T. Chen et al., "Training Deep Nets with Sublinear Memory Cost", 2016.
"""
import torch


def block_activation_elements(s, b, h, a, f, t=1, sequence_parallel=False, recompute=False):
    """Elements one rank keeps for backward for one transformer block (see the module's card).

    Args:
        s, b, h, a, f (int): Sequence, batch, hidden, heads, MLP width.
        t (int): Tensor-parallel ranks.
        sequence_parallel (bool): Activations between the blocks sharded over the sequence.
        recompute (bool): The block checkpointed: its input only.

    Returns:
        int: elements (multiply by the dtype's size for bytes).
    """
    if s % t and sequence_parallel:
        raise ValueError(f"block_activation_elements: the sequence {s} must be divisible by t={t} "
                         f"with sequence parallelism")
    if recompute:
        return s * b * h // (t if sequence_parallel else 1)
    if sequence_parallel:
        return (8 * s * b * h + 2 * s * b * f + s * b * a + 4 * s * b) // t
    return 4 * s * b * h + (4 * s * b * h + 2 * s * b * f + s * b * a) // t + 4 * s * b


def saved_activation_bytes(function, *args, exclude=()):
    """Run ``function(*args)`` and count the bytes autograd keeps for its backward.

    Every tensor packed for backward (``torch.autograd.graph.saved_tensors_hooks``) is
    counted by its storage, each storage once; the storages of ``exclude`` (pass the
    model's parameters) are left out, so the figure is activations only.

    Returns:
        (output, bytes): what ``function`` returned, and the bytes kept.

    Example::

        >>> out, kept = saved_activation_bytes(block, x, exclude=block.parameters())
    """
    skip = {p.untyped_storage().data_ptr() for p in exclude}
    seen = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = function(*args)
    return out, sum(seen.values())


class _Checkpoint(torch.autograd.Function):

    @staticmethod
    def forward(ctx, function, *args):
        ctx.function = function
        ctx.rng = torch.get_rng_state()
        ctx.cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        ctx.save_for_backward(*[a for a in args if torch.is_tensor(a)])
        ctx.layout = [torch.is_tensor(a) for a in args]
        ctx.others = [a for a in args if not torch.is_tensor(a)]
        with torch.no_grad():
            return function(*args)

    @staticmethod
    def backward(ctx, *grads):
        tensors, others = iter(ctx.saved_tensors), iter(ctx.others)
        args = [next(tensors).detach().requires_grad_(needs) if is_tensor else next(others)
                for is_tensor, needs in zip(ctx.layout, ctx.needs_input_grad[1:])]
        saved_rng = torch.get_rng_state()
        torch.set_rng_state(ctx.rng)           # dropout draws the masks it drew forward
        if ctx.cuda_rng is not None:
            torch.cuda.set_rng_state_all(ctx.cuda_rng)
        try:
            with torch.enable_grad():
                outputs = ctx.function(*args)
        finally:
            torch.set_rng_state(saved_rng)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        pairs = [(o, g) for o, g in zip(outputs, grads) if torch.is_tensor(o) and o.requires_grad]
        torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        return (None, *[a.grad if torch.is_tensor(a) else None for a in args])


def checkpoint(function, *args):
    """``function(*args)``, keeping only ``args`` for backward and running ``function`` again there.

    Args:
        function: A callable of tensors (a block, a layer); it may call collectives, which
            run once more in backward, in the same order on every rank.
        *args: Its arguments (tensors and others).

    Returns:
        What ``function(*args)`` returns, differentiable in ``args`` and in the parameters
        ``function`` uses.

    Example::

        >>> y = checkpoint(block, x)          # block: a ParallelBlock over a tensor-parallel group
        >>> y.sum().backward()                # block's forward (and its all_reduce) runs again here
    """
    if not callable(function):
        raise TypeError(f"checkpoint: function must be callable, got {type(function).__name__}")
    return _Checkpoint.apply(function, *args)
