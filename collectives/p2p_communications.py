"""The one door to the network.

Every byte that a collective in this package moves goes through :class:`Comm`.
No other module calls ``torch.distributed.send/recv/isend/irecv`` (except
``bench_call``, which times bare torch calls against the door on purpose). Keeping the
door narrow buys four things, each of which lives here and nowhere else:

* **group ranks**: algorithms speak in ranks 0..N-1 of their group; the door
  hands them to the group's own ``send``/``recv`` (which take group ranks) and
  translates them to global ranks where ``torch.distributed`` wants those
  (NCCL's ``P2POp``) and for traces and errors.
* **timeouts**: every wait is bounded by ``COLLECTIVES_TIMEOUT`` seconds
  (default 300). On expiry the error names the collective, the algorithm, the
  step and the peer, instead of leaving the program hanging.
* **counting**: bytes and messages each rank sends and receives, and the steps
  they happen in, go to every active :func:`count_traffic` counter. The tests
  use them to prove each algorithm moves exactly the traffic its card claims.
* **tracing**: :func:`trace` records every message (collective, algorithm,
  step, src, dst, bytes, start and end time) for the timeline pictures, and
  ``COLLECTIVES_VERBOSE=1`` (or ``VERBOSE=1``) prints each one as it happens.

A send and its matching receive are always *posted together* and then waited
on together (``Comm.exchange``). Issued one after the other, a blocking send on
both sides of a pair deadlocks on NCCL and on any transport without buffering.
"""
import contextlib
import datetime
import os
import re
import sys
import time
from dataclasses import dataclass, field

import torch.distributed as dist

DEFAULT_TIMEOUT = 300.0

# Observers (traffic counters and tracers) active in this process. The door is
# the only place that sees every message, so this is where they are fed.
_observers = []


def timeout_seconds():
    """The per-wait limit in seconds, read from ``COLLECTIVES_TIMEOUT`` at every call."""
    value = os.environ.get("COLLECTIVES_TIMEOUT")
    if not value:
        return DEFAULT_TIMEOUT
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError(f"COLLECTIVES_TIMEOUT must be a number of seconds, got {value!r}") from None
    if seconds <= 0:
        raise ValueError(f"COLLECTIVES_TIMEOUT must be positive, got {value!r}")
    return seconds


def _verbose():
    return os.environ.get("COLLECTIVES_VERBOSE", os.environ.get("VERBOSE", "0")) not in ("", "0")


class CollectiveError(RuntimeError):
    """A point-to-point message inside a collective failed (peer gone, transport error)."""


class CollectiveTimeout(CollectiveError):
    """A rank waited longer than ``COLLECTIVES_TIMEOUT`` for a peer."""


@dataclass
class Message:
    """One point-to-point transfer as seen by one rank (``kind`` is 'send' or 'recv')."""
    collective: str
    algorithm: str
    step: int
    kind: str
    src: int
    dst: int
    nbytes: int
    start: float
    end: float = float("nan")


@dataclass
class Traffic:
    """Counts what this rank sent and received while the counter was active."""
    sent_bytes: int = 0
    sent_messages: int = 0
    recv_bytes: int = 0
    recv_messages: int = 0
    steps: set = field(default_factory=set)

    @property
    def rounds(self):
        """Number of distinct steps in which this rank sent or received anything."""
        return len(self.steps)

    def _observe(self, msg):
        if msg.kind == "send":
            self.sent_bytes += msg.nbytes
            self.sent_messages += 1
        else:
            self.recv_bytes += msg.nbytes
            self.recv_messages += 1
        self.steps.add((msg.collective, msg.step))


class Trace(list):
    """A list of :class:`Message` records, filled while the tracer is active."""

    def _observe(self, msg):
        self.append(msg)


@contextlib.contextmanager
def _observing(observer):
    _observers.append(observer)
    try:
        yield observer
    finally:
        _observers.remove(observer)


def count_traffic():
    """Context manager counting this rank's messages and bytes.

    Example::

        >>> with collectives.count_traffic() as t:
        ...     collectives.all_reduce(x, algorithm="ring")
        >>> t.sent_messages, t.sent_bytes
        (6, 3072)   # Rank 0 of 4, x of 1024 float32: 2(N-1) messages, 2(N-1)/N*S bytes
    """
    return _observing(Traffic())


def trace():
    """Context manager recording every message this rank sends or receives."""
    return _observing(Trace())


class Pending:
    """Messages posted by :meth:`Comm.post` and not yet waited for."""

    def __init__(self, comm, step, entries):
        self.comm, self.step, self.entries = comm, step, entries

    def wait(self):
        comm = self.comm
        watched = comm.verbose or _observers
        for work, kind, peer, nbytes, start in self.entries:
            try:
                if comm.nccl:
                    # NCCL's wait() only orders streams; poll so the CPU side is bounded too.
                    deadline = time.monotonic() + comm.timeout
                    while not work.is_completed():
                        if time.monotonic() > deadline:
                            raise TimeoutError("no completion")
                        time.sleep(0)
                    work.wait()
                else:
                    work.wait(timeout=comm.wait_limit)
            except Exception as exc:
                raise comm._failure(comm._message(self.step, kind, peer, nbytes, start), peer, exc) from exc
            if watched:
                comm._report(comm._message(self.step, kind, peer, nbytes, start, time.time()))
        self.entries = []


class Comm:
    """Point-to-point messaging for one collective call on one group.

    Algorithms get a ``Comm`` and use ``comm.rank`` and ``comm.size`` (ranks of
    the group, 0..N-1) and the messaging methods below, whose ``peer``
    arguments are group ranks. Tensors must be contiguous; empty tensors are
    not sent at all (both sides know the sizes, so both skip them).
    """

    def __init__(self, group, collective, algorithm, ranks=None, backend=None, me=None):
        """``ranks``, ``backend`` and ``me`` (this process's global rank) may be passed
        by a caller that already knows them; otherwise they are looked up."""
        self.group = dist.group.WORLD if group is None else group
        self.ranks = ranks if ranks is not None else _group_ranks(self.group)
        self.rank = self.ranks.index(dist.get_rank() if me is None else me)
        self.size = len(self.ranks)
        self.collective = collective
        self.algorithm = algorithm
        # read once per collective call, not per message: an os.environ lookup
        # costs ~2 us on an idle core here (more on a busy one), which a 4 KiB
        # exchange (~250 us) feels when it is paid per message
        self.timeout = timeout_seconds()
        self.wait_limit = datetime.timedelta(seconds=self.timeout)
        self.verbose = _verbose()
        self.backend = backend if backend is not None else str(dist.get_backend(self.group))
        self.nccl = "nccl" in self.backend

    def post(self, step, sends=(), recvs=()):
        """Post sends ``[(tensor, peer)]`` and receives ``[(tensor, peer)]`` at once.

        Everything is checked first and then posted back to back. On 2 shared
        cores a gap between posting a receive and its paired send lets the
        scheduler run the peer's I/O thread in between, and each Python call
        here costs ~2 us; both show in a 4 KiB exchange of ~300 us
        (docs/benchmarks.md, "The door's cost"). So :class:`Message` records
        are built only when someone watches (a tracer, a counter, VERBOSE) or
        an error has to name the message.
        """
        todo = []
        for kind, pairs in (("recv", recvs), ("send", sends)):
            for tensor, peer in pairs:
                nbytes = tensor.nbytes
                if nbytes == 0:
                    continue
                if not tensor.is_contiguous():
                    raise ValueError("the point-to-point door only moves contiguous tensors")
                if tensor.is_cuda and not self.nccl:
                    # gloo would write() from a device pointer and abort the whole process
                    raise ValueError(f"the point-to-point door got a CUDA tensor on a {self.backend} "
                                     f"group, which sends host memory only: stage it to the CPU first")
                todo.append((kind, tensor, peer, nbytes))
        group, tag, start, works = self.group, step & 0x7FFFFFFF, time.time(), []
        if self.nccl:
            p2p_group = None if group is dist.group.WORLD else group
            ops = [dist.P2POp(dist.isend if kind == "send" else dist.irecv, tensor, self.ranks[peer], p2p_group)
                   for kind, tensor, peer, _ in todo]
            works = dist.batch_isend_irecv(ops) if ops else []
        else:
            # dist.isend(t, dst, group, tag) checks its arguments, maps dst to a group
            # rank and calls group.send([t], group_rank, tag). The checks are made
            # above and peer already is a group rank, so the door calls the group.
            for kind, tensor, peer, nbytes in todo:
                try:
                    works.append((group.send if kind == "send" else group.recv)([tensor], peer, tag))
                except Exception as exc:
                    raise self._failure(self._message(step, kind, peer, nbytes, start), peer, exc) from exc
        return Pending(self, step, [(work, kind, peer, nbytes, start)
                                    for work, (kind, _, peer, nbytes) in zip(works, todo)])

    def _message(self, step, kind, peer, nbytes, start, end=float("nan")):
        me, other = self.ranks[self.rank], self.ranks[peer]
        src, dst = (me, other) if kind == "send" else (other, me)
        return Message(self.collective, self.algorithm, step, kind, src, dst, nbytes, start, end)

    def _report(self, msg):
        for obs in _observers:
            obs._observe(msg)
        if self.verbose:
            peer = msg.dst if msg.kind == "send" else msg.src
            arrow = f"-> {peer}" if msg.kind == "send" else f"<- {peer}"
            print(f"[rank {self.ranks[self.rank]}] {msg.collective}/{msg.algorithm} step {msg.step}: "
                  f"{msg.kind} {msg.nbytes} B {arrow}", file=sys.stderr, flush=True)

    def exchange(self, step, sends=(), recvs=()):
        """Post all sends and receives together, then wait for all of them."""
        self.post(step, sends, recvs).wait()

    def send(self, tensor, peer, step):
        self.exchange(step, sends=[(tensor, peer)])

    def recv(self, tensor, peer, step):
        self.exchange(step, recvs=[(tensor, peer)])

    def sendrecv(self, send_tensor, dst, recv_tensor, src, step):
        self.exchange(step, sends=[(send_tensor, dst)], recvs=[(recv_tensor, src)])

    def _failure(self, msg, peer, exc):
        what = "to send" if msg.kind == "send" else "to receive"
        where = (f"collectives.{self.collective}(algorithm={self.algorithm!r}) on rank "
                 f"{self.ranks[self.rank]}, step {msg.step}: ")
        peer_text = f"rank {self.ranks[peer]}" + (f" (group rank {peer})" if self.ranks[peer] != peer else "")
        text = str(exc).splitlines()[-1] if str(exc) else type(exc).__name__
        if isinstance(exc, TimeoutError) or "Timed out" in text or "timed out" in text:
            return CollectiveTimeout(
                f"{where}timed out after {self.timeout:g} s waiting {what} {msg.nbytes} bytes "
                f"{'to' if msg.kind == 'send' else 'from'} {peer_text}. The peer may have called a "
                f"different collective, passed a different size, failed validation or died. "
                f"COLLECTIVES_TIMEOUT sets the limit; COLLECTIVES_DEBUG=1 checks that ranks agree.")
        return CollectiveError(f"{where}failed {what} {msg.nbytes} bytes "
                               f"{'to' if msg.kind == 'send' else 'from'} {peer_text}: "
                               f"{_explain(text, peer_text)}")


def _explain(text, peer_text):
    """Say what a transport error means for the user; keep the transport's words after it."""
    brief = re.sub(r"^\[[^\]]*\]\s*", "", text).split(". ")[0]
    if "Application timeout caused pair closure" in text:
        return (f"the connection to {peer_text} was closed by an earlier timeout on this group, "
                f"which cannot be used again; create a new group ({brief})")
    if any(s in text for s in ("Connection closed by peer", "Connection reset", "Broken pipe")):
        return (f"{peer_text} closed the connection: it exited, or gave up on this group after "
                f"its own error or timeout ({brief})")
    return brief


def _group_ranks(group):
    if group is None or group is dist.group.WORLD:
        return list(range(dist.get_world_size()))
    return dist.get_process_group_ranks(group)
