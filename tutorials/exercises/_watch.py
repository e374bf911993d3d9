"""What the grader watches inside each rank: every point-to-point call, and every route it forbids.

Before the learner's file is even imported (:func:`patch`):

* every built-in collective of ``torch.distributed`` (and of this library) is
  replaced by a function that raises :class:`BuiltinUsed`, so a solution that
  calls one fails with its name instead of silently passing;
* ``send``, ``recv``, ``isend``, ``irecv`` and ``batch_isend_irecv`` are
  wrapped: they count bytes and messages per rank (:data:`COUNTERS`), write "where
  this rank is" (the call, the peer, the tensor) into shared memory before blocking
  (:func:`set_status`), and log the shape of each message (:func:`log_message`), so
  the parent can say who waited on whom when the world stops moving, and which
  receive was too short for its message.

The checks read :data:`COUNTERS` and call :func:`set_status`; this module imports none of them.
"""
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
import weakref

from tutorials.exercises import _routes
from tutorials.exercises._routes import BuiltinUsed

SLOT = 400  # bytes of status text per rank in the shared array
LOG_SLOT = 1024   # bytes per rank of its message log (``log_message``)
LOG_RUNS = 4      # runs of same-shaped messages kept per peer and direction

# Every collective a solution must not call (the exercises build them from messages).
BUILTINS = [
    "broadcast", "all_reduce", "reduce", "all_gather", "all_gather_into_tensor", "_all_gather_base",
    "gather", "scatter", "reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base",
    "all_to_all", "all_to_all_single", "barrier", "monitored_barrier", "broadcast_object_list",
    "all_gather_object", "gather_object", "scatter_object_list", "send_object_list", "recv_object_list",
    "all_reduce_coalesced", "all_gather_coalesced",
]
LIBRARY = _routes.LIBRARY

def _plain(fn):
    """``fn`` with torch-function modes off: c10d's send hands a tensor under a mode (the memory
    rules' :class:`_common.Allocations`) back to ``c10d.send`` by name, which is our wrapper: it
    would count the message twice."""
    def call(*args, **kwargs):
        with torch._C.DisableTorchFunction():
            return fn(*args, **kwargs)
    call.__name__ = fn.__name__
    return call


ORIGINAL = {name: _plain(getattr(c10d, name)) for name in ["send", "recv", "isend", "irecv", "batch_isend_irecv",
                                                           "barrier"]}


class Counters:
    """Messages and bytes this rank posted in the current case, and each message's peer and size
    (in posting order), so the parent can pair every send with its receive."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.sent_bytes = self.sent_messages = self.recv_bytes = self.recv_messages = 0
        self.sends, self.recvs = [], []     # [(peer, nbytes)]
        self.buffers = []                   # [(peer, weakref to the receive buffer's base tensor)]
        self.isends = []                    # [[text, waited]] of every isend posted

    def unwaited(self):
        """The isends whose request was never waited on (dropped, or kept and forgotten)."""
        return [text for text, waited in self.isends if not waited]

    def receive_buffers(self, peer):
        """The receive buffers from ``peer`` still alive (posted, or received into and kept)."""
        alive = [(p, r) for p, r in self.buffers if r() is not None]
        self.buffers = alive
        return [r() for p, r in alive if p == peer and r() is not None]

    def as_tuple(self):
        return (self.sent_bytes, self.sent_messages, self.recv_bytes, self.recv_messages,
                self.sends, self.recvs)


COUNTERS = Counters()
_status = None      # shared char array, SLOT bytes per rank
_log = None         # shared char array, LOG_SLOT bytes per rank: the shapes of its latest messages
_runs = {}          # ("s" or "r", peer) -> [[first ordinal, last ordinal, shape], ...]
_progress = None    # shared int64 array, one per rank: bumped at every call entry and exit
_rank = 0


def attach(rank, status, progress, log):
    """Write this rank's status, progress and message log into the parent's shared arrays."""
    global _status, _progress, _log, _rank
    _status, _progress, _log, _rank = status, progress, log, rank


def set_status(text):
    """Write "where this rank is" for the parent, and count it as progress. A rank that blocks or
    returns with isends it never waited on says so: the likeliest cause of a message that never came."""
    if _status is None:
        return
    unwaited = COUNTERS.unwaited()
    if unwaited and text.startswith(("in dist.", "waiting in", "returned from")):
        text += f"; never waited on: {unwaited[0]}" + (f" and {len(unwaited) - 1} more" if len(unwaited) > 1 else "")
    data = text.encode("utf-8", "replace")[:SLOT - 1]
    start = _rank * SLOT
    _status[start:start + len(data) + 1] = data + b"\0"
    _progress[_rank] += 1


def log_message(kind, peer, tensor):
    """Write the shape of this rank's k-th message to or from ``peer`` where the parent can read it.
    A status says only where a rank is now; by the time gloo aborts a receiver whose buffer was too
    short, the sender has finished that send and moved on, so the parent pairs the k-th receive from
    a peer with that peer's k-th send instead (gloo keeps each pair's messages in order)."""
    if _log is None:
        return
    runs = _runs.setdefault((kind, peer), [])
    ordinal, shape = (runs[-1][1] + 1 if runs else 0), describe(tensor)
    if runs and runs[-1][2] == shape:
        runs[-1][1] = ordinal
    else:
        runs.append([ordinal, ordinal, shape])
        del runs[:-LOG_RUNS]
    text = ";".join(f"{k}{p}:{a}-{b}={s}" for (k, p), rs in _runs.items() for a, b, s in rs)
    data = text.encode()[:LOG_SLOT - 1]
    start = _rank * LOG_SLOT
    _log[start:start + len(data) + 1] = data + b"\0"


def describe(tensor):
    dtype = str(tensor.dtype).replace("torch.", "")
    return f"{dtype}[{', '.join(map(str, tensor.shape))}]"


def _peer(value, group_value):
    return group_value if value is None else value


class Request:
    """What our isend/irecv return: torch's request, plus a status line while someone waits on it."""

    def __init__(self, work, text, buffer=None, record=None):
        # a posted receive holds its buffer until it is waited on, even if the caller drops it
        self._work, self._text, self._buffer, self._record = work, text, buffer, record

    def wait(self, *args, **kwargs):
        if self._record is not None:
            self._record[1] = True
        set_status(f"waiting in req.wait() for {self._text}")
        result = self._work.wait(*args, **kwargs)
        set_status(f"done waiting for {self._text}")
        self._buffer = None
        return result

    def __getattr__(self, name):
        return getattr(self._work, name)


def _count(kind, tensor, peer):
    nbytes = tensor.numel() * tensor.element_size()
    log_message("s" if kind == "send" else "r", peer, tensor)
    if kind == "send":
        COUNTERS.sent_bytes += nbytes
        COUNTERS.sent_messages += 1
        COUNTERS.sends.append((peer, nbytes))
    else:
        COUNTERS.recv_bytes += nbytes
        COUNTERS.recv_messages += 1
        COUNTERS.recvs.append((peer, nbytes))
        base = tensor._base if tensor._base is not None else tensor
        COUNTERS.buffers.append((peer, weakref.ref(base)))


_blocking = False   # torch's send/recv call isend/irecv + wait: count those once, as send/recv


def send(tensor, dst=None, group=None, tag=0, group_dst=None):
    global _blocking
    text = f"dist.send(dst={_peer(dst, group_dst)}) of {describe(tensor)}"
    _count("send", tensor, _peer(dst, group_dst))
    set_status(f"in {text}")
    _blocking = True
    try:
        ORIGINAL["send"](tensor, dst, group=group, tag=tag, group_dst=group_dst)
    finally:
        _blocking = False
    set_status(f"returned from {text}")


def recv(tensor, src=None, group=None, tag=0, group_src=None):
    global _blocking
    text = f"dist.recv(src={_peer(src, group_src)}) into {describe(tensor)}"
    _count("recv", tensor, _peer(src, group_src))
    set_status(f"in {text}")
    _blocking = True
    try:
        result = ORIGINAL["recv"](tensor, src, group=group, tag=tag, group_src=group_src)
    finally:
        _blocking = False
    set_status(f"returned from {text}")
    return result


def isend(tensor, dst=None, group=None, tag=0, group_dst=None):
    if _blocking:
        return ORIGINAL["isend"](tensor, dst, group=group, tag=tag, group_dst=group_dst)
    text = f"dist.isend(dst={_peer(dst, group_dst)}) of {describe(tensor)}"
    _count("send", tensor, _peer(dst, group_dst))
    set_status(f"posted {text}")
    record = [text, False]
    COUNTERS.isends.append(record)
    return Request(ORIGINAL["isend"](tensor, dst, group=group, tag=tag, group_dst=group_dst), text, record=record)


def irecv(tensor, src=None, group=None, tag=0, group_src=None):
    if _blocking:
        return ORIGINAL["irecv"](tensor, src, group=group, tag=tag, group_src=group_src)
    text = f"dist.irecv(src={_peer(src, group_src)}) into {describe(tensor)}"
    _count("recv", tensor, _peer(src, group_src))
    set_status(f"posted {text}")
    return Request(ORIGINAL["irecv"](tensor, src, group=group, tag=tag, group_src=group_src), text, tensor)


def batch_isend_irecv(p2p_op_list):
    set_status(f"in dist.batch_isend_irecv of {len(p2p_op_list)} ops")
    # torch's version calls op.op for each entry: our isend/irecv above, which count.
    return ORIGINAL["batch_isend_irecv"](p2p_op_list)


def _forbidden(name, where):
    def call(*args, **kwargs):
        raise BuiltinUsed(f"{where}.{name}")
    call.__name__ = name
    return call


def patch(source=None):
    """Count point-to-point calls and make every built-in collective raise :class:`BuiltinUsed`;
    with ``source`` (the learner's file), every other route into the library too (``_routes``)."""
    for module in (dist, c10d):
        for name, fn in [("send", send), ("recv", recv), ("isend", isend), ("irecv", irecv),
                         ("batch_isend_irecv", batch_isend_irecv)]:
            setattr(module, name, fn)
        for name in BUILTINS:
            if hasattr(module, name):
                setattr(module, name, _forbidden(name, "dist"))
    try:
        import collectives
        from collectives import api, tensor_api
    except ImportError:
        return
    # the library's collectives by every name they are reachable under, not only the package's
    for module in (collectives, api, tensor_api):
        for name in LIBRARY:
            if hasattr(module, name):
                setattr(module, name, _forbidden(name, "collectives"))
    if source is not None:
        _routes.switch_off(source)
