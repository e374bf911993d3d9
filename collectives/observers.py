"""What watches the messages: traffic counters and traces.

The door (``p2p_communications``, or the simulator's) is the only place that sees
every message, so it hands each finished one to :func:`report_message`, and the
call machinery hands each finished call to :func:`report_call`. Whoever is
listening, a :func:`count_traffic` counter or a :func:`trace`, gets it.

The listeners of this process are the one piece of module state: a counter is
a context manager, active for the ``with`` block that opened it.
"""
import contextlib
from dataclasses import dataclass, field

# Observers (traffic counters and tracers) active in this process.
_observers = []


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
    link_bytes: object = None    # simulator only: {link class: bytes this message put on it}


@dataclass
class CallRecord:
    """One collective call as seen by one rank, for traces (a slice around its messages)."""
    collective: str
    algorithm: str
    seq: int
    ranks: tuple
    rank: int
    nbytes: int
    start: float
    end: float = float("nan")
    kind: str = "call"   # beside Message's "send"/"recv", so a filter on kind skips calls


@dataclass
class Traffic:
    """Counts what this rank sent and received while the counter was active.

    ``rank``: count only the messages that rank recorded (its sends and its receives),
    for a process that sees several ranks' messages (the simulator); None counts all.
    """
    sent_bytes: int = 0
    sent_messages: int = 0
    recv_bytes: int = 0
    recv_messages: int = 0
    steps: set = field(default_factory=set)
    rank: object = None
    # simulated messages only: bytes per link class (``collectives.sim.topology``) that this
    # rank's sends put on the network, once per link crossed
    link_bytes: dict = field(default_factory=dict)

    @property
    def rounds(self):
        """Number of distinct steps in which this rank sent or received anything."""
        return len(self.steps)

    def _observe(self, msg):
        if self.rank is not None and self.rank != (msg.src if msg.kind == "send" else msg.dst):
            return
        if msg.kind == "send":
            self.sent_bytes += msg.nbytes
            self.sent_messages += 1
            for cls, nbytes in (msg.link_bytes or {}).items():
                self.link_bytes[cls] = self.link_bytes.get(cls, 0) + nbytes
        else:
            self.recv_bytes += msg.nbytes
            self.recv_messages += 1
        self.steps.add((msg.collective, msg.step))

    def _observe_call(self, call):
        pass


class Trace(list):
    """:class:`Message` and :class:`CallRecord` records, in order, filled while the tracer is active."""

    def _observe(self, msg):
        self.append(msg)

    def _observe_call(self, call):
        self.append(call)

    @property
    def messages(self):
        return [r for r in self if isinstance(r, Message)]

    @property
    def calls(self):
        return [r for r in self if isinstance(r, CallRecord)]


def watched():
    """Whether anyone listens (the door skips building records when nobody does)."""
    return bool(_observers)


def report_message(msg):
    """Hand a finished :class:`Message` to every active observer."""
    for obs in _observers:
        obs._observe(msg)


def report_call(record):
    """Hand a finished :class:`CallRecord` to every active tracer."""
    for obs in _observers:
        obs._observe_call(record)


@contextlib.contextmanager
def observing(observer):
    """Feed ``observer`` (anything with ``_observe`` and ``_observe_call``) while the block runs."""
    _observers.append(observer)
    try:
        yield observer
    finally:
        _observers.remove(observer)


def count_traffic(rank=None):
    """Context manager counting this rank's messages and bytes (``rank``: only those of that
    rank, where one process sees many: ``collectives.sim``).

    Example::

        >>> with collectives.count_traffic() as t:
        ...     collectives.all_reduce(x, algorithm="ring")
        >>> t.sent_messages, t.sent_bytes
        (6, 3072)   # Rank 0 of 4, x of 1024 float32: 2(N-1) messages, 2(N-1)/N*S bytes
    """
    return observing(Traffic(rank=rank))


def trace():
    """Context manager recording every message this rank sends or receives."""
    return observing(Trace())
