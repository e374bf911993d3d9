"""A torch.distributed backend named ``collectives``: unmodified torch programs on our algorithms.

``import collectives`` registers it. Then::

    dist.init_process_group("collectives")          # or "cpu:collectives,cuda:nccl", env://, ...
    model = DistributedDataParallel(model)           # torch's own DDP, FSDP2, DTensor, dist.*

runs every collective those programs issue as one of the algorithms in
``collectives/algorithms/``, its messages moving through our one door
(:class:`~collectives.p2p_communications.Comm`), so ``count_traffic()``,
``trace()``, ``COLLECTIVES_TIMEOUT`` and ``COLLECTIVES_VERBOSE`` see them.

How torch reaches us: ``init_process_group`` calls :func:`_create` (the creator
registered with ``Backend.register_backend``) once per group with the group's
store, rank and size. It returns a :class:`CollectivesBackend`: a Python
``ProcessGroup`` that torch takes as the whole group, or (for a mixed
``"cpu:collectives,cuda:nccl"`` group) a Python subclass of torch's C++
``Backend`` for the CPU; torch then calls its methods (``allreduce``,
``all_gather_single``, ...) for every collective on that group. Each method checks what our algorithms cannot do (naming torch's
operation and the reason) and calls our public API (:mod:`collectives.api`,
:mod:`collectives.tensor_api`) with the group's :class:`~collectives.group.GroupInfo`,
so validation, aliasing, staging, call tags and the group's engine lane are the
ones every other caller gets. It returns a :class:`BackendWork` whose future's
value is the list of output tensors, which is what DDP's reducer, comm hooks and
FSDP2 read, and whose ``wait()`` raises the collective's error.

The messages themselves travel over an inner point-to-point transport: a
``ProcessGroupGloo`` built from a prefixed copy of the group's store. Only its
``send``/``recv`` are used, never its collectives. CUDA tensors are copied to
host memory and back around the algorithm (NCCL as inner transport is not
wired in yet).

Choosing algorithms: ``COLLECTIVES_ALGO="all_reduce:ring,broadcast:binomial_tree"``
(like ``NCCL_ALGO``), read when a group is created; a collective left out gets
the automatic choice (``collectives.tuning``). Unknown names raise at
``init_process_group``.
"""
from .process_group import NAME, BACKEND_IS_PROCESS_GROUP, BackendWork, CollectivesBackend, register, backend_of

__all__ = ["NAME", "BACKEND_IS_PROCESS_GROUP", "BackendWork", "CollectivesBackend", "register", "backend_of"]
