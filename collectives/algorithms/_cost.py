"""What one call of an algorithm costs, as code: the figures its card states.

Every algorithm module defines ``cost(n, s, item=1)``: for a group of ``n``
ranks and ``s`` bytes (the size of the call, as :data:`SIZE_OF_CALL` defines it
for each collective), made of elements of ``item`` bytes, the :class:`Cost` of
one call. The registry, the cost model, the automatic choice,
the traffic and memory tests and chapter 5's table all read it from there.

The figures are exact, not asymptotic: pieces are cut as the algorithm cuts
them (``tensor_split``: sizes differ by one element, some may be empty, and
empty pieces are not sent), so ``tests/test_traffic.py`` can demand that the
messages counted at the door equal them, for any N and any size. A group of
one moves nothing (``collectives.api`` copies locally), so every cost is zero
at N = 1.
"""
from dataclasses import dataclass

from ._util import split_bounds


# What "the size of a call" (S, ``nbytes``) means for each collective: the convention of
# nccl-tests, which the costs, the cost model, the automatic choice, the benchmarks and the
# simulator all follow. Stated here, once.
SIZE_OF_CALL = {
    "broadcast": "the tensor",
    "reduce": "the tensor",
    "all_reduce": "the tensor",
    "all_gather": "the whole output (N pieces)",
    "gather": "the whole output (N pieces)",
    "reduce_scatter": "the whole input (N pieces)",
    "scatter": "the whole input (N pieces)",
    "all_to_all": "the whole input of one rank (N pieces)",
    "barrier": "nothing (0)",
}


@dataclass(frozen=True)
class Cost:
    """One call, counted on the busiest rank (``total_messages`` aside: the whole group).

    steps:          distinct communication steps (message tags) of the whole group
    messages:       most messages one rank sends or receives
    total_messages: the messages of the whole call, every rank's sends together (each is
                    received once, so also every rank's receives together): what the
                    simulator moves, exactly. N x ``messages`` only where every rank sends
                    as much as the busiest (a ring on at least N elements); fewer where the
                    ranks differ (a binomial tree sends N - 1, its root log N of them)
    sent_bytes:     most bytes one rank sends
    recv_bytes:     most bytes one rank receives
    critical_bytes: the sum, over steps, of the largest message of the step: what
                    the alpha-beta model charges beta for when steps run one after another
    reduced_bytes:  most bytes one rank combines with ``op`` (what gamma is charged for)
    extra_memory:   most bytes of temporary tensors one rank allocates
    """
    steps: int = 0
    messages: int = 0
    total_messages: int = 0
    sent_bytes: int = 0
    recv_bytes: int = 0
    critical_bytes: int = 0
    reduced_bytes: int = 0
    extra_memory: int = 0


NOTHING = Cost()

CHUNK_BYTES = 1 << 20
"""The reused receive buffer's size where an algorithm receives large messages
piece by piece instead of whole (``all_reduce_rabenseifner``)."""


def pieces(s, parts, item=1):
    """Byte sizes of ``tensor_split(parts)`` of ``s`` bytes of ``item``-byte elements."""
    b = split_bounds(s // item, parts)
    return [(b[i + 1] - b[i]) * item for i in range(parts)]


class Tally:
    """Count a schedule rank by rank: for algorithms whose figures differ by rank
    (trees, folds, uneven pieces), the cost function lists the messages of one
    call here, and the busiest rank's figures come out, with the whole call's
    count of messages (the sum of every rank's). A message of 0 bytes is not
    sent (the door skips it), so it is not counted."""

    def __init__(self, n):
        self.n = n
        self.sent = [0] * n
        self.recv = [0] * n
        self.sent_msgs = [0] * n
        self.recv_msgs = [0] * n
        self.reduced = [0] * n
        self.memory = [0] * n
        self.largest = {}

    def message(self, step, src, dst, nbytes):
        if nbytes == 0:
            return
        self.sent[src] += nbytes
        self.recv[dst] += nbytes
        self.sent_msgs[src] += 1
        self.recv_msgs[dst] += 1
        self.largest[step] = max(self.largest.get(step, 0), nbytes)

    def ring(self, sizes, steps, shift=0, reduce=False, members=None):
        """Count a ring pass at once, as :meth:`message` would one by one: at the s-th of the
        M-1 ``steps``, the rank at place i of ``members`` (default: every rank, M = N) sends
        chunk ``(i - s - shift) mod M`` (of ``sizes`` bytes) to the next, who folds it in if
        ``reduce``. O(M) instead of O(M^2): over the M-1 steps a rank sends every chunk but
        one, and at every step each chunk is sent by some rank, so the step's largest message
        is the largest chunk (the ring's cost() at 4,096 ranks was 25 s of tallying)."""
        members = range(self.n) if members is None else members
        m = len(members)
        total, nonzero, largest = sum(sizes), sum(1 for x in sizes if x), max(sizes)
        for i, r in enumerate(members):
            skipped = sizes[(i - shift + 1) % m]      # s = M-1 would send it: the ring stops before
            nbytes, count, dst = total - skipped, nonzero - (1 if skipped else 0), members[(i + 1) % m]
            self.sent[r] += nbytes
            self.recv[dst] += nbytes
            self.sent_msgs[r] += count
            self.recv_msgs[dst] += count
            if reduce:
                self.reduced[dst] += nbytes
        if largest:
            for step in steps:
                self.largest[step] = max(self.largest.get(step, 0), largest)

    def stream(self, src, dst, nbytes, count):
        """``count`` messages of ``nbytes`` in all from ``src`` to ``dst``, counted at once (the
        caller counts only messages of more than 0 bytes, and records each step's largest
        message in :attr:`largest` itself)."""
        self.sent[src] += nbytes
        self.recv[dst] += nbytes
        self.sent_msgs[src] += count
        self.recv_msgs[dst] += count

    def reduce(self, rank, nbytes):
        self.reduced[rank] += nbytes

    def allocate(self, rank, nbytes):
        self.memory[rank] += nbytes

    def cost(self):
        return Cost(steps=len(self.largest),
                    messages=max(max(a, b) for a, b in zip(self.sent_msgs, self.recv_msgs)),
                    total_messages=sum(self.sent_msgs),
                    sent_bytes=max(self.sent), recv_bytes=max(self.recv),
                    critical_bytes=sum(self.largest.values()),
                    reduced_bytes=max(self.reduced), extra_memory=max(self.memory))
