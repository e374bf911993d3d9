"""A flight recorder: each rank's last calls, dumped in torch's Flight Recorder format.

When a job hangs, the question is which rank is where. Our timeout already answers it in
words (:mod:`collectives.desync`); this module keeps the evidence in the form torch's own
tools read. Every rank keeps a ring buffer of its last ``COLLECTIVES_TRACE_BUFFER`` calls
(collectives and point-to-point; default 2,000). Each entry is the dictionary torch's
ProcessGroupNCCL/Gloo flight recorder writes (``version`` 2.10): sequence numbers, the
collective's name (``gloo:all_reduce``, ``gloo:send 0->1``), input and output sizes and
dtypes, the state (``scheduled``, ``started``, ``completed``) with its times, the timeout,
the Python frames that issued it; and, beside torch's keys, ours under ``"collectives"``:
the algorithm, the call's fingerprint and the step and peer the call is waiting on.

The buffer is written to ``COLLECTIVES_TRACE_DIR`` (default ``./collectives_trace``), one
file per rank, ``collectives_trace_rank_<global rank>`` (a pickle, as torch's):

* on a timeout, when ``COLLECTIVES_DUMP_ON_TIMEOUT=1``: the rank that timed out writes its own
  and asks every other rank to write theirs (a key in the rendezvous store, which a watchdog
  thread in each rank polls while the variable is set: a rank that never called, or sits in
  another group's call, writes too);
* on ``SIGUSR1`` (with either variable set: the handler is installed at the first call);
* when asked: :func:`dump`.

Then ``python -m torch.distributed.flight_recorder.fr_trace DIR`` (``torchfrtrace``) matches the
ranks' entries and names the first collective that a rank is missing or that differs in type
or sizes. It cannot see a difference of op (torch records none); our own explanation can.
Torch 2.11's analyzer reads NCCL and XCCL records only (it asserts on the ``gloo:`` prefix);
newer ones read gloo's too: :func:`analyzer_reads_gloo` says which this torch is.

Cost: one small object per call (its fields; torch's dictionary is built when the buffer is
read), kept in a deque; nothing per message but one field written while a call waits.
"""
import collections
import itertools
import os
import pickle
import signal
import sys
import threading
import time

from . import settings

VERSION = "2.10"          # the dump format torch 2.11-2.15 write and fr_trace reads
PREFIX = "collectives_trace_rank_"
DUMP_KEY = "collectives/flight_recorder/dump"

_entries = collections.deque()   # bounded at the first call, by COLLECTIVES_TRACE_BUFFER
_ids = itertools.count()
_groups = {}              # pg name -> {"name", "desc", "ranks"}
_pg_ids = {}              # pg name -> its place in _groups (torch's pg_id)
_collective_seq = collections.Counter()   # per pg name: collectives recorded so far
_p2p_seq = collections.Counter()
_lock = threading.Lock()
_state = {"global_rank": None, "store": None, "watching": False, "handler": False}

_DTYPES = {"float32": "Float", "float64": "Double", "float16": "Half", "bfloat16": "BFloat16",
           "int64": "Long", "int32": "Int", "int16": "Short", "int8": "Char", "uint8": "Byte",
           "bool": "Bool", "complex64": "ComplexFloat", "complex128": "ComplexDouble"}


def _dtype_name(dtype):
    text = str(dtype).replace("torch.", "")
    return _DTYPES.get(text, text)


_HERE = os.path.dirname(os.path.abspath(__file__))
_OURS = {}        # file name -> whether it is this package's: a memo, a few entries per program


def _frames(limit=16):
    """The Python frames that issued the call, innermost first, without this package's own:
    ``(code, last instruction)`` pairs, which :func:`_line` turns into line numbers when the
    entry is read.

    Walked by hand: ``traceback.extract_stack`` reads every frame's source line (a ``stat``
    per file to check linecache) and cost ~260 us per call here, more than a 4 KiB
    all_reduce's own messages. ``frame.f_lineno`` decodes each function's line table up to
    the instruction: ~3 us a call for 16 frames here (6.7 against 4.0 us for the walk); the
    instruction's offset is free. torch's recorder keeps frames unsymbolised for the same
    reason.
    """
    out = []
    frame = sys._getframe(1)
    while frame is not None and len(out) < limit:
        code = frame.f_code
        ours = _OURS.get(code.co_filename)
        if ours is None:
            ours = _OURS[code.co_filename] = os.path.abspath(code.co_filename).startswith(_HERE)
        if not ours:
            out.append((code, frame.f_lasti))
        frame = frame.f_back
    return out


def _line(code, lasti):
    """The line of ``code`` that its instruction at byte offset ``lasti`` belongs to."""
    if lasti >= 0:
        for start, end, line in code.co_lines():
            if start <= lasti < end:
                return line or 0
    return code.co_firstlineno


def _sizes(collective, fields, size):
    """(input_sizes, output_sizes) as torch records them, from the call's fingerprint."""
    if "sends" in fields:   # all_to_all: element counts to and from each rank
        return [[c] for c in fields["sends"]], [[c] for c in fields.get("recvs") or fields["sends"]]
    shape = fields.get("shape")
    if shape is None:
        return [], []
    if isinstance(shape, str):      # "4x[2, 3]": four tensors of one shape
        count, one = shape.split("x", 1)
        shapes = [[int(x) for x in one.strip("[]").split(",") if x.strip()]] * int(count)
    elif shape and isinstance(shape[0], list):
        shapes = [list(s) for s in shape]
    else:
        shapes = [list(shape)]
    if collective in ("all_gather", "all_gather_into_tensor") and shapes:
        numel = 1
        for d in shapes[0]:
            numel *= d
        return [shapes[0]], [[numel * size]]
    return shapes, shapes


def analyzer_reads_gloo():
    """Whether this torch's ``fr_trace`` accepts records named ``gloo:...`` (torch 2.11's does not)."""
    import inspect
    try:
        from torch.distributed.flight_recorder.components import types
        return '"gloo"' in inspect.getsource(types.Op.__init__)
    except Exception:     # no analyzer in this torch, or no source to read
        return False


class _Entry:
    """One call's record, kept as the fields it was made from: torch's dictionary is built only
    when someone reads the buffer (:func:`_public`), not on every call (building it cost ~15 us
    a call, a tenth of a 4 KiB broadcast's whole CPU time)."""
    __slots__ = ("record_id", "name", "collective_seq", "p2p_seq", "peers", "kind", "collective", "fields",
                 "size", "created_ns", "state", "started_ns", "completed_ns", "timeout", "frames",
                 "thread_id", "thread_name", "algorithm", "description", "waiting_on")


def record(info, collective, algorithm, description, fields, peers=None, timeout=None):
    """A new entry (state ``scheduled``) for a call on the group ``info``; returns it.

    ``peers``: (src, dst) group ranks of a point-to-point message; None for a collective.
    ``description``: the call's fingerprint as text, or a function that makes it, called only
    if the entry is ever read.
    """
    global _entries
    name = info.key
    if _entries.maxlen is None:
        _entries = collections.deque(_entries, maxlen=settings.trace_buffer())
    if name not in _groups:
        _pg_ids[name] = len(_groups)
        _groups[name] = {"name": name, "desc": name, "ranks": str(list(info.ranks))}
    if _state["global_rank"] is None and info.member:
        _state["global_rank"] = info.ranks[info.rank]
    e = _Entry()
    e.name, e.peers, e.collective, e.fields, e.size = name, peers, collective, fields, info.size
    e.kind = None if peers is None else ("send" if info.rank == peers[0] else "recv")
    e.created_ns = time.time_ns()
    e.state, e.started_ns, e.completed_ns = "scheduled", None, None
    e.timeout = timeout if timeout else settings.timeout_seconds()
    e.frames = _frames()
    e.thread_id, e.thread_name = threading.get_ident(), threading.current_thread().name
    e.algorithm = algorithm
    e.description, e.waiting_on = description, None
    with _lock:
        if peers is not None:
            _p2p_seq[name] += 1
            e.collective_seq, e.p2p_seq = _collective_seq[name], _p2p_seq[name]
        else:
            _collective_seq[name] += 1
            e.collective_seq, e.p2p_seq = _collective_seq[name], 0
        e.record_id = next(_ids)
        _entries.append(e)
    return e


# our names that torch's recorder calls otherwise
_TORCH_NAMES = {"all_gather_into_tensor": "_all_gather_base", "reduce_scatter_tensor": "_reduce_scatter_base",
                "all_to_all_single": "all_to_all"}


def started(entry, algorithm=None, description=None):
    entry.state = "started"
    entry.started_ns = time.time_ns()
    if algorithm is not None:
        entry.algorithm = algorithm
    if description is not None:
        entry.description = description


def waiting(entry, step, kind, peer, nbytes):
    """The call now waits on ``peer`` (a global rank) at ``step``."""
    entry.waiting_on = {"step": step, "kind": kind, "peer": peer, "bytes": nbytes}


def completed(entry):
    entry.state = "completed"
    entry.completed_ns = time.time_ns()
    entry.waiting_on = None


def entries():
    """A copy of this rank's buffer, oldest first."""
    with _lock:
        return [_public(e) for e in _entries]


def _public(e):
    """An entry as torch's recorder writes it (ProcessGroupNCCL's keys, version 2.10)."""
    if callable(e.description):
        e.description = e.description()
    inputs, outputs = _sizes(e.collective, e.fields, e.size)
    dtype = e.fields.get("dtype")
    if e.peers is not None:
        src, dst = e.peers
        profiling = f"gloo:send {src}->{dst}" if e.kind == "send" else f"gloo:recv {dst}<-{src}"
    else:
        profiling = f"gloo:{_TORCH_NAMES.get(e.collective, e.collective)}"
    return {
        "record_id": e.record_id,
        "pg_id": _pg_ids[e.name],
        "process_group": (e.name, e.name),
        "collective_seq_id": e.collective_seq,
        "p2p_seq_id": e.p2p_seq,
        "op_id": e.record_id + 1,
        "profiling_name": profiling,
        "time_created_ns": e.created_ns,
        "input_sizes": inputs,
        "input_dtypes": [_dtype_name(dtype)] * len(inputs) if dtype is not None else [],
        "output_sizes": outputs,
        "output_dtypes": [_dtype_name(dtype)] * len(outputs) if dtype is not None else [],
        "state": e.state,
        "time_discovered_started_ns": e.started_ns,
        "time_discovered_completed_ns": e.completed_ns,
        "retired": e.state == "completed",
        "timeout_ms": int(e.timeout * 1000),
        "is_p2p": e.peers is not None,
        "frames": [{"filename": code.co_filename, "line": _line(code, lasti), "name": code.co_name}
                   for code, lasti in e.frames],
        "thread_id": str(e.thread_id),
        "thread_name": e.thread_name,
        "collectives": {"algorithm": e.algorithm, "call": e.description,
                        "waiting_on": None if e.waiting_on is None else dict(e.waiting_on)},
    }


def dump(directory=None, reason=""):
    """Write this rank's buffer to ``directory`` (default ``COLLECTIVES_TRACE_DIR``); returns the path."""
    directory = directory or settings.trace_dir()
    os.makedirs(directory, exist_ok=True)
    rank = _state["global_rank"] if _state["global_rank"] is not None else 0
    with _lock:
        found = [_public(e) for e in _entries]
    pg_status = {}
    for name in _groups:
        mine = [e for e in found if e["process_group"][0] == name and not e["is_p2p"]]
        pg_status[str(_pg_ids[name])] = {
            "last_enqueued_collective": max((e["collective_seq_id"] for e in mine), default=-1),
            "last_started_collective": max((e["collective_seq_id"] for e in mine if e["state"] != "scheduled"),
                                           default=-1),
            "last_completed_collective": max((e["collective_seq_id"] for e in mine if e["state"] == "completed"),
                                             default=-1)}
    data = {"version": VERSION, "comm_lib_version": "collectives", "pg_config": dict(_groups),
            "pg_status": pg_status, "entries": found, "reason": reason}
    path = os.path.join(directory, f"{PREFIX}{rank}")
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        pickle.dump(data, f)
    os.replace(tmp, path)   # a reader never sees half a file
    return path


def on_timeout(error):
    """A call timed out: with ``COLLECTIVES_DUMP_ON_TIMEOUT=1``, dump, and ask every rank to."""
    if not settings.dump_on_timeout():
        return
    try:
        dump(reason=str(error).splitlines()[0][:500])
    except OSError:
        return
    store = _state["store"]
    if store is not None:   # a timeout has happened: the store may be asked (collectives.desync)
        try:
            store.set(DUMP_KEY, str(_state["global_rank"]))
        except Exception:
            pass


def arm(store):
    """At a rank's first call: with dumping asked for, install the SIGUSR1 handler (main thread
    only, as Python allows) and start the watchdog that dumps when another rank asks."""
    if not (settings.dump_on_timeout() or settings.trace_dir_set()):
        return
    if _state["store"] is None and store is not None:
        _state["store"] = store
    if not _state["handler"] and threading.current_thread() is threading.main_thread():
        _state["handler"] = True
        try:
            signal.signal(signal.SIGUSR1, lambda signum, frame: dump(reason="SIGUSR1"))
        except (ValueError, OSError):
            pass
    if settings.dump_on_timeout() and not _state["watching"] and store is not None:
        _state["watching"] = True
        threading.Thread(target=_watch, args=(store,), daemon=True, name="collectives-flight-recorder").start()


def _watch(store):
    """Poll the store for another rank's request to dump (as torch's NCCL watchdog does)."""
    while True:
        time.sleep(1.0)
        try:
            if store.check([DUMP_KEY]):
                dump(reason=f"rank {store.get(DUMP_KEY).decode()} timed out")
                return
        except Exception:
            return   # the store is gone: the job is ending
