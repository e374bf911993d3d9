"""The call machinery: what happens to every collective call between its public function
and its algorithm, written once.

1. **validate** (:class:`CallState`): tensors, lists, roots, op, algorithm name, on the
   calling rank, before any message moves: a bad argument raises there, clearly, on
   every rank that passed it, instead of deadlocking the others;
2. **choose** the algorithm (``algorithm=``, or ``tuning.choose`` by the group's size
   and the call's total bytes);
3. **run** it (:func:`run`) on the group's lane of the engine (in issue order per
   group, async or blocking), with buffers chosen so that aliased arguments give
   torch's answer (an input that overlaps an output is read from a private copy),
   staging what the transport cannot send directly (:class:`Staged`), a desync check
   when asked for, the timeout explained when one expires, a profiler range and a
   call record for the tracers;
4. **hand back** None (blocking) or a :class:`~collectives.engine.Work` whose future's
   value is the list of output tensors, as torch's is.

``collectives.api``, ``collectives.tensor_api`` and the torch backend all come
through here: there is no second path to the algorithms.
"""
from __future__ import annotations

import contextlib
import functools
import time

import torch
import torch.distributed as dist

from . import desync, flight_recorder, observers, reduce_ops, settings, tuning
from .algorithms import ALGORITHMS, MODULES
from .tuning import agreed
from .engine import engine
from .errors import CollectiveError, DesyncError
from .group import group_info
from .observers import CallRecord
from .p2p_communications import Comm, hosts_of


class CallState:
    """One call's group, validation and staging (steps 1 and 3 of the module's path)."""

    def __init__(self, collective, group, algorithm):
        self.collective = collective
        self.where = f"collectives.{collective}"
        info = group_info(group, self.where)
        if algorithm is not None and algorithm not in ALGORITHMS[collective]:
            raise ValueError(f"{self.where}: unknown algorithm={algorithm!r}; valid: "
                             f"{', '.join(ALGORITHMS[collective])}")
        self.timeout = settings.timeout_seconds()  # a bad COLLECTIVES_TIMEOUT fails here, before any message
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
        check_tensor(self.where, name, t)
        kind = t.device.type
        if kind == "cpu" and not self.cpu_ok:
            raise ValueError(f"{self.where}: {name} is on the CPU, which the nccl backend cannot "
                             f"send; move it to this rank's GPU or use a gloo group")
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

    def root_and_list(self, name, root, group_root, list_name, tensors, role, like):
        """Scatter's and gather's roots: the root as a group rank (default 0, as torch's), and
        the list only the root passes (``scatter_list``, ``gather_list``), checked."""
        index = self.check_root(name, root, group_root, default=0)
        self.check_root_list(list_name, tensors, name, self.ranks[index], role, like)
        return index

    def op(self, op, dtype):
        return reduce_ops.reduction(op, dtype, self.where)

    # -- 2. choose -----------------------------------------------------------------

    def choose(self, nbytes):
        """The algorithm given, or None: :func:`run` then chooses by ``nbytes`` from the tables
        every member agreed on (:mod:`collectives.tuning.agreed`), when the call runs.

        ``nbytes`` must be the same on every member (the call's total, never this rank's share);
        None where no rank knows it (an all_to_all's pieces may differ per rank): the choice
        then depends on the group's size alone.
        """
        self.choice_bytes = nbytes
        if self.algorithm is not None:
            try:
                self._check_layout(self.algorithm)
            except ValueError as exc:
                raise ValueError(f"{self.where}: {exc}") from None
        return self.algorithm

    def agreed_choice(self):
        """``algorithm=None``'s pick, from the tables every member agreed on at the group's
        first call (:mod:`collectives.tuning.agreed`)."""
        nbytes = self.choice_bytes or 0
        tables = agreed.tables_of(self.info) if self.size > 1 else None
        algo = tuning.choose(self.collective, nbytes, self.size, tables)
        try:
            self._check_layout(algo)
        except ValueError:     # a measured table's pick that does not fit here
            return tuning.rule_of_thumb(self.collective, nbytes, self.size)
        return algo

    def _check_layout(self, algo):
        """An algorithm that needs a layout (hierarchical: whole hosts) refuses one that does not
        fit here, on every rank alike (all derive the same hosts)."""
        check = getattr(MODULES[self.collective][algo], "check", None)
        if check is not None and self.member and self.size > 1:
            check(self.size, self.info.rank, hosts_of(self.ranks))

    # -- 3. buffers ----------------------------------------------------------------

    def stage(self, t, copy_in=True):
        """``copy_in=False`` for outputs the collective only writes: nothing to copy over."""
        return Staged(t, self if t.is_cuda and not self.cuda_direct else None, copy_in)

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


def check_tensor(where, name, t):
    """A dense tensor on a device a transport can send (CPU or CUDA): the check every caller
    of the machinery, the torch backend included, makes before anything else."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{where}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.layout != torch.strided:
        raise ValueError(f"{where}: {name} has layout {t.layout}; only dense (strided) "
                         f"tensors can be sent")
    if t.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{where}: {name} is on device {t.device}, which the backend "
                         f"cannot send (CPU and CUDA tensors only)")


def _storage(t):
    return (t.device, t.untyped_storage().data_ptr())


def _span(t):
    """The bytes a (possibly strided) view can touch: [first, last + 1)."""
    start = t.data_ptr()
    extent = sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if n > 0) + 1
    return start, start + extent * t.element_size()


def run(call: CallState, algo: str, body, async_op: bool, nbytes: int, local=None, lane=None, peers=None,
        door_name=None, **fields):
    """Steps 3 and 4: run ``body(comm)`` (it returns the output tensors) on a lane of the engine.

    ``local()`` is the whole collective on a group of one (at most a copy).
    ``fields`` fingerprint the call (op, shape, dtype, root; for all_to_all the
    element counts): they name it in tags and errors, and ``COLLECTIVES_DEBUG=1``
    compares them before any data moves.

    A collective involves the whole group and runs on the group's lane. A point-to-point
    message (:mod:`collectives.p2p_api`) involves two ranks: ``peers`` names them (group
    ranks), ``lane`` is the lane that numbers that direction's messages, and ``door_name``
    the name its messages carry (one name on both ends, so traces pair them). Either way the
    call gets the same profiler range, group timeout, records and explained timeouts.
    """
    info, collective = call.info, call.collective
    check_first = desync.enabled() and peers is None
    involved = tuple(range(call.size)) if peers is None else tuple(peers)

    # the flight recorder's entry: scheduled now, started and completed on the lane
    entry = flight_recorder.record(info, door_name or collective, algo or "automatic",
                                   functools.partial(desync.describe, door_name or collective, algo, fields),
                                   fields, None if peers is None else tuple(peers), call.timeout)
    flight_recorder.arm(info.store)

    def door(seq, name, algorithm, description):
        comm = Comm(info, name, algorithm, seq, description, call.timeout, involved=involved, lane=lane)
        comm.record = entry
        agreement = agreed.known(info)
        if agreement is not None:
            comm.pids = agreement.local_pids
        return comm

    def explained(comm, exc):
        if not isinstance(exc, DesyncError) and exc.peer is not None:
            exc = desync.explain_timeout(comm, exc)
        flight_recorder.on_timeout(exc)
        return exc

    def execute(seq):
        nonlocal algo
        if peers is None and call.size > 1 and agreed.known(info) is None:
            # the group's first call: agree on tables, settings and hosts over our own messages
            # (its messages pair whatever first call each rank made: the desync check or the
            # call's own tags catch a mismatch, and the group stays usable)
            comm = Comm(info, door_name or collective, observers.AGREEMENT, seq,
                        f"the group's agreement before {desync.describe(door_name or collective, None, fields)}",
                        call.timeout, involved=involved, lane=lane, tag_text="agreement")
            comm.record = entry
            try:
                agreed.of(info, lambda: comm)
            except CollectiveError as exc:
                raise explained(comm, exc) from exc
        if algo is None:  # algorithm=None: chosen here, in issue order, from the group's agreed tables
            algo = call.agreed_choice()
        description = desync.describe(door_name or collective, algo, fields)
        flight_recorder.started(entry, algo, description)
        start = time.time()
        profiling = torch.autograd._profiler_enabled()
        with (torch.profiler.record_function(f"collectives.{collective}({algo})") if profiling
              else contextlib.nullcontext()), \
             (torch.cuda.device(call.device) if call.device is not None else contextlib.nullcontext()):
            # the lane's thread has its own current CUDA device: use the tensor's
            if call.size == 1:
                outputs = local()
            else:
                comm = door(seq, door_name or collective, algo, description)
                try:
                    if check_first:
                        desync.check_agreement(comm, fields)
                    outputs = body(comm)
                except CollectiveError as exc:
                    # a timeout, or a peer that closed the connection after its own timeout
                    raise explained(comm, exc) from exc
                call.ready()  # the results' copies back to the GPU
        flight_recorder.completed(entry)
        if observers.watched():
            observers.report_call(CallRecord(collective, algo, seq, tuple(info.ranks[p] for p in involved),
                                             info.rank, nbytes, start, time.time()))
        return outputs
    name = f"{collective}({algo or 'automatic'})"
    work = engine().submit(execute, name, async_op, lane or info.key, info.transport)
    return work if async_op else None  # blocking calls return None, as torch's do


def run_in_place(call, algo, tensor, step, async_op, **fields):
    """``run`` for the collectives that work on one tensor in place on every rank (broadcast,
    all_reduce): stage it, ``step(comm, flat)``, write it back."""
    def body(comm):
        buf = call.stage(tensor)
        call.ready()
        step(comm, buf.flat)
        return [buf.done()]
    return run(call, algo, body, async_op, nbytes(tensor), local=lambda: [tensor],
               **fields, shape=list(tensor.shape), dtype=tensor.dtype)


class Staged:
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


def copy_local(dst, src):
    """dst <- src for a group of one (no autograd: collectives write results in place)."""
    with torch.no_grad():
        dst.copy_(src.reshape(dst.shape))


def nbytes(t):
    return t.numel() * t.element_size()


def shapes(tensors):
    """A list's shapes for a fingerprint: ``4x[2, 3]`` when they agree."""
    shapes = [list(t.shape) for t in tensors]
    return f"{len(shapes)}x{shapes[0]}" if shapes and all(s == shapes[0] for s in shapes) else shapes


