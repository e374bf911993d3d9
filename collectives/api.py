"""The public collectives: torch.distributed's names and signatures, our algorithms.

Every function follows one path, written once in :class:`_Call` and :func:`_run`:

1. **validate** on the calling rank, before any message moves (a bad argument
   raises there, clearly, on every rank that passed it, instead of deadlocking
   the others); ranks outside ``group`` return at once, as torch's do;
2. **choose** the algorithm (``algorithm=`` or ``tuning.choose`` by size);
3. **run** it on the group's lane of the engine (in issue order per group,
   async or blocking), with buffers chosen so that aliased arguments give
   torch's answer (an input that overlaps an output is read from a private
   copy), staging what the backend cannot send directly, and each message
   tagged with the call's number and fingerprint;
4. **hand back** None (blocking) or a :class:`~collectives.engine.Work` whose
   future's value is the list of output tensors, as torch's is.
"""
from __future__ import annotations

import contextlib
import time
from typing import List, Optional, Union

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from . import debug, reduce_ops, tuning
from .algorithms import ALGORITHMS, REGISTRY
from .engine import Work, engine
from .group import GroupInfo, resolve
from .p2p_communications import Call, CollectiveError, Comm, report_call, timeout_seconds, watched

Group = Union[None, dist.ProcessGroup, GroupInfo]


class _Call:
    """One call's group, validation and staging (steps 1 and 3 of the module's path)."""

    def __init__(self, collective, group, algorithm):
        self.collective = collective
        self.where = f"collectives.{collective}"
        info = resolve(group, self.where)
        if algorithm is not None and algorithm not in ALGORITHMS[collective]:
            raise ValueError(f"{self.where}: unknown algorithm={algorithm!r}; valid: "
                             f"{', '.join(ALGORITHMS[collective])}")
        self.timeout = timeout_seconds()  # a bad COLLECTIVES_TIMEOUT fails here, before any message
        if info.timeout:
            self.timeout = min(self.timeout, info.timeout)
        self.info = info
        self.algorithm = algorithm
        self.ranks = list(info.ranks)
        self.member = info.member
        self.size = info.size
        self.me = info.ranks[info.rank] if info.member else (dist.get_rank() if dist.is_initialized() else -1)
        self.backend = backend = info.backend
        self.cpu_ok = "gloo" in backend or not backend
        self.cuda_direct = "nccl" in backend
        self.device = None
        self.copies_in_flight = False   # host<->GPU staging copies issued, not yet waited for

    # -- 1. validate ---------------------------------------------------------------

    def check_tensor(self, name, t, like=None, same_shape=True):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{self.where}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.layout != torch.strided:
            raise ValueError(f"{self.where}: {name} has layout {t.layout}; only dense (strided) "
                             f"tensors can be sent")
        kind = t.device.type
        if kind == "cpu" and not self.cpu_ok:
            raise ValueError(f"{self.where}: {name} is on the CPU, which the nccl backend cannot "
                             f"send; move it to this rank's GPU or use a gloo group")
        if kind not in ("cpu", "cuda"):
            raise ValueError(f"{self.where}: {name} is on device {t.device}, which the backend "
                             f"cannot send (CPU and CUDA tensors only)")
        if kind == "cuda" and self.device is None:
            self.device = t.device
        if like is not None:
            if t.dtype != like.dtype:
                raise ValueError(f"{self.where}: {name} has dtype {t.dtype} but tensor has {like.dtype}")
            if same_shape and t.shape != like.shape:
                raise ValueError(f"{self.where}: {name} has shape {list(t.shape)} but tensor has "
                                 f"shape {list(like.shape)}")

    def check_list(self, name, tensors, like, same_shape=True):
        if not isinstance(tensors, (list, tuple)):
            raise TypeError(f"{self.where}: {name} must be a list of tensors, got {type(tensors).__name__}")
        if self.member and len(tensors) != self.size:
            raise ValueError(f"{self.where}: {name} must hold one tensor per rank of the group "
                             f"({self.size}), got {len(tensors)}")
        for i, t in enumerate(tensors):
            self.check_tensor(f"{name}[{i}]", t, like, same_shape)

    def check_root_list(self, name, tensors, root_name, root, role, like):
        """A list only the root passes: scatter_list on src, gather_list on dst."""
        if self.me == root:
            if tensors is None:
                raise ValueError(f"{self.where}: {name} is required on the {role} rank {root}")
            self.check_list(name, tensors, like)
        elif tensors:
            raise ValueError(f"{self.where}: {name} must not be given on non-{role} ranks "
                             f"(this is rank {self.me}, {root_name}={root})")

    def check_root(self, name, root, group_root=None, default=None):
        """The root as a group rank, from ``name`` (a global rank) or ``group_<name>`` (a group
        rank), as torch takes them; ``default`` where torch has one (gather, scatter: 0)."""
        group_name = f"group_{name}"
        if group_root is not None:
            if root is not None:
                raise ValueError(f"{self.where}: give {name} (a global rank) or {group_name} "
                                 f"(a rank of the group), not both")
            if isinstance(group_root, bool) or not isinstance(group_root, int):
                raise TypeError(f"{self.where}: {group_name} must be an int (a rank of the group), "
                                f"got {type(group_root).__name__}")
            if not 0 <= group_root < self.size:
                raise ValueError(f"{self.where}: {group_name}={group_root} is out of range for a group "
                                 f"of {self.size} ranks")
            return group_root
        if root is None:
            root = default
        if root is None:
            raise ValueError(f"{self.where}: {name} (a global rank) or {group_name} (a rank of the "
                             f"group) is required")
        if isinstance(root, bool) or not isinstance(root, int):
            raise TypeError(f"{self.where}: {name} must be an int (a global rank), got {type(root).__name__}")
        world = dist.get_world_size() if isinstance(self.info.transport, dist.ProcessGroup) else None
        if world is not None and not 0 <= root < world:
            raise ValueError(f"{self.where}: {name}={root} is out of range for a world of {world} ranks")
        if root not in self.ranks:
            raise ValueError(f"{self.where}: {name}={root} is not a member of the group (ranks {self.ranks})")
        return self.ranks.index(root)

    def op(self, op, dtype):
        return reduce_ops.resolve(op, dtype, self.where)

    # -- 2. choose -----------------------------------------------------------------

    def choose(self, nbytes):
        return self.algorithm or tuning.choose(self.collective, nbytes, self.size)

    # -- 3. buffers ----------------------------------------------------------------

    def stage(self, t, copy_in=True):
        """``copy_in=False`` for outputs the collective only writes: nothing to copy over."""
        return _Staged(t, self if t.is_cuda and not self.cuda_direct else None, copy_in)

    def inputs(self, tensors, outputs):
        """Flat, sendable inputs, each read from a private copy if it overlaps an output.

        Torch's collectives read every input before writing any output, so
        ``all_to_all(x, x)`` or ``all_gather(out, out[rank])`` mean "the values
        before the call". Our algorithms interleave reads and writes, so an input
        that shares memory with an output is copied first (only then: the check
        compares storage spans, no data).
        """
        spans = {}
        for o in outputs:
            if o.numel():
                spans.setdefault(_storage(o), []).append(_span(o))
        flats = []
        for t in tensors:
            staged = self.stage(t).flat
            if spans and t.numel() and staged.data_ptr() == t.data_ptr():  # not already a copy
                lo, hi = _span(t)
                if any(lo < b and a < hi for a, b in spans.get(_storage(t), ())):
                    staged = staged.clone()
            flats.append(staged)
        return flats

    def ready(self):
        """Wait, once, for every staging copy issued since the last wait.

        With several processes sharing one GPU every wait can cost a GPU time
        slice (measured on an H100: ~300 us per 1 KiB copy with 4 processes), so
        the copies are issued without waiting and waited for together.
        """
        if self.copies_in_flight:
            torch.cuda.current_stream().synchronize()
            self.copies_in_flight = False


def _storage(t):
    return (t.device, t.untyped_storage().data_ptr())


def _span(t):
    """The bytes a (possibly strided) view can touch: [first, last + 1)."""
    start = t.data_ptr()
    extent = sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if n > 0) + 1
    return start, start + extent * t.element_size()


def _describe(collective, algorithm, fields):
    """``all_reduce(op=SUM, shape=[4], dtype=float32, algorithm=ring)``: what every rank
    of a correct program agrees on; it goes into every message's tag."""
    return debug.describe(collective, algorithm, {k: debug._show(k, v) for k, v in fields.items()
                                                  if k not in ("sends", "recvs")})


def _run(call: _Call, algo: str, body, async_op: bool, nbytes: int, local=None, **fields):
    """Steps 3 and 4: run ``body(comm)`` (it returns the output tensors) on the group's lane.

    ``local()`` is the whole collective on a group of one (at most a copy).
    ``fields`` fingerprint the call (op, shape, dtype, root; for all_to_all the
    element counts): they name it in tags and errors, and ``COLLECTIVES_DEBUG=1``
    compares them before any data moves.
    """
    info, collective = call.info, call.collective
    description = _describe(collective, algo, fields)
    debug_on = debug.enabled()

    def execute(seq):
        start = time.time()
        profiling = torch.autograd._profiler_enabled()
        with (torch.profiler.record_function(f"collectives.{collective}({algo})") if profiling
              else contextlib.nullcontext()), \
             (torch.cuda.device(call.device) if call.device is not None else contextlib.nullcontext()):
            # the lane's thread has its own current CUDA device: use the tensor's
            if call.size == 1:
                outputs = local()
            else:
                comm = Comm(info, collective, algo, seq, description, call.timeout)
                try:
                    if debug_on:
                        debug.check_agreement(comm, fields)
                    outputs = body(comm)
                except CollectiveError as exc:
                    # a timeout, or a peer that closed the connection after its own timeout
                    if isinstance(exc, debug.DesyncError) or exc.peer is None:
                        raise
                    raise debug.explain_timeout(comm, exc) from exc
                call.ready()  # the results' copies back to the GPU
        if watched():
            report_call(Call(collective, algo, seq, tuple(call.ranks), info.rank, nbytes, start, time.time()))
        return outputs
    work = engine().submit(execute, f"{collective}({algo})", async_op, info.key)
    return work if async_op else None  # blocking calls return None, as torch's do


class _Staged:
    """A flat, contiguous, sendable stand-in for a tensor, written back on ``done()``.

    Contiguous tensors on a device the backend sends are used as they are
    (a flat view, no copy). Non-contiguous tensors are copied into a
    contiguous buffer; CUDA tensors on a gloo group are copied to host memory.
    """

    def __init__(self, t, host_for=None, copy_in=True):
        self.t, self.host_for = t, host_for
        src = t.detach()
        if host_for is not None:
            # Pinned memory from torch's caching host allocator: reused across calls, and
            # copied at full PCIe speed. A fresh pageable buffer per call (src.to("cpu"))
            # measured 1.5-2.5x slower on an H100 at 16 MiB, and twice as noisy.
            host = torch.empty(src.shape, dtype=src.dtype, device="cpu", pin_memory=True)
            if copy_in:
                host.copy_(src, non_blocking=True)  # waited for by host_for.ready()
                host_for.copies_in_flight = True
            self.flat, self.copied = host.view(-1), True
        elif src.is_contiguous():
            self.flat, self.copied = (src if src.dim() == 1 else src.view(-1)), False
        else:
            buf = src.contiguous() if copy_in else torch.empty(src.shape, dtype=src.dtype, device=src.device)
            self.flat, self.copied = buf.view(-1), True

    def done(self):
        if self.copied:
            with torch.no_grad():
                self.t.copy_(self.flat.view(self.t.shape), non_blocking=self.host_for is not None)
            if self.host_for is not None:
                self.host_for.copies_in_flight = True
        return self.t


def _copy(dst, src):
    """dst <- src for a group of one (no autograd: collectives write results in place)."""
    with torch.no_grad():
        dst.copy_(src.reshape(dst.shape))


def _nbytes(t):
    return t.numel() * t.element_size()


def _shapes(tensors):
    """A list's shapes for a fingerprint: ``4x[2, 3]`` when they agree."""
    shapes = [list(t.shape) for t in tensors]
    return f"{len(shapes)}x{shapes[0]}" if shapes and all(s == shapes[0] for s in shapes) else shapes


def broadcast(tensor: torch.Tensor, src: Optional[int] = None, group: Group = None, async_op: bool = False,
              algorithm: Optional[str] = None, group_src: Optional[int] = None) -> Optional[Work]:
    """Send ``tensor`` from rank ``src`` to every rank of the group, in place.

    Args:
        tensor (Tensor): Data to send on ``src``; where the result lands on the others.
        src (int): Global rank of the source.
        group (ProcessGroup, optional): Group to work on; None for the whole world.
        async_op (bool, optional): Return a handle instead of blocking.
        algorithm (str, optional): One of ``ALGORITHMS["broadcast"]``; None picks by size.
        group_src (int, optional): The source as a rank of ``group``, instead of ``src``.

    Returns:
        A handle with ``wait()`` if ``async_op``, else None; None on ranks outside the group.

    Example::

        >>> t = torch.arange(2) + 1 + 2 * rank if rank == 0 else torch.zeros(2, dtype=torch.int64)
        >>> collectives.broadcast(t, src=0)
        >>> t
        tensor([1, 2])  # Rank 0
        tensor([1, 2])  # Rank 1
    """
    call = _Call("broadcast", group, algorithm)
    call.check_tensor("tensor", tensor)
    if not call.member:
        return None
    root = call.check_root("src", src, group_src)
    algo = call.choose(_nbytes(tensor))

    def body(comm):
        buf = call.stage(tensor)
        call.ready()
        REGISTRY["broadcast"][algo](comm, buf.flat, root)
        return [buf.done()]
    return _run(call, algo, body, async_op, _nbytes(tensor), local=lambda: [tensor],
                src=call.ranks[root], shape=list(tensor.shape), dtype=tensor.dtype)


def reduce(tensor: torch.Tensor, dst: Optional[int] = None, op: ReduceOp = ReduceOp.SUM, group: Group = None,
           async_op: bool = False, algorithm: Optional[str] = None,
           group_dst: Optional[int] = None) -> Optional[Work]:
    """Reduce ``tensor`` across the group into rank ``dst``'s ``tensor``.

    Other ranks' tensors are left unchanged.

    Args:
        tensor (Tensor): Input on every rank; the result on ``dst``.
        dst (int): Global rank that receives the result.
        op (ReduceOp, optional): SUM, PRODUCT, MIN, MAX, AVG, BAND, BOR or BXOR.
        group, async_op, algorithm: As in :func:`broadcast`.
        group_dst (int, optional): The destination as a rank of ``group``, instead of ``dst``.

    Returns:
        A handle if ``async_op``, else None.

    Example::

        >>> t = torch.tensor([rank + 1.0])
        >>> collectives.reduce(t, dst=0)
        >>> t
        tensor([3.])  # Rank 0 (world of 2: 1 + 2)
        tensor([2.])  # Rank 1 (unchanged)
    """
    call = _Call("reduce", group, algorithm)
    call.check_tensor("tensor", tensor)
    red = call.op(op, tensor.dtype)
    if not call.member:
        return None
    root = call.check_root("dst", dst, group_dst)
    algo = call.choose(_nbytes(tensor))

    def body(comm):
        buf = call.stage(tensor)
        call.ready()
        REGISTRY["reduce"][algo](comm, buf.flat, root, red)
        if comm.rank == root:
            if red.average:
                buf.flat.div_(comm.size)
            buf.done()
        return [tensor]
    return _run(call, algo, body, async_op, _nbytes(tensor), local=lambda: [tensor],
                dst=call.ranks[root], op=red.name, shape=list(tensor.shape), dtype=tensor.dtype)


def all_reduce(tensor: torch.Tensor, op: ReduceOp = ReduceOp.SUM, group: Group = None,
               async_op: bool = False, algorithm: Optional[str] = None) -> Optional[Work]:
    """Reduce ``tensor`` across the group; every rank gets the result, in place.

    Every rank ends with bitwise the same tensor, whatever the algorithm.

    Args:
        tensor (Tensor): Input and output of the collective.
        op (ReduceOp, optional): SUM, PRODUCT, MIN, MAX, AVG, BAND, BOR or BXOR.
        group, async_op, algorithm: As in :func:`broadcast`.

    Returns:
        A handle if ``async_op``, else None.

    Example::

        >>> t = torch.tensor([rank + 1, rank + 1])
        >>> collectives.all_reduce(t, algorithm="ring")
        >>> t
        tensor([3, 3])  # Rank 0
        tensor([3, 3])  # Rank 1
    """
    call = _Call("all_reduce", group, algorithm)
    call.check_tensor("tensor", tensor)
    red = call.op(op, tensor.dtype)
    if not call.member:
        return None
    algo = call.choose(_nbytes(tensor))

    def body(comm):
        buf = call.stage(tensor)
        call.ready()
        REGISTRY["all_reduce"][algo](comm, buf.flat, red)
        if red.average:
            buf.flat.div_(comm.size)
        return [buf.done()]
    return _run(call, algo, body, async_op, _nbytes(tensor), local=lambda: [tensor],
                op=red.name, shape=list(tensor.shape), dtype=tensor.dtype)


def scatter(tensor: torch.Tensor, scatter_list: Optional[List[torch.Tensor]] = None, src: Optional[int] = None,
            group: Group = None, async_op: bool = False, algorithm: Optional[str] = None,
            group_src: Optional[int] = None) -> Optional[Work]:
    """Send ``scatter_list[i]`` of rank ``src`` to rank i's ``tensor``.

    Args:
        tensor (Tensor): Output on every rank.
        scatter_list (list[Tensor], optional): On ``src`` only: one tensor per rank
            of the group, each shaped like ``tensor``.
        src (int, optional): Global rank of the source (0 if neither it nor ``group_src`` is given).
        group, async_op, algorithm: As in :func:`broadcast`.
        group_src (int, optional): The source as a rank of ``group``, instead of ``src``.

    Returns:
        A handle if ``async_op``, else None.

    Example::

        >>> t = torch.zeros(1)
        >>> pieces = [torch.tensor([1.0]), torch.tensor([2.0])] if rank == 0 else None
        >>> collectives.scatter(t, pieces, src=0)
        >>> t
        tensor([1.])  # Rank 0
        tensor([2.])  # Rank 1
    """
    call = _Call("scatter", group, algorithm)
    call.check_tensor("tensor", tensor)
    if not call.member:
        return None
    root = call.check_root("src", src, group_src, default=0)
    call.check_root_list("scatter_list", scatter_list, "src", call.ranks[root], "source", tensor)
    algo = call.choose(_nbytes(tensor) * call.size)

    def body(comm):
        out = call.stage(tensor, copy_in=False)
        pieces = call.inputs(scatter_list, [tensor]) if comm.rank == root else None
        call.ready()
        REGISTRY["scatter"][algo](comm, out.flat, pieces, root)
        return [out.done()]

    def local():
        _copy(tensor, scatter_list[0])
        return [tensor]
    return _run(call, algo, body, async_op, _nbytes(tensor) * call.size, local=local,
                src=call.ranks[root], shape=list(tensor.shape), dtype=tensor.dtype)


def gather(tensor: torch.Tensor, gather_list: Optional[List[torch.Tensor]] = None, dst: Optional[int] = None,
           group: Group = None, async_op: bool = False, algorithm: Optional[str] = None,
           group_dst: Optional[int] = None) -> Optional[Work]:
    """Collect every rank's ``tensor`` into ``gather_list`` on rank ``dst``.

    Args:
        tensor (Tensor): Input on every rank.
        gather_list (list[Tensor], optional): On ``dst`` only: one tensor per rank
            of the group, each shaped like ``tensor``, filled in group-rank order.
        dst (int, optional): Global rank of the destination (0 if neither it nor ``group_dst`` is given).
        group, async_op, algorithm: As in :func:`broadcast`.
        group_dst (int, optional): The destination as a rank of ``group``, instead of ``dst``.

    Returns:
        A handle if ``async_op``, else None.

    Example::

        >>> out = [torch.zeros(1), torch.zeros(1)] if rank == 0 else None
        >>> collectives.gather(torch.tensor([rank + 1.0]), out, dst=0)
        >>> out
        [tensor([1.]), tensor([2.])]  # Rank 0
        None                          # Rank 1
    """
    call = _Call("gather", group, algorithm)
    call.check_tensor("tensor", tensor)
    if not call.member:
        return None
    root = call.check_root("dst", dst, group_dst, default=0)
    call.check_root_list("gather_list", gather_list, "dst", call.ranks[root], "destination", tensor)
    algo = call.choose(_nbytes(tensor) * call.size)

    def body(comm):
        at_root = comm.rank == root
        inp = call.inputs([tensor], gather_list if at_root else ())[0]
        outs = [call.stage(t, copy_in=False) for t in gather_list] if at_root else None
        call.ready()
        REGISTRY["gather"][algo](comm, inp, [o.flat for o in outs] if outs else None, root)
        return [o.done() for o in outs] if outs else []

    def local():
        _copy(gather_list[0], tensor)
        return list(gather_list)
    return _run(call, algo, body, async_op, _nbytes(tensor) * call.size, local=local,
                dst=call.ranks[root], shape=list(tensor.shape), dtype=tensor.dtype)


def all_gather(tensor_list: List[torch.Tensor], tensor: torch.Tensor, group: Group = None,
               async_op: bool = False, algorithm: Optional[str] = None) -> Optional[Work]:
    """Collect every rank's ``tensor`` into ``tensor_list`` on every rank.

    Args:
        tensor_list (list[Tensor]): Output: one tensor per rank of the group,
            each shaped like ``tensor``, filled in group-rank order.
        tensor (Tensor): Input on every rank (unchanged).
        group, async_op, algorithm: As in :func:`broadcast`.

    Returns:
        A handle if ``async_op``, else None.

    Example::

        >>> out = [torch.zeros(1), torch.zeros(1)]
        >>> collectives.all_gather(out, torch.tensor([rank + 1.0]))
        >>> out
        [tensor([1.]), tensor([2.])]  # Rank 0
        [tensor([1.]), tensor([2.])]  # Rank 1
    """
    call = _Call("all_gather", group, algorithm)
    call.check_tensor("tensor", tensor)
    call.check_list("tensor_list", tensor_list, tensor)
    if not call.member:
        return None
    algo = call.choose(_nbytes(tensor) * call.size)

    def body(comm):
        inp = call.inputs([tensor], tensor_list)[0]
        outs = [call.stage(t, copy_in=False) for t in tensor_list]
        call.ready()
        REGISTRY["all_gather"][algo](comm, [o.flat for o in outs], inp)
        return [o.done() for o in outs]

    def local():
        _copy(tensor_list[0], tensor)
        return list(tensor_list)
    return _run(call, algo, body, async_op, _nbytes(tensor) * call.size, local=local,
                shape=_shapes(tensor_list), dtype=tensor.dtype)


def reduce_scatter(output: torch.Tensor, input_list: List[torch.Tensor], op: ReduceOp = ReduceOp.SUM,
                   group: Group = None, async_op: bool = False,
                   algorithm: Optional[str] = None) -> Optional[Work]:
    """Reduce ``input_list`` across the group; rank i gets the reduction of entry i.

    Args:
        output (Tensor): Output on every rank.
        input_list (list[Tensor]): One tensor per rank of the group, each shaped
            like ``output`` (unchanged).
        op (ReduceOp, optional): SUM, PRODUCT, MIN, MAX, AVG, BAND, BOR or BXOR.
        group, async_op, algorithm: As in :func:`broadcast`.

    Returns:
        A handle if ``async_op``, else None.

    Example::

        >>> out = torch.zeros(1)
        >>> collectives.reduce_scatter(out, [torch.tensor([1.0]), torch.tensor([10.0])])
        >>> out
        tensor([2.])   # Rank 0 (world of 2)
        tensor([20.])  # Rank 1
    """
    call = _Call("reduce_scatter", group, algorithm)
    call.check_tensor("output", output)
    call.check_list("input_list", input_list, output)
    red = call.op(op, output.dtype)
    if not call.member:
        return None
    algo = call.choose(_nbytes(output) * call.size)

    def body(comm):
        ins = call.inputs(input_list, [output])
        out = call.stage(output, copy_in=False)
        call.ready()
        REGISTRY["reduce_scatter"][algo](comm, out.flat, ins, red)
        if red.average:
            out.flat.div_(comm.size)
        return [out.done()]

    def local():
        _copy(output, input_list[0])
        return [output]
    return _run(call, algo, body, async_op, _nbytes(output) * call.size, local=local,
                op=red.name, shape=_shapes(input_list), dtype=output.dtype)


def all_to_all(output_tensor_list: List[torch.Tensor], input_tensor_list: List[torch.Tensor],
               group: Group = None, async_op: bool = False,
               algorithm: Optional[str] = None) -> Optional[Work]:
    """Rank i sends ``input_tensor_list[j]`` to rank j, which stores it in ``output_tensor_list[i]``.

    Args:
        output_tensor_list (list[Tensor]): One tensor per rank of the group; entry j
            must match the size of what rank j sends here.
        input_tensor_list (list[Tensor]): One tensor per rank of the group (unchanged).
        group, async_op, algorithm: As in :func:`broadcast`.

    Returns:
        A handle if ``async_op``, else None.

    Example::

        >>> ins = [torch.tensor([10 * rank + j]) for j in range(2)]
        >>> outs = [torch.zeros(1, dtype=torch.int64) for _ in range(2)]
        >>> collectives.all_to_all(outs, ins)
        >>> outs
        [tensor([0]), tensor([10])]  # Rank 0
        [tensor([1]), tensor([11])]  # Rank 1
    """
    call = _Call("all_to_all", group, algorithm)
    if not isinstance(input_tensor_list, (list, tuple)) or not input_tensor_list:
        raise TypeError(f"{call.where}: input_tensor_list must be a non-empty list of tensors")
    call.check_tensor("input_tensor_list[0]", input_tensor_list[0])
    like = input_tensor_list[0]
    call.check_list("input_tensor_list", input_tensor_list, like, same_shape=False)
    call.check_list("output_tensor_list", output_tensor_list, like, same_shape=False)
    if not call.member:
        return None
    algo = call.choose(sum(_nbytes(t) for t in input_tensor_list))

    def body(comm):
        ins = call.inputs(input_tensor_list, output_tensor_list)
        outs = [call.stage(t, copy_in=False) for t in output_tensor_list]
        call.ready()
        REGISTRY["all_to_all"][algo](comm, [o.flat for o in outs], ins)
        return [o.done() for o in outs]

    def local():
        _copy(output_tensor_list[0], input_tensor_list[0])
        return list(output_tensor_list)
    return _run(call, algo, body, async_op, sum(_nbytes(t) for t in input_tensor_list), local=local,
                dtype=like.dtype, sends=[t.numel() for t in input_tensor_list],
                recvs=[t.numel() for t in output_tensor_list])


def barrier(group: Group = None, async_op: bool = False, algorithm: Optional[str] = None) -> Optional[Work]:
    """Block until every rank of the group has entered the barrier.

    Args:
        group, async_op, algorithm: As in :func:`broadcast`.

    Returns:
        A handle if ``async_op``, else None.

    Example::

        >>> collectives.barrier()   # Rank 0 and Rank 1 both return only after both called it
    """
    call = _Call("barrier", group, algorithm)
    if call.cuda_direct and torch.cuda.is_available():
        # no tensor names a device: the token goes to the caller's current GPU
        call.device = torch.device("cuda", torch.cuda.current_device())
    if not call.member:
        return None
    algo = call.choose(0)

    def body(comm):
        REGISTRY["barrier"][algo](comm)
        return []
    return _run(call, algo, body, async_op, 0, local=lambda: [])


__all__ = ["broadcast", "reduce", "all_reduce", "scatter", "gather", "all_gather", "reduce_scatter",
           "all_to_all", "barrier"]
