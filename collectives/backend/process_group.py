"""The ``collectives`` backend's process group: torch's ``Backend`` methods, each one call of
our public API on the group's inner transport (see the package's docstring)."""
import datetime
import sys
import threading

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend as _C10dBackend
from torch._C._distributed_c10d import PrefixStore, ProcessGroupGloo
from torch._C._distributed_c10d import Work as _C10dWork

from .. import api, observers, reduce_ops, settings, tensor_api
from ..call import check_tensor
from ..engine import engine, wait_for
from ..errors import UnsupportedOperation
from ..group import GroupInfo
from ..p2p_communications import Comm
from ..algorithms import ALGORITHMS
from ..call import nbytes
from ..tuning import agreed, choice, cost_model

NAME = "collectives"


def _subclassable(cls):
    """Whether Python may subclass torch's C++ class ``cls`` (pybind gives it a constructor)."""
    class _Probe(cls):
        pass
    try:
        _Probe(0, 1)
    except TypeError:    # "No constructor defined!"
        return False
    return True


# Two ways to stand behind a torch group, both with the methods of one class
# (:class:`CollectivesBackend`), which torch calls by the same names:
#
# * a Python ``ProcessGroup``, which torch takes as the whole group. Used for every group that
#   is ours on all its devices ("collectives", "cpu:collectives"). Python callers
#   (torch's isend, its receive from any source, get_backend) reach our methods and
#   get our ``Work`` objects themselves, and DDP's logger reads our name;
# * a Python subclass of torch's C++ ``Backend``, per device, where the group is mixed
#   ("cpu:collectives,cuda:nccl": NCCL keeps CUDA tensors). torch 2.14 and later allow it.
#   torch then wraps every ``Work`` we return in a C++ holder that forwards only ``wait()``
#   and ``get_future()``: ``is_completed()`` on it stays False and a receive from any source
#   cannot name its sender (docs/torch_suite.md). torch 2.11 gives ``Backend`` no Python
#   constructor at all; there a mixed group is ours on both devices.
BACKEND_SUBCLASSABLE = _subclassable(_C10dBackend)
BACKEND_IS_PROCESS_GROUP = True     # a group that is ours alone is our ProcessGroup (above)


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
        wait_for(self._done, timeout, f"collectives backend: {self._description}")
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


def _unsupported(op, reason):
    return UnsupportedOperation(f"collectives backend: {op}: {reason}")


class CollectivesBackend:
    """torch's ``Backend`` interface, answered by our algorithms.

    Built by :func:`_create` as one of its two concrete forms (a ``ProcessGroup``
    or a ``Backend``, see above); not meant to be constructed by hand. ``ranks``
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
        self._algorithms = settings.algorithm_overrides()
        self._estimating = None     # between torch's _start_ and _end_time_estimate: [seconds, ...]
        # A prefixed copy of the store, so the inner transport's keys never meet
        # the ones torch (or another backend on this group) writes.
        self._transport = ProcessGroupGloo(PrefixStore(f"{NAME}/", store), rank, size, timeout)
        # The user's own send/recv get a transport of their own: tags are the only
        # thing gloo pairs messages by, and the door's tags could equal a user's.
        self._p2p_transport = ProcessGroupGloo(PrefixStore(f"{NAME}-p2p/", store), rank, size, timeout)
        self._info = GroupInfo(self._transport, tuple(self._ranks), rank, "gloo", f"pg:{group_name}", store,
                               _seconds(timeout))
        # Every member must run the same algorithm for each call: COLLECTIVES_ALGO must agree
        # (one clear error on every rank, here, before any collective, if it does not), and the
        # automatic choice reads group rank 0's tuning tables. Creating a group is collective:
        # every member is here, so the group agrees now, over its own messages
        # (collectives.tuning.agreed), and its calls never wait on anything but their own.
        if size > 1:
            wait = min(settings.timeout_seconds(), _seconds(timeout) or settings.MAX_TIMEOUT)
            algos = ",".join(f"{c}:{a}" for c, a in sorted(self._algorithms.items()))
            try:
                agreed.forget(self._info.key)
                agreed.of(self._info, lambda: Comm(self._info, "agree", observers.AGREEMENT, -1,
                                                   "agree(group creation)", wait),
                          {"COLLECTIVES_ALGO": algos})
            except BaseException:
                self.abort()
                raise

    # -- what torch asks about the backend -------------------------------------------------

    def getBackendName(self):  # noqa: N802 (torch's name)
        return NAME

    # A ProcessGroup (torch 2.11) asks its backends for its name and has none: we answer.
    def getGroupName(self):  # noqa: N802
        return self._group_name

    def setGroupName(self, name):  # noqa: N802
        self._group_name = name

    def name(self):
        return NAME

    @property
    def _device_types(self):
        """The devices this group serves (torch 2.14's monitored_barrier asks a group for "cpu")."""
        return [torch.device("cpu"), torch.device("cuda")]

    @property
    def supports_splitting(self):
        return True

    @property
    def supports_coalescing(self):
        return False

    # -- torch's time estimator (dist.distributed_c10d._time_estimator) ----------------------

    @property
    def supports_time_estimate(self):
        return True

    def _start_time_estimate(self):
        """From now until :meth:`_end_time_estimate`, collectives on this group are priced by
        the cost model instead of run: no message moves and no tensor changes."""
        self._estimating = []

    def _end_time_estimate(self):
        """The summed estimate of the collectives issued since :meth:`_start_time_estimate`,
        in microseconds (the unit of NCCL's ``ncclGroupSimulateEnd``, which torch's NCCL
        backend hands back here)."""
        if self._estimating is None:
            raise RuntimeError("collectives backend: _end_time_estimate without _start_time_estimate")
        total, self._estimating = sum(self._estimating), None
        return float(total * 1e6)

    def _estimated(self, op, collective, size, outputs):
        """Price one collective (``size``: the call's total bytes, as the choice reads it)
        and hand back a finished Work, its outputs untouched."""
        algorithm = self._choice(collective)
        self._estimating.append(estimate_seconds(collective, size, self._size,
                                                 agreed.tables_of(self._info), algorithm))
        done = torch.futures.Future()
        done.set_result(list(outputs))
        return BackendWork(done, f"{op} (time estimate)")

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
        """Called by ``destroy_process_group``: finish what was issued on this group, end its
        lane's thread and forget its call numbers, then close the transports.

        Closing them here, in the caller's thread, matters: a gloo group that
        outlives this point is destroyed at interpreter exit with its threads
        still running, and the process aborts ("terminate called without an
        active exception").
        """
        # this group's work only: another group's may wait for a peer that is itself waiting
        # in this destroy (torch's gloo completes such a program)
        engine().close(self._info.key)
        agreed.forget(self._info.key)
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
        return type(self)(store, ranks.index(self._me), len(ranks), timeout, ranks, name)

    @property
    def supports_shrinking(self):
        return _AsBackend is not None

    def shrink(self, ranks_to_exclude, shrink_flags=0, opts_override=None):
        """A backend over this group's members less ``ranks_to_exclude`` (group ranks), for
        ``dist.shrink_group``: the survivors of a job call it, the excluded ranks never do.

        torch registers what this returns as the per-device backend of a fresh C++
        ``ProcessGroup``, so it is the ``Backend`` form (torch 2.14 and later). The new
        group's transports meet under a key of their own in the group's store (creating a
        group is the rendezvous the store is for), named by the survivors, so a second
        shrink of the same group meets apart from the first. Nothing is asked of the
        excluded ranks: they may be gone.
        """
        if _AsBackend is None:
            raise _unsupported("shrink", "this torch gives Backend no Python constructor")
        gone = sorted(set(int(r) for r in ranks_to_exclude))
        if self._rank in gone:
            raise _unsupported("shrink", f"this rank ({self._rank}) is among the ranks to exclude")
        keep = [g for r, g in enumerate(self._ranks) if r not in gone]
        self._shrinks = getattr(self, "_shrinks", 0) + 1
        store = PrefixStore(f"{NAME}-shrink/{self._group_name}/{self._shrinks}/"
                            f"{','.join(map(str, keep))}/", self._store)
        timeout = getattr(opts_override, "_timeout", None) or self._timeout
        name = f"{self._group_name}:shrunk{self._shrinks}"
        return _AsBackend(store, keep.index(self._me), len(keep), timeout, keep, name)

    # -- running one collective ------------------------------------------------------------

    @property
    def group_info(self):
        """This group as our API sees it: the inner transport, global ranks, the engine key.

        The key is the torch group's (``pg:<name>``), so torch's calls on this
        group and ``collectives.*(group=...)`` calls on it share one engine lane
        and run in the order they were issued.
        """
        return self._info

    def _choice(self, collective):
        """``algorithm=`` for our API: COLLECTIVES_ALGO's pick, or None (the automatic choice)."""
        return self._algorithms.get(collective)

    def _wrap(self, op, works, outputs):
        """One torch Work for the API handles ``works`` (None for a call that ran blocking, done
        already); its future's value is ``outputs``.

        Completed by hand rather than with ``Future.then``, which would wrap a
        collective's error (a CollectiveTimeout, say) in a RuntimeError carrying
        a traceback: whoever waits gets the error itself.
        """
        futures = [w.get_future() for w in works if w is not None]
        done = torch.futures.Future()
        left = [len(futures)]
        lock = threading.Lock()

        def finished(fut):
            try:
                fut.value()
            except Exception as exc:
                with lock:
                    first, left[0] = left[0] > 0, 0
                if first:
                    done.set_exception(exc)
                return
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                done.set_result(outputs)
        if not futures:
            done.set_result(outputs)
        for fut in futures:
            fut.add_done_callback(finished)
        return BackendWork(done, op)

    # -- the collectives (each one a call of our public API on the inner transport) ------

    def allreduce(self, tensors, opts=None):
        return self._allreduce("allreduce", tensors, opts)

    def allreduce_coalesced(self, tensors, opts=None):
        return self._allreduce("allreduce_coalesced", tensors, opts)

    def _allreduce(self, op, tensors, opts):
        _check_tensors(op, tensors)
        red_op = _op(op, opts, tensors)
        if self._estimating is not None:
            return self._estimated(op, "all_reduce", sum(nbytes(t) for t in tensors), tensors)
        return self._wrap(op, [api.all_reduce(t, red_op, self._info, _async(opts), self._choice("all_reduce"))
                               for t in tensors], list(tensors))

    def broadcast(self, tensors, opts=None):
        _check_tensors("broadcast", tensors)
        if self._estimating is not None:
            return self._estimated("broadcast", "broadcast", sum(nbytes(t) for t in tensors), tensors)
        # the root goes to the API as a group rank, which validates it as it validates
        # everyone's (-1 or 5 in a group of 2: the same error on every rank, no message sent)
        return self._wrap("broadcast", [api.broadcast(t, None, self._info, _async(opts), self._choice("broadcast"),
                                                      group_src=opts.rootRank)
                                        for t in tensors], list(tensors))

    def reduce(self, tensors, opts=None):
        _check_tensors("reduce", tensors)
        red_op = _op("reduce", opts, tensors)
        if self._estimating is not None:
            return self._estimated("reduce", "reduce", sum(nbytes(t) for t in tensors), tensors)
        return self._wrap("reduce", [api.reduce(t, None, red_op, self._info, _async(opts), self._choice("reduce"),
                                                group_dst=opts.rootRank)
                                     for t in tensors], list(tensors))

    def allgather(self, output_lists, inputs, opts=None):
        return self._allgather("allgather", output_lists, inputs, opts)

    def allgather_coalesced(self, output_lists, inputs, opts=None):
        """torch's ``all_gather_coalesced``: ``output_lists[r][j]`` receives input j of rank r
        (allgather's lists are the other way round: ``output_lists[j][r]``)."""
        op = "allgather_coalesced"
        if len(output_lists) != self._size:
            raise _unsupported(op, f"output_tensor_lists must hold one list per rank of the group "
                                   f"({self._size}), got {len(output_lists)}")
        for r, outs in enumerate(output_lists):
            if len(outs) != len(inputs):
                raise _unsupported(op, f"output_tensor_lists[{r}] holds {len(outs)} tensors for "
                                       f"{len(inputs)} inputs")
        by_input = [[output_lists[r][j] for r in range(self._size)] for j in range(len(inputs))]
        return self._allgather(op, by_input, inputs, opts)

    def _allgather(self, op, output_lists, inputs, opts):
        _check_tensors(op, inputs)
        if len(output_lists) != len(inputs):
            raise _unsupported(op, f"got {len(output_lists)} output lists for {len(inputs)} inputs")
        if self._estimating is not None:
            return self._estimated(op, "all_gather", sum(nbytes(o) for outs in output_lists for o in outs),
                                   [o for outs in output_lists for o in outs])
        works = []
        for outs, t in zip(output_lists, inputs):
            _check_list(op, "output_tensor_list", outs, self._size, t.dtype)
            # uneven sizes per rank (torch allows them) take the same path: our all_gather
            # runs the ring, which moves each rank's piece at its own size
            works.append(_as_unsupported(op, api.all_gather, list(outs), t, self._info, _async(opts),
                                         self._choice("all_gather")))
        return self._wrap(op, works, [o for outs in output_lists for o in outs])

    def all_gather_single(self, output, input, opts=None):
        return self.all_gather_single_coalesced([output], [input], opts, op="all_gather_single")

    def all_gather_single_coalesced(self, outputs, inputs, opts=None, op="all_gather_single_coalesced"):
        _check_tensors(op, list(outputs) + list(inputs))
        if self._estimating is not None:
            return self._estimated(op, "all_gather", sum(nbytes(o) for o in outputs), outputs)
        return self._wrap(op, [_as_unsupported(op, tensor_api.all_gather_into_tensor, out, t, self._info, _async(opts),
                                               self._choice("all_gather"))
                               for out, t in zip(outputs, inputs)], list(outputs))

    # torch 2.11 and earlier call these names; 2.15 calls the ones above
    def _allgather_base(self, output, input, opts=None):
        return self.all_gather_single_coalesced([output], [input], opts, op="_allgather_base")

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        return self.all_gather_single_coalesced(outputs, inputs, opts, op="allgather_into_tensor_coalesced")

    def gather(self, output_lists, inputs, opts=None):
        _check_tensors("gather", inputs)
        if len(inputs) != 1:
            raise _unsupported("gather", f"takes one input tensor per call, got {len(inputs)}")
        root = opts.rootRank
        outs = list(output_lists[0]) if self._rank == root else None
        if self._estimating is not None:
            return self._estimated("gather", "gather", nbytes(inputs[0]) * self._size, outs or [])
        work = api.gather(inputs[0], outs, None, self._info, _async(opts), self._choice("gather"), group_dst=root)
        return self._wrap("gather", [work], outs or [])

    def scatter(self, outputs, input_lists, opts=None):
        _check_tensors("scatter", outputs)
        if len(outputs) != 1:
            raise _unsupported("scatter", f"takes one output tensor per call, got {len(outputs)}")
        root = opts.rootRank
        pieces = list(input_lists[0]) if self._rank == root else None
        if self._estimating is not None:
            return self._estimated("scatter", "scatter", nbytes(outputs[0]) * self._size, outputs)
        work = api.scatter(outputs[0], pieces, None, self._info, _async(opts), self._choice("scatter"), group_src=root)
        return self._wrap("scatter", [work], list(outputs))

    def reduce_scatter(self, outputs, input_lists, opts=None):
        _check_tensors("reduce_scatter", outputs)
        red_op = _op("reduce_scatter", opts, outputs)
        if self._estimating is not None:
            return self._estimated("reduce_scatter", "reduce_scatter",
                                   sum(nbytes(o) for o in outputs) * self._size, outputs)
        return self._wrap("reduce_scatter",
                          [api.reduce_scatter(out, list(ins), red_op, self._info, _async(opts),
                                              self._choice("reduce_scatter"))
                           for out, ins in zip(outputs, input_lists)], list(outputs))

    def reduce_scatter_single(self, output, input, opts=None):
        return self.reduce_scatter_single_coalesced([output], [input], opts, op="reduce_scatter_single")

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None,
                                        op="reduce_scatter_single_coalesced"):
        _check_tensors(op, list(outputs) + list(inputs))
        red_op = _op(op, opts, outputs)
        if self._estimating is not None:
            return self._estimated(op, "reduce_scatter", sum(nbytes(o) for o in outputs) * self._size, outputs)
        return self._wrap(op, [_as_unsupported(op, tensor_api.reduce_scatter_tensor, out, t, red_op, self._info,
                                               _async(opts), self._choice("reduce_scatter"))
                               for out, t in zip(outputs, inputs)], list(outputs))

    def _reduce_scatter_base(self, output, input, opts=None):
        return self.reduce_scatter_single_coalesced([output], [input], opts, op="_reduce_scatter_base")

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        return self.reduce_scatter_single_coalesced(outputs, inputs, opts, op="reduce_scatter_tensor_coalesced")

    def alltoall(self, outputs, inputs, opts=None):
        _check_tensors("alltoall", list(outputs) + list(inputs))
        if self._estimating is not None:
            return self._estimated("alltoall", "all_to_all", sum(nbytes(t) for t in inputs), outputs)
        work = api.all_to_all(list(outputs), list(inputs), self._info, _async(opts), self._choice("all_to_all"))
        return self._wrap("alltoall", [work], list(outputs))

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None,
                          op="all_to_all_single"):
        _check_tensors(op, [output, input])
        if self._estimating is not None:
            return self._estimated(op, "all_to_all", nbytes(input), [output])
        work = _as_unsupported(op, tensor_api.all_to_all_single, output, input, list(output_split_sizes),
                               list(input_split_sizes), self._info, _async(opts), self._choice("all_to_all"))
        return self._wrap(op, [work], [output])

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        return self.all_to_all_single(output, input, output_split_sizes, input_split_sizes, opts,
                                      op="alltoall_base")

    def barrier(self, opts=None):
        if self._estimating is not None:
            return self._estimated("barrier", "barrier", 0, [])
        return self._wrap("barrier", [api.barrier(self._info, _async(opts), self._choice("barrier"))], [])

    def monitored_barrier(self, opts=None, wait_all_ranks=False):
        """Our dissemination barrier; a rank that never arrives raises CollectiveTimeout naming it."""
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

def estimate_params(tables, group_size, collective=None, algorithm=None):
    """The figures :func:`estimate_seconds` prices with: the measured model for ``group_size``
    (this machine's, else the shipped one), and of it the most specific the tune measured:
    ``algorithm``'s own figures (``cost_model.fit_algorithms``), else those fitted to all the
    calls timed (``cost_model.fit_calls``), else ping-pong's; ``torch_call`` beside them: what
    torch's own API adds to each call (measured by the tune; 0 where not)."""
    params = choice._model(tables.mine or {}, group_size) or choice._model(tables.shipped or {}, group_size)
    if not params:
        raise ValueError("collectives backend: time estimate: no fitted model in the group's tuning "
                         "tables (run python -m benchmarks.tune, or use the shipped table)")
    own = (params.get("algorithms") or {}).get(collective, {}).get(algorithm)
    return dict(own or params.get("calls") or params, torch_call=params.get("torch_call", 0.0))


def estimate_seconds(collective, size, group_size, tables, algorithm=None):
    """Predicted seconds of one ``collective`` of ``size`` bytes (the call's total, as the
    automatic choice reads it) on ``group_size`` ranks, by the cost model.

    ``tables``: the :class:`~collectives.tuning.agreed.Tables` the group agreed on; its
    measured model (this machine's calibration) is used where there is one, else the shipped
    one; of a measured model, the figures ``benchmarks.tune`` fitted to the calls it timed
    (``calls``: a cost per call beside alpha, beta, gamma), or to the calls of the algorithm
    priced alone (``algorithms``), where it holds them, plus what
    torch's API adds to a call (``torch_call``): torch asks for the time of its own calls,
    and the tune times ours. ``algorithm``: the one the call would run (COLLECTIVES_ALGO's); None takes the
    automatic choice, as the call would. An algorithm whose cost is not stated (chosen only
    from measurements) is priced as the best modelled algorithm.
    """
    if collective not in ALGORITHMS:
        raise ValueError(f"collectives backend: time estimate: unknown collective {collective!r}")
    if group_size <= 1:
        return 0.0
    size = max(int(size), 0)
    algorithm = algorithm or choice.choose(collective, size, group_size, tables)

    def priced(name):
        params = estimate_params(tables, group_size, collective, name)
        return params["torch_call"] + cost_model.predict(collective, name, group_size, size, params)
    try:
        return priced(algorithm)
    except ValueError:
        modelled = [a for a in ALGORITHMS[collective] if choice.auto(collective, a) == "model"]
        return min(priced(a) for a in modelled)


def _as_unsupported(op, fn, *args):
    """Call a tensor-form function; its size/contiguity errors name torch's operation."""
    try:
        return fn(*args)
    except ValueError as exc:
        raise UnsupportedOperation(f"collectives backend: {op}: {exc}") from None


def _async(opts):
    """Whether torch's caller returns the handle (``async_op=True``) rather than waiting on it at
    once. torch says so in ``opts.asyncOp``, set from ``async_op`` by every collective of
    ``torch.distributed``; options built elsewhere (DDP's reducer) say True, and an older torch
    may say nothing: those calls are queued, as async calls are.

    A blocking call goes to our API as a blocking one, so it runs on the caller's thread when
    its lane is idle, as our own blocking calls do. Issued async and waited at once, every
    call paid two thread hand-offs (the lane's thread runs it, then wakes the waiter): a
    4-byte ``dist.all_reduce`` took 1.3-1.6x our blocking call, and takes 1.05-1.2x now
    (2 and 4 ranks on 2 shared cores). Its errors now raise from the call itself."""
    return bool(getattr(opts, "asyncOp", True)) if opts is not None else True


def _check_tensors(op, tensors):
    for t in tensors:
        try:
            check_tensor(f"collectives backend: {op}", "a tensor", t)
        except (TypeError, ValueError) as exc:
            raise UnsupportedOperation(str(exc)) from None


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
    try:  # checked here so the error names torch's operation; our API takes the op itself
        return reduce_ops.reduction(red_op, dtype, f"collectives backend: {op}").op
    except TypeError as exc:  # PREMUL_SUM and friends: torch builds them for NCCL only
        raise UnsupportedOperation(str(exc)) from None


def _create(dist_backend_opts, backend_options=None):
    """The creator torch calls for each new group (``extended_api=True``)."""
    opts = dist_backend_opts
    ranks = list(opts.global_ranks_in_group) or list(range(opts.group_size))
    form = _AsBackend if _AsBackend is not None and _ours_on_every_device() is False else _AsProcessGroup
    return form(opts.store, opts.group_rank, opts.group_size, opts.timeout, ranks,
                              getattr(opts, "group_id", ""))


class _AsProcessGroup(CollectivesBackend, dist.ProcessGroup):
    """Our backend as the whole torch group (a group that is ours on every device)."""

    def _get_backend(self, device):
        """The group's backend for ``device``: this object, on every device it serves.

        torch's C++ ``ProcessGroup`` keeps a per-device table that a Python group never
        fills, so its own ``_get_backend`` raises "No backend type associated with device
        type cpu". Python paths of torch ask it all the same before they send a message
        (``batch_isend_irecv``, ``_time_estimator``, ``split_group``, ``shrink_group``):
        they get our methods, by the names they call on a backend.
        """
        kind = device.type if isinstance(device, torch.device) else str(device).split(":")[0]
        if kind not in ("cpu", "cuda"):
            raise RuntimeError(f"No backend type associated with device type {kind}")
        return self

    def perform_nocolor_split(self, device):
        """torch asks a group it splits from to take part in the split from non-members too
        (NCCL's ``ncclCommSplit``). Our child groups are built by torch's creator from the
        store, so a rank outside the new group has nothing to do."""


_AsBackend = type("_AsBackend", (CollectivesBackend, _C10dBackend),
                  {"__doc__": "Our backend as torch's per-device Backend (a mixed group)."}) \
    if BACKEND_SUBCLASSABLE else None


def _ours_on_every_device():
    """Whether the group torch is creating is ours on every device, from the ``BackendConfig``
    in the frame of torch's group-creating function (torch hands the creator no other trace
    of the backend string); None when no such frame is found."""
    frame = sys._getframe(1)
    for _ in range(6):
        if frame is None:
            break
        config = frame.f_locals.get("backend_config")
        if config is not None and hasattr(config, "get_device_backend_map"):
            return all(str(b) == NAME for b in config.get_device_backend_map().values())
        frame = frame.f_back
    return None


def register():
    """Register the ``collectives`` backend with torch.distributed (idempotent)."""
    if not dist.is_available() or NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(NAME, _create, extended_api=True, devices=["cpu", "cuda"])


def backend_of(group=None):
    """The :class:`CollectivesBackend` behind ``group`` (None: the default group), or None."""
    group = group if group is not None else dist.group.WORLD
    if isinstance(group, CollectivesBackend):     # a group that is ours alone is the backend
        return group
    try:
        backend = group._get_backend(torch.device("cpu"))
    except Exception:
        return None
    return backend if isinstance(backend, CollectivesBackend) else None


def _seconds(timeout):
    """A group's timeout (a timedelta, as torch hands it) in seconds; None if there is none."""
    if isinstance(timeout, datetime.timedelta):
        seconds = timeout.total_seconds()
        return seconds if seconds > 0 else None
    return None
