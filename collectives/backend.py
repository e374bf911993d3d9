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
store, rank and size. It returns a :class:`CollectivesBackend`, a Python
subclass of torch's C++ ``Backend``; torch's ``ProcessGroup`` then calls its
methods (``allreduce``, ``all_gather_single``, ...) for every collective on
that group. Each method validates what our algorithms cannot do (naming the
operation and the reason), queues the algorithm on our communication thread
(``engine``), so collectives run in issue order, and returns a torch ``Work``
wrapping a ``torch.futures.Future`` whose value is the list of output tensors,
which is what DDP's reducer, comm hooks and FSDP2 read.

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
import datetime
import os
import threading

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend as _C10dBackend
from torch._C._distributed_c10d import PrefixStore, ProcessGroupGloo

from . import debug, reduce_ops, tuning
from .algorithms import ALGORITHMS, REGISTRY
from .engine import engine
from .p2p_communications import Comm, timeout_seconds

NAME = "collectives"
ENV_ALGO = "COLLECTIVES_ALGO"


from torch._C._distributed_c10d import Work as _C10dWork


def parse_algorithms(text, where=ENV_ALGO):
    """``"all_reduce:ring,broadcast:binomial_tree"`` -> ``{"all_reduce": "ring", ...}``.

    Raises ValueError naming the bad entry and the valid names.

    Example::

        >>> parse_algorithms("all_reduce:ring, all_gather:recursive_doubling")
        {'all_reduce': 'ring', 'all_gather': 'recursive_doubling'}
    """
    chosen = {}
    for entry in (text or "").split(","):
        entry = entry.strip()
        if not entry:
            continue
        collective, sep, algorithm = (s.strip() for s in entry.partition(":"))
        if not sep or not algorithm:
            raise ValueError(f"{where}: entry {entry!r} must read collective:algorithm, "
                             f"e.g. all_reduce:ring")
        if collective not in ALGORITHMS:
            raise ValueError(f"{where}: unknown collective {collective!r} in {entry!r}; "
                             f"valid: {', '.join(ALGORITHMS)}")
        if algorithm not in ALGORITHMS[collective]:
            raise ValueError(f"{where}: unknown algorithm {algorithm!r} for {collective}; "
                             f"valid: {', '.join(ALGORITHMS[collective])}")
        chosen[collective] = algorithm
    return chosen


class BackendWork(_C10dWork):
    """torch's ``Work`` for one of our collectives: ``wait()`` raises its error.

    torch's own ``_create_work_from_future`` would do for DDP (which reads the
    future) but its ``wait()`` returns normally when the future holds an error,
    so a timed-out ``dist.all_reduce`` would look like a success. torch calls
    ``wait`` and ``get_future`` on a Python subclass (its C++ side forwards both).
    """

    def __init__(self, future, description):
        super().__init__()
        self._future, self._description = future, description
        self._done = threading.Event()
        future.add_done_callback(lambda _: self._done.set())

    def wait(self, timeout=None):
        """Block until done and raise its error; ``timeout`` (a timedelta or seconds) bounds the wait."""
        if isinstance(timeout, datetime.timedelta):
            timeout = timeout.total_seconds()
        if not self._done.wait(timeout if timeout and timeout > 0 else None):
            raise TimeoutError(f"collectives backend: {self._description} did not finish within "
                               f"{timeout:g} s (wait(timeout=...))")
        self._future.wait()          # raises the collective's error, if any
        return True

    def get_future(self):
        return self._future

    def is_completed(self):
        return self._done.is_set()

    def is_success(self):
        return self._done.is_set() and self.exception() is None

    def exception(self):
        if not self._done.is_set():
            return None
        try:
            self._future.wait()
        except Exception as exc:
            return exc
        return None

    def result(self):
        return self._future.wait()


class UnsupportedOperation(RuntimeError):
    """An operation or tensor the ``collectives`` backend cannot carry (never a silent fallback)."""


def _unsupported(op, reason):
    return UnsupportedOperation(f"collectives backend: {op}: {reason}")


class _Staged:
    """A flat, contiguous CPU stand-in for a tensor; ``done()`` writes it back.

    A contiguous CPU tensor is its own flat view (no copy); a non-contiguous
    one is copied into a buffer, a CUDA one into host memory (gloo sends host
    memory only).
    """

    def __init__(self, t, copy_in=True):
        self.t = t
        src = t.detach()
        if src.device.type == "cpu" and src.is_contiguous():
            self.flat, self.copied = src.view(-1), False
            return
        if copy_in:
            buf = src.to("cpu", memory_format=torch.contiguous_format).contiguous()
        else:
            buf = torch.empty(src.shape, dtype=src.dtype)
        self.flat, self.copied = buf.view(-1), True

    def done(self):
        if self.copied:
            with torch.no_grad():
                self.t.copy_(self.flat.view(self.t.shape))


class CollectivesBackend(_C10dBackend):
    """torch's ``Backend`` interface, answered by our algorithms.

    Built by :func:`_create`; not meant to be constructed by hand. ``ranks``
    are the global ranks of the group in group-rank order.
    """

    def __init__(self, store, rank, size, timeout, ranks, group_name=""):
        super().__init__(rank, size)
        self._rank, self._size = rank, size
        self._ranks = list(ranks)
        self._me = self._ranks[rank]
        self._group_name = group_name
        self._timeout = timeout
        self._store = store
        self._algorithms = parse_algorithms(os.environ.get(ENV_ALGO, ""))
        # A prefixed copy of the store, so the inner transport's keys never meet
        # the ones torch (or another backend on this group) writes.
        self._transport = ProcessGroupGloo(PrefixStore(f"{NAME}/", store), rank, size, timeout)
        # The user's own send/recv get a transport of their own: tags are the only
        # thing gloo pairs messages by, and the door's tags could equal a user's.
        self._p2p_transport = ProcessGroupGloo(PrefixStore(f"{NAME}-p2p/", store), rank, size, timeout)
        self._lock = threading.Lock()

    # -- what torch asks about the backend -------------------------------------------------

    def getBackendName(self):  # noqa: N802 (torch's name)
        return NAME

    def name(self):
        return NAME

    @property
    def supports_splitting(self):
        return True

    @property
    def supports_coalescing(self):
        return False

    @property
    def options(self):
        """torch's ``Backend.Options`` for this group. Defined here because torch's
        own (2.15) asks the Python object for ``options`` and, finding only the
        C++ property, calls itself until Python's recursion limit (split_group)."""
        opts = _C10dBackend.Options(NAME, self._timeout)
        opts.global_ranks_in_group = self._ranks
        return opts

    @property
    def transport(self):
        """The inner point-to-point group (a ``ProcessGroupGloo``); only its send/recv are used."""
        return self._transport

    @property
    def ranks(self):
        """Global ranks of this group, in group-rank order."""
        return list(self._ranks)

    def shutdown(self):
        """Called by ``destroy_process_group``: finish what was issued, then close the transports.

        Closing them here, in the caller's thread, matters: a gloo group that
        outlives this point is destroyed at interpreter exit with its threads
        still running, and the process aborts ("terminate called without an
        active exception").
        """
        engine().drain()
        self.abort()

    def abort(self):
        for transport in (self._transport, self._p2p_transport):
            if transport is not None:
                transport.shutdown()
        self._transport = self._p2p_transport = None

    def split(self, store, ranks, opts):
        """A child backend for ``dist.split_group`` over the global ``ranks`` given."""
        if self._me not in ranks:
            return None
        timeout = getattr(opts, "_timeout", None) or self._timeout
        name = getattr(opts, "group_name", "") or ""
        return CollectivesBackend(store, ranks.index(self._me), len(ranks), timeout, ranks, name)

    # -- running one collective ------------------------------------------------------------

    def algorithm(self, collective, nbytes):
        """The algorithm this backend runs for ``collective`` on ``nbytes``."""
        return self._algorithms.get(collective) or tuning.choose(collective, nbytes, self._size)

    def _comm(self, collective, algorithm, opts):
        comm = Comm(self._transport, collective, algorithm, self._ranks, "gloo", self._me)
        limit = _timeout_of(opts, self._timeout)
        if limit is not None and not os.environ.get("COLLECTIVES_TIMEOUT"):
            comm.timeout = limit.total_seconds()
            comm.wait_limit = limit
        return comm

    def _launch(self, op, collective, nbytes, body, outputs, opts, fingerprint=None):
        """Queue ``body(comm)`` on the communication thread; return a torch Work.

        The Work's future holds ``outputs`` (a list of tensors) once the
        collective is done, or its error.
        """
        future = torch.futures.Future()
        algorithm = self.algorithm(collective, nbytes) if collective else "pass-through"
        # read now, in the caller's thread, so a bad value raises where the call was made
        timeout_seconds()
        debug_on = debug.enabled()

        def run():
            try:
                if self._size == 1 or collective is None:
                    body(None)
                else:
                    comm = self._comm(collective, algorithm, opts)
                    if debug_on:
                        debug.check_agreement(comm, dict(fingerprint or {}, op=op))
                    body(comm)
            except BaseException as exc:  # the future carries it to whoever waits
                future.set_exception(exc)
            else:
                future.set_result(outputs)
        description = f"{op}({algorithm})"
        engine().submit(run, description, async_op=True)
        return BackendWork(future, description)

    # -- the collectives -------------------------------------------------------------------

    def allreduce(self, tensors, opts=None):
        return self._allreduce("allreduce", tensors, opts)

    def allreduce_coalesced(self, tensors, opts=None):
        return self._allreduce("allreduce_coalesced", tensors, opts)

    def _allreduce(self, op, tensors, opts):
        _check_tensors(op, tensors)
        red = _op(op, opts, tensors)
        nbytes = max(t.nbytes for t in tensors) if tensors else 0
        algo = self.algorithm("all_reduce", nbytes)

        def body(comm):
            if comm is None:
                return
            for t in tensors:
                buf = _Staged(t)
                REGISTRY["all_reduce"][algo](comm, buf.flat, red)
                if red.average:
                    buf.flat.div_(comm.size)
                buf.done()
        return self._launch(op, "all_reduce", nbytes, body, list(tensors), opts,
                            dict(op_name=red.name, shapes=[list(t.shape) for t in tensors]))

    def broadcast(self, tensors, opts=None):
        op = "broadcast"
        _check_tensors(op, tensors)
        root = opts.rootRank

        def body(comm):
            if comm is None:
                return
            for t in tensors:
                buf = _Staged(t)
                REGISTRY["broadcast"][self.algorithm("broadcast", t.nbytes)](comm, buf.flat, root)
                buf.done()
        return self._launch(op, "broadcast", _most(tensors), body, list(tensors), opts,
                            dict(root=root, shapes=[list(t.shape) for t in tensors]))

    def reduce(self, tensors, opts=None):
        op = "reduce"
        _check_tensors(op, tensors)
        red = _op(op, opts, tensors)
        root = opts.rootRank

        def body(comm):
            if comm is None:
                return
            for t in tensors:
                buf = _Staged(t)
                REGISTRY["reduce"][self.algorithm("reduce", t.nbytes)](comm, buf.flat, root, red)
                if comm.rank == root:
                    if red.average:
                        buf.flat.div_(comm.size)
                    buf.done()
        return self._launch(op, "reduce", _most(tensors), body, list(tensors), opts,
                            dict(root=root, op_name=red.name))

    def allgather(self, output_lists, inputs, opts=None):
        return self._allgather("allgather", output_lists, inputs, opts)

    def allgather_coalesced(self, output_lists, inputs, opts=None):
        return self._allgather("allgather_coalesced", output_lists, inputs, opts)

    def _allgather(self, op, output_lists, inputs, opts):
        _check_tensors(op, inputs)
        if len(output_lists) != len(inputs):
            raise _unsupported(op, f"got {len(output_lists)} output lists for {len(inputs)} inputs")
        for outs, t in zip(output_lists, inputs):
            _check_list(op, "output_tensor_list", outs, self._size, t.dtype)
        return self._gather_all(op, [list(o) for o in output_lists], list(inputs), opts,
                                [t for outs in output_lists for t in outs])

    def all_gather_single(self, output, input, opts=None):
        return self.all_gather_single_coalesced([output], [input], opts, op="all_gather_single")

    def all_gather_single_coalesced(self, outputs, inputs, opts=None, op="all_gather_single_coalesced"):
        _check_tensors(op, list(outputs) + list(inputs))
        lists = []
        for out, t in zip(outputs, inputs):
            if out.numel() != t.numel() * self._size or out.dtype != t.dtype:
                raise _unsupported(op, f"output has {out.numel()} elements of {out.dtype}; it must hold "
                                       f"group size ({self._size}) x input ({t.numel()} of {t.dtype})")
            lists.append(_chunks(out, [t.numel()] * self._size))
        return self._gather_all(op, lists, list(inputs), opts, list(outputs))

    # torch 2.11 and earlier call these names; 2.15 calls the ones above
    def _allgather_base(self, output, input, opts=None):
        return self.all_gather_single_coalesced([output], [input], opts, op="_allgather_base")

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        return self.all_gather_single_coalesced(outputs, inputs, opts, op="allgather_into_tensor_coalesced")

    def _gather_all(self, op, output_lists, inputs, opts, result):
        nbytes = max((t.nbytes * self._size for t in inputs), default=0)

        def body(comm):
            for outs, t in zip(output_lists, inputs):
                if comm is None:
                    _copy_into(outs[0], t)
                    continue
                inp = _Staged(t)
                staged = [_Staged(o, copy_in=False) for o in outs]
                algo = self.algorithm("all_gather", t.nbytes * comm.size)
                REGISTRY["all_gather"][algo](comm, [s.flat for s in staged], inp.flat)
                for s in staged:
                    s.done()
        return self._launch(op, "all_gather", nbytes, body, result, opts,
                            dict(sizes=[[o.numel() for o in outs] for outs in output_lists]))

    def gather(self, output_lists, inputs, opts=None):
        op = "gather"
        _check_tensors(op, inputs)
        if len(inputs) != 1:
            raise _unsupported(op, f"takes one input tensor per call, got {len(inputs)}")
        root, t = opts.rootRank, inputs[0]
        outs = list(output_lists[0]) if self._rank == root else None
        if outs is not None:
            _check_list(op, "gather_list", outs, self._size, t.dtype)

        def body(comm):
            if comm is None:
                _copy_into(outs[0], t)
                return
            inp = _Staged(t)
            staged = [_Staged(o, copy_in=False) for o in outs] if outs is not None else None
            algo = self.algorithm("gather", t.nbytes * comm.size)
            REGISTRY["gather"][algo](comm, inp.flat, [s.flat for s in staged] if staged else None, root)
            for s in staged or ():
                s.done()
        return self._launch(op, "gather", t.nbytes * self._size, body, outs or [], opts,
                            dict(root=root, numel=t.numel()))

    def scatter(self, outputs, input_lists, opts=None):
        op = "scatter"
        _check_tensors(op, outputs)
        if len(outputs) != 1:
            raise _unsupported(op, f"takes one output tensor per call, got {len(outputs)}")
        root, t = opts.rootRank, outputs[0]
        pieces = list(input_lists[0]) if self._rank == root else None
        if pieces is not None:
            _check_list(op, "scatter_list", pieces, self._size, t.dtype)

        def body(comm):
            if comm is None:
                _copy_into(t, pieces[0])
                return
            out = _Staged(t, copy_in=False)
            ins = [_Staged(p).flat for p in pieces] if pieces is not None else None
            algo = self.algorithm("scatter", t.nbytes * comm.size)
            REGISTRY["scatter"][algo](comm, out.flat, ins, root)
            out.done()
        return self._launch(op, "scatter", t.nbytes * self._size, body, [t], opts,
                            dict(root=root, numel=t.numel()))

    def reduce_scatter(self, outputs, input_lists, opts=None):
        op = "reduce_scatter"
        _check_tensors(op, outputs)
        for ins, out in zip(input_lists, outputs):
            _check_list(op, "input_list", ins, self._size, out.dtype)
        return self._scatter_reduced(op, list(outputs), [list(i) for i in input_lists], opts)

    def reduce_scatter_single(self, output, input, opts=None):
        return self.reduce_scatter_single_coalesced([output], [input], opts, op="reduce_scatter_single")

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None,
                                        op="reduce_scatter_single_coalesced"):
        _check_tensors(op, list(outputs) + list(inputs))
        lists = []
        for out, t in zip(outputs, inputs):
            if t.numel() != out.numel() * self._size or out.dtype != t.dtype:
                raise _unsupported(op, f"input has {t.numel()} elements of {t.dtype}; it must hold "
                                       f"group size ({self._size}) x output ({out.numel()} of {out.dtype})")
            lists.append(_chunks(t, [out.numel()] * self._size))
        return self._scatter_reduced(op, list(outputs), lists, opts)

    def _reduce_scatter_base(self, output, input, opts=None):
        return self.reduce_scatter_single_coalesced([output], [input], opts, op="_reduce_scatter_base")

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        return self.reduce_scatter_single_coalesced(outputs, inputs, opts, op="reduce_scatter_tensor_coalesced")

    def _scatter_reduced(self, op, outputs, input_lists, opts):
        red = _op(op, opts, outputs)
        nbytes = max((t.nbytes * self._size for t in outputs), default=0)

        def body(comm):
            for out, ins in zip(outputs, input_lists):
                if comm is None:
                    _copy_into(out, ins[0])
                    continue
                o = _Staged(out, copy_in=False)
                flats = [_Staged(i).flat for i in ins]
                algo = self.algorithm("reduce_scatter", out.nbytes * comm.size)
                REGISTRY["reduce_scatter"][algo](comm, o.flat, flats, red)
                if red.average:
                    o.flat.div_(comm.size)
                o.done()
        return self._launch(op, "reduce_scatter", nbytes, body, outputs, opts,
                            dict(op_name=red.name, numel=[o.numel() for o in outputs]))

    def alltoall(self, outputs, inputs, opts=None):
        op = "alltoall"
        _check_tensors(op, list(outputs) + list(inputs))
        _check_list(op, "input_tensor_list", inputs, self._size, inputs[0].dtype if inputs else None)
        _check_list(op, "output_tensor_list", outputs, self._size, inputs[0].dtype if inputs else None)
        return self._exchange_all(op, list(outputs), list(inputs), opts, list(outputs))

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None,
                          op="all_to_all_single"):
        _check_tensors(op, [output, input])
        if output.dtype != input.dtype:
            raise _unsupported(op, f"output is {output.dtype} but input is {input.dtype}")
        outs = _split_rows(op, "output", output, output_split_sizes, self._size)
        ins = _split_rows(op, "input", input, input_split_sizes, self._size)
        return self._exchange_all(op, outs, ins, opts, [output])

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        return self.all_to_all_single(output, input, output_split_sizes, input_split_sizes, opts,
                                      op="alltoall_base")

    def _exchange_all(self, op, outs, ins, opts, result):
        nbytes = sum(t.nbytes for t in ins)

        def body(comm):
            if comm is None:
                _copy_into(outs[0], ins[0])
                return
            staged = [_Staged(o, copy_in=False) for o in outs]
            flats = [_Staged(i).flat for i in ins]
            REGISTRY["all_to_all"][self.algorithm("all_to_all", nbytes)](comm, [s.flat for s in staged], flats)
            for s in staged:
                s.done()
        return self._launch(op, "all_to_all", nbytes, body, result, opts,
                            dict(sends=[t.numel() for t in ins], recvs=[t.numel() for t in outs]))

    def barrier(self, opts=None):
        def body(comm):
            if comm is not None:
                REGISTRY["barrier"][self.algorithm("barrier", 0)](comm)
        return self._launch("barrier", "barrier", 0, body, [], opts)

    def monitored_barrier(self, opts=None, wait_all_ranks=False):
        """Our dissemination barrier, bounded by ``opts.timeout``; raises naming the late peer."""
        self.barrier(opts).wait()

    # -- point to point: passed through to the inner transport -----------------------------

    def send(self, tensors, dst, tag):
        return self._p2p("send", tensors, dst, tag)

    def recv(self, tensors, src, tag):
        return self._p2p("recv", tensors, src, tag)

    def recv_anysource(self, tensors, tag):
        return self._p2p("recv_anysource", tensors, None, tag)

    def _p2p(self, op, tensors, peer, tag):
        """Post straight on the pass-through transport and hand back its own Work.

        Not queued behind our collectives: a queued send could deadlock a program
        that sends before a collective its peer enters first (gloo's isend does not
        wait for the collectives issued before it).
        """
        _check_tensors(op, tensors)
        if any(t.device.type != "cpu" for t in tensors):
            raise _unsupported(op, "point-to-point messages of CUDA tensors need an NCCL transport, "
                                   "which this backend does not create yet; send a CPU tensor")
        if op == "send":
            return self._p2p_transport.send(tensors, peer, tag)
        if op == "recv":
            return self._p2p_transport.recv(tensors, peer, tag)
        return self._p2p_transport.recv_anysource(tensors, tag)


# -- helpers -------------------------------------------------------------------------------

def _timeout_of(opts, default):
    limit = getattr(opts, "timeout", None)
    if isinstance(limit, datetime.timedelta) and limit.total_seconds() > 0:
        return limit
    return default if isinstance(default, datetime.timedelta) and default.total_seconds() > 0 else None


def _check_tensors(op, tensors):
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            raise _unsupported(op, f"expected tensors, got {type(t).__name__}")
        if t.layout != torch.strided:
            raise _unsupported(op, f"a tensor has layout {t.layout}; our algorithms move dense "
                                   f"(strided) tensors only")
        if t.device.type not in ("cpu", "cuda"):
            raise _unsupported(op, f"a tensor is on {t.device}; this backend carries CPU and "
                                   f"CUDA tensors only")


def _check_list(op, name, tensors, size, dtype):
    if len(tensors) != size:
        raise _unsupported(op, f"{name} must hold one tensor per rank of the group ({size}), "
                               f"got {len(tensors)}")
    _check_tensors(op, tensors)
    for t in tensors:
        if dtype is not None and t.dtype != dtype:
            raise _unsupported(op, f"{name} mixes dtypes ({t.dtype} and {dtype})")


def _op(op, opts, tensors):
    red_op = getattr(opts, "reduceOp", dist.ReduceOp.SUM)
    dtype = tensors[0].dtype if tensors else torch.float32
    try:
        return reduce_ops.resolve(red_op, dtype, f"collectives backend: {op}")
    except TypeError as exc:  # PREMUL_SUM and friends: torch builds them for NCCL only
        raise UnsupportedOperation(str(exc)) from None


def _most(tensors):
    return max((t.nbytes for t in tensors), default=0)


def _chunks(t, numels):
    """Views of consecutive pieces of ``t`` (flattened), one per rank: no copy when contiguous."""
    if not t.is_contiguous():
        raise _unsupported("tensor form", "the single tensor must be contiguous (torch requires it too)")
    return list(t.view(-1).split(numels))


def _split_rows(op, name, t, splits, size):
    """``t`` cut along dim 0 into ``size`` pieces of ``splits`` rows (equal if empty), as views."""
    if not t.is_contiguous():
        raise _unsupported(op, f"{name} must be contiguous")
    rows = t.shape[0] if t.dim() else 1
    if not splits:
        if rows % size:
            raise _unsupported(op, f"{name} has {rows} rows, not divisible by the group size {size}; "
                                   f"pass split sizes")
        splits = [rows // size] * size
    splits = list(splits)
    if len(splits) != size or sum(splits) != rows or min(splits) < 0:
        raise _unsupported(op, f"{name}_split_sizes={splits} must be {size} non-negative numbers "
                               f"summing to {name}'s {rows} rows")
    row = t.numel() // rows if rows else 0
    return list(t.reshape(-1).split([s * row for s in splits]))


def _copy_into(dst, src):
    with torch.no_grad():
        dst.copy_(src.reshape(dst.shape))


def _create(dist_backend_opts, backend_options=None):
    """The creator torch calls for each new group (``extended_api=True``)."""
    opts = dist_backend_opts
    ranks = list(opts.global_ranks_in_group) or list(range(opts.group_size))
    return CollectivesBackend(opts.store, opts.group_rank, opts.group_size, opts.timeout, ranks,
                              getattr(opts, "group_id", ""))


def register():
    """Register the ``collectives`` backend with torch.distributed (idempotent)."""
    if not dist.is_available() or NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(NAME, _create, extended_api=True, devices=["cpu", "cuda"])


def backend_of(group=None):
    """The :class:`CollectivesBackend` behind ``group`` (None: the default group), or None."""
    group = group if group is not None else dist.group.WORLD
    try:
        backend = group._get_backend(torch.device("cpu"))
    except Exception:
        return None
    return backend if isinstance(backend, CollectivesBackend) else None
