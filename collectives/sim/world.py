"""N virtual ranks in one process: coroutines, one clock, one event queue, rendezvous messages.

Each rank is a greenlet (a coroutine with its own stack: the unchanged algorithm code
calls ``comm.recv(...)`` deep inside its loops and is simply suspended there). One
loop, :meth:`World.run`, pops events in time order; an event resumes a rank, starts a
message's bytes moving, or finishes them. A rank runs, at the current simulated time,
until it waits for something that has not happened yet; then the loop goes on.

Messages meet as in NCCL (rendezvous): a posted send and a posted receive match when
source, destination, step and size agree (the real door puts the same four in its
tag). Then the message starts (LogGP, :mod:`.topology`): no sooner than ``gap`` (g) after
the previous start out of its sender and into its receiver (a NIC sets up one message at a
time; g is alpha unless the topology says otherwise), and no sooner than its ends were
posted (the i-th message of a post i x ``overhead`` after the post). After the latency
alpha (L), which messages in flight overlap, its bytes flow over the route's links,
shared max-min fairly (:mod:`.network`). Both ends complete when the last byte lands, and
the receiver's tensor gets the sender's bytes then. A send whose receive is never posted
never completes: if every rank ends up waiting, the schedule deadlocks, and
:mod:`.deadlock` names the cycle.

Compute (``op.combine``, ``gamma`` per reduced byte) takes the rank's time but not
the network's: messages already posted keep moving. So does the CPU a rank spends
posting messages (``overhead`` per message, LogP's *o*) and starting a call (``call``).
Where ranks share ``cores`` cores, all of these and the wake-up after each wait queue
for a free core.

Stragglers and noise (``simulate(stragglers=, delays=, jitter=, seed=)``, ``--straggler``,
``--jitter``, ``--seed``), none by default:

* a *slow* rank (``stragglers={rank: F}``, ``--straggler RANK:F``) is a host F times slower
  at everything it does itself, not a slower cable: its CPU time (gamma per reduced byte,
  ``call``, ``overhead`` o per posted message, ``wake``, its memory work and Python) is
  multiplied by F, and so are the latency L and the gap g of every message it sends or
  receives (a message is as slow as its slower end: the factor is the larger of its two
  ends'). L is mostly the ends' protocol work (NCCL's hwLat is its protocol's, not the
  cable's), and g is the NIC's set-up, so both belong to the host; G, the links' time per
  byte, does not change. A rank throttled to half its clock is F = 2;
* a *late* rank (``delays={rank: seconds}``, ``--straggler RANK:+SECONDS``) enters every
  call SECONDS after the others (on a core, where cores are shared): the arrival skew that
  load imbalance before a collective gives. It is not multiplied by its factor;
* *jitter* (``jitter=J``, ``--jitter J``): every message's latency L gets an extra drawn
  from the exponential distribution of mean J (memoryless noise: an interrupt, a busy
  switch), from ``random.Random(seed)`` in the order messages meet, which the event loop
  fixes. The same seed gives the same times, bit for bit, on topologies whose ``python``
  is 0 (on ``local`` the host's own timing varies anyway). The gap g is not jittered.

* a *slow NIC* (``slow_links={rank: F}``, ``--slow-link RANK:F``) is a slower cable, not a
  slower host: the bandwidth of that rank's links, both directions, is divided by F (F >= 1);
  the latency L, the gap g and its CPU do not change, so it slows bytes only: a large
  message F times, a small one hardly. A rank's links are those its messages leave and enter
  the network by, the first link of every route out of it and the last of every route into
  it (:func:`slowed`): its cable to the switch (flat, fat tree), its terminal link
  (dragonfly), its links to its torus neighbours, and on ``nodes`` and ``rail`` its NVLink
  port and its NIC. A NIC that a node's ranks share (``"nic": "node"``) is slowed for all
  of them; a link two slow ranks share is divided by the larger factor.

A factor of 1, a delay of 0 and a jitter of 0 change nothing: those paths are not taken.
"""
import contextlib
import gc
import heapq
import math
import random
import time

import greenlet
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .. import observers
from ..door import each_message
from ..observers import Message
from ..p2p_communications import MAX_STEP
from .network import Network


class SimulationError(RuntimeError):
    """A rank raised: the message names the rank; ``__cause__`` is the original error."""


class End:
    """One end of a message: a posted send or receive."""
    __slots__ = ("kind", "rank", "peer", "step", "nbytes", "tensor", "posted", "done", "watched",
                 "collective", "algorithm", "links", "seq")

    def __init__(self, kind, rank, peer, step, nbytes, tensor, posted, collective, algorithm):
        self.kind, self.rank, self.peer, self.step = kind, rank, peer, step
        self.nbytes, self.tensor, self.posted = nbytes, tensor, posted
        self.collective, self.algorithm = collective, algorithm
        self.done = self.watched = False
        self.links = ()
        self.seq = None

    def key(self):
        src, dst = (self.rank, self.peer) if self.kind == "send" else (self.peer, self.rank)
        return src, dst, self.step, self.nbytes


class Rank:
    __slots__ = ("id", "let", "waiting", "left", "finished", "end_time", "error", "debt", "clock", "ahead",
                 "sent_messages", "sent_bytes", "recv_messages", "recv_bytes", "reduced_bytes", "steps", "nsteps")

    def __init__(self, i):
        self.id = i
        self.let = None
        self.waiting = None           # the ends a blocked rank waits for
        self.left = 0
        self.finished = False
        self.end_time = 0.0
        self.error = None
        self.sent_messages = self.sent_bytes = self.recv_messages = self.recv_bytes = 0
        self.reduced_bytes = 0
        # one byte per distinct step of the whole world, not a set per rank: a set each grew as
        # N^2 entries in all (2(N-1) steps on each of N ranks of a ring: 2.7 GB at 4,096 ranks)
        self.steps = bytearray()
        self.nsteps = 0
        self.debt = 0.0               # local work done since the rank last took CPU time for it
        self.clock = None             # when its code began running on the host (``python``)
        self.ahead = None             # where its clock runs ahead of the world's: when its own work ends


class World:
    """The clock, the event queue, the ranks and the network of one simulation.

    A rank's own CPU work (gamma, ``call``, ``overhead`` o, a late start) touches nothing
    another rank sees, so where each rank has a core of its own the rank does not stop for
    it: its clock runs *ahead* of the world's (``Rank.ahead``), and it waits for the world's
    clock to catch up only when it next needs the world (a post, a wait, its end). It pushes
    the same event, in the same order, as stopping at once would, one switch fewer each time.
    """
    # a subclass whose hooks read ``now`` from a rank's code (``collectives.viz``) turns it off
    lazy_clock = True

    def __init__(self, fabric, real_data=True, schedule=False, stragglers=None, delays=None,
                 jitter=0.0, seed=0, progress=None, slow_links=None):
        self.fabric = fabric
        # schedule: each rank's posts, waits and CPU time, in order, for another simulator to
        # play (``benchmarks.sim_vs_simgrid``): ("post", [(kind, peer, tag, nbytes), ...]),
        # ("wait", [indices of the rank's posted ends]), ("busy", seconds)
        self.schedule = [[] for _ in range(fabric.n)] if schedule else None
        self.posted_ends = [0] * fabric.n
        self.n = fabric.n
        self.now = 0.0
        # the event queue: a heap of the distinct times events are due at, and per time its
        # events in the order they were pushed (the order of a (time, sequence) heap). Events
        # tie often (a ring's ranks all do the same at the same instants: 16 events per
        # instant on h100-cluster, N on a flat switch), and a list takes them in O(1)
        self.queue = []
        self.due = {}                 # time -> [(fn, args), ...]
        self.ranks = [Rank(i) for i in range(self.n)]
        check_noise(fabric.n, stragglers, delays, jitter, seed, slow_links)
        self.network = Network(self, slowed(fabric, slow_links))
        self.step_ids = {}            # step -> its index in every rank's ``steps`` bytes
        self.routes = {}              # src * n + dst -> what ``_route`` worked out for the pair
        self.link_bytes = dict.fromkeys(fabric.classes or (), 0)   # link class -> bytes put on it
        self.unmatched = {}           # (src, dst, step, nbytes) -> [ends], oldest first
        self.send_free = [0.0] * self.n   # when each rank's next message set-up can begin
        self.recv_free = [0.0] * self.n
        # where ranks share cores: when each core is next free, the rank it ran last, and the
        # core each rank ran on last (None: a core each)
        self.core_free = [0.0] * fabric.cores if fabric.cores else None
        if self.core_free is not None:
            self.core_last = [None] * fabric.cores
            self.core_of = [None] * self.n
        self.real_data = real_data
        self.watching = observers.watched()
        self.hub = None
        self.failed = None
        self.quiet = False            # inside aside(): writes not counted
        self.python = fabric.python   # simulated CPU seconds per host second of a rank's own code
        # per rank: how many times slower it is (None: no straggler, the paths below not taken)
        self.slow = None
        if stragglers and any(f != 1 for f in stragglers.values()):
            self.slow = [1.0] * self.n
            for rank, factor in stragglers.items():
                self.slow[rank] = float(factor)
        self.late = {r: float(d) for r, d in (delays or {}).items() if d > 0}
        self.noise = random.Random(seed) if jitter > 0 else None
        self.jitter = float(jitter)
        # progress(messages done, ranks finished, n), every PROGRESS_EVENTS events
        self.progress = progress
        # ranks on shared cores queue for them (``_cpu``): their work is not theirs alone
        self.lazy = self.lazy_clock and self.core_free is None
        # whether a subclass keeps what is posted (``_posted``): else no call per post
        self.watch_posts = type(self)._posted is not World._posted
        # a woken rank takes CPU (``wake``, a shared core) before it runs on
        self.wake_later = self.core_free is not None or bool(fabric.wake)
        # no message completes sooner than this after its later end was posted (``_match``'s
        # alpha, times the smaller factor of a straggler pair, plus jitter >= 0)
        self.least_latency = fabric.least_alpha() * (min(self.slow) if self.slow is not None else 1.0)
        # o and the intra-node o, read per post
        self.overhead, self.intra_overhead = fabric.overhead, fabric.intra_overhead
        # each rank's node, where a message's o depends on it (``Fabric.overhead_of``), looked
        # up per message: the node of a rank is worked out once
        self.node_of = None
        if fabric.intra_overhead is not None:
            self.node_of = [fabric.node_of(r) for r in range(self.n)]

    # -- the loop ------------------------------------------------------------------

    def at(self, t, fn, *args):
        """Call ``fn(*args)`` at ``t`` (never before ``now``), after every event already due then."""
        events = self.due.get(t)
        if events is None:
            self.due[t] = [(fn, args)]
            heapq.heappush(self.queue, t)
        else:
            events.append((fn, args))

    def run(self, body):
        """Run ``body(rank)`` on every rank to the end; return the finishing time.

        Raises :class:`SimulationError` if a rank raised, and
        :class:`collectives.sim.deadlock.Deadlock` if ranks wait for each other forever.
        """
        self.hub = greenlet.getcurrent()
        for rank in self.ranks:
            rank.let = greenlet.greenlet(self._main(rank, body), parent=self.hub)
            self.at(0.0, rank.let.switch)
        collecting = gc.isenabled()
        gc.disable()   # millions of short-lived records and no cycles among them: the collector only costs
        memory = MemoryWork(self) if self.fabric.memory else contextlib.nullcontext()
        # sizes only (meta): no tensor leaves the simulation, so none needs autograd's record
        # of the view it is, half of each view's memory (615 bytes, 292 without), and a ring
        # holds N views on each of its N ranks
        bare = torch.inference_mode() if not self.real_data else contextlib.nullcontext()
        try:
            with bare, memory:
                self._loop() if self.progress is None else self._loop_reporting()
        finally:
            if collecting:
                gc.enable()
        stuck = [r for r in self.ranks if not r.finished]
        if stuck:
            from .deadlock import Deadlock
            raise Deadlock(self, stuck)
        if self.unmatched:
            from .deadlock import Deadlock
            raise Deadlock(self, [])
        return max(r.end_time for r in self.ranks)

    def _failure(self):
        rank = self.failed
        return SimulationError(f"rank {rank.id} of {self.n} raised {type(rank.error).__name__}: {rank.error}")

    def _loop(self):
        queue, due, pop = self.queue, self.due, heapq.heappop
        while queue:
            t = self.now = queue[0]
            # a list's iterator also visits what is appended to it meanwhile: the events that
            # these events make due at this same instant
            for fn, args in due[t]:
                fn(*args)
                if self.failed is not None:
                    raise self._failure() from self.failed.error
            del due[t]
            pop(queue)

    def _loop_reporting(self):
        """:meth:`_loop`, calling ``progress`` every ``PROGRESS_EVENTS`` events and once when the
        queue is empty (a separate loop, so that a simulation without it pays nothing)."""
        queue, due, pop, report, ranks = self.queue, self.due, heapq.heappop, self.progress, self.ranks
        count = 0
        while queue:
            t = self.now = queue[0]
            for fn, args in due[t]:
                fn(*args)
                if self.failed is not None:
                    raise self._failure() from self.failed.error
                count += 1
                if count == PROGRESS_EVENTS:
                    count = 0
                    report(sum(r.sent_messages for r in ranks), sum(r.finished for r in ranks), self.n)
            del due[t]
            pop(queue)
        # once more at the end, so that the last word on a point is its whole count
        report(sum(r.sent_messages for r in ranks), sum(r.finished for r in ranks), self.n)

    def _main(self, rank, body):
        def main():
            try:
                self.resume(rank)
                body(rank.id)
                self.pause(rank)
                self.settle(rank.id)
                if rank.ahead is not None:
                    self._catch_up(rank)
            except BaseException as exc:  # handed to the loop, which stops the simulation
                if rank.ahead is not None and isinstance(exc, Exception):
                    self._catch_up(rank)  # it fails when its work ends, as it would have
                rank.error = exc
                self.failed = rank
            rank.finished = True
            rank.end_time = self.now
        return main

    def _catch_up(self, rank):
        """``rank``'s clock is ahead of the world's: it waits for the world's to get there."""
        t, rank.ahead = rank.ahead, None
        self.at(t, rank.let.switch)
        self._block(rank)

    def _block(self, rank):
        if self.python:
            self.pause(rank)
            self.hub.switch()
            self.resume(rank)
        else:
            self.hub.switch()

    def pause(self, rank):
        """Stop timing ``rank``'s own code (``python``): what it ran since :meth:`resume` is
        added to its debt, to be taken on a core before its next message."""
        if rank.clock is not None:
            rank.debt += (time.perf_counter() - rank.clock) * self.python
            rank.clock = None

    def resume(self, rank):
        if self.python:
            rank.clock = time.perf_counter()

    @contextlib.contextmanager
    def aside(self, rank):
        """Work ``rank``'s code does that the model charges otherwise or not at all (making a
        call's inputs; a reduction, which is gamma's): not timed, its writes not counted."""
        self.quiet = True
        self.pause(rank)
        try:
            yield
        finally:
            self.quiet = False
            self.resume(rank)

    # -- time a rank spends ----------------------------------------------------------

    def _cpu(self, t, seconds, rank):
        """When work of ``seconds`` that ``rank`` asks for at ``t`` ends, on a core of its own
        or a shared one. A rank keeps the core it ran on last if that core is free by ``t``
        (as a scheduler keeps a thread where its cache is); taking a core that last ran
        another rank costs ``switch`` more (a context switch, and a cache that is not its)."""
        free = self.core_free
        if free is None:
            return t + seconds
        own = self.core_of[rank]
        if own is not None and free[own] <= t:
            core = own
        else:
            core = min(range(len(free)), key=free.__getitem__)
        start = max(t, free[core])
        if self.core_last[core] not in (None, rank):
            start += self.fabric.switch
        free[core] = start + seconds
        self.core_last[core] = rank
        self.core_of[rank] = core
        return start + seconds

    def compute(self, rank, nbytes):
        """``rank`` reduces ``nbytes``: it is busy gamma * nbytes; the network is not."""
        self.ranks[rank].reduced_bytes += nbytes
        seconds = self.fabric.gamma_at(nbytes) * nbytes
        if self.slow is not None:     # busy's body: every reduce-scatter step comes here
            seconds *= self.slow[rank]
        self._busy(rank, seconds)

    def settle(self, rank, seconds=0.0):
        """``rank`` takes CPU time for its local work since it last did (``MemoryWork``) and
        ``seconds`` more."""
        r = self.ranks[rank]
        seconds, r.debt = seconds + r.debt, 0.0
        if seconds > 0:
            self.busy(rank, seconds)

    def busy(self, rank, seconds):
        """``rank`` works ``seconds`` on a core (queueing for a shared one); its messages in
        flight keep moving. A straggler works its factor times longer."""
        if self.slow is not None:
            seconds *= self.slow[rank]
        self._busy(rank, seconds)

    def arrive(self, rank):
        """``rank`` enters a call: a late one (``delays``) first works its delay on a core."""
        seconds = self.late.get(rank) if self.late else None
        if seconds:
            self._busy(rank, seconds)

    def _busy(self, rank, seconds):
        if seconds > 0 or self.core_free is not None:
            r = self.ranks[rank]
            if self.schedule is not None and seconds > 0:
                self.schedule[rank].append(("busy", seconds))
            if self.lazy:
                r.ahead = (self.now if r.ahead is None else r.ahead) + seconds
                return
            self.at(self._cpu(self.now, seconds, rank), r.let.switch)
            self._block(r)

    # -- messages ------------------------------------------------------------------

    def post(self, rank, step, sends, recvs, collective, algorithm):
        if not 0 <= step <= MAX_STEP:
            raise ValueError(f"{collective}/{algorithm}: step {step} does not fit in a tag (0..{MAX_STEP})")
        r = self.ranks[rank]
        if r.ahead is not None:
            self._catch_up(r)
        n = self.n
        messages = each_message(collective, algorithm, step, sends, recvs)
        now, unmatched = self.now, self.unmatched
        o, slow = self.overhead, 1.0
        if self.slow is not None:     # (x * 1.0 is x: without stragglers nothing to scale)
            slow = self.slow[rank]
            o *= slow
            r.debt *= slow
        # o per message where it depends on the peer (a node's own messages: intra_overhead)
        per_peer = None
        done = None
        if o or r.debt or self.intra_overhead is not None:
            # posting costs the rank CPU (the door's checks, the transport's set-up), per
            # message, one after another, after the local work it did since its last message:
            # the i-th message is out at ``done - (o_i + ... + o_m)``, the rank busy until ``done``
            if self.node_of is not None:
                # Fabric.overhead_of, with the nodes looked up (a bad peer is refused below)
                node, mine = self.node_of, self.node_of[rank]
                intra = self.intra_overhead * slow
                per_peer = [intra if peer.__class__ is int and 0 <= peer < n and node[peer] == mine else o
                            for _, _, peer, _ in messages]
            posting = sum(per_peer) if per_peer is not None else o * len(messages)
            seconds, r.debt = r.debt + posting, 0.0
            if self.core_free is not None:
                done = self._cpu(now, seconds, rank)
            else:                     # a core of its own (``_cpu``'s first line, without the call)
                done = now + seconds
            now = done - posting
        ends = []
        for i, (kind, tensor, peer, nbytes) in enumerate(messages):
            if peer.__class__ is not int or not 0 <= peer < n or peer == rank:
                raise ValueError(f"collectives.{collective}/{algorithm}: rank {rank} step {step}: "
                                 f"{kind} peer {peer!r} is not another rank of 0..{n - 1}")
            now += o if per_peer is None else per_peer[i]
            end = End(kind, rank, peer, step, nbytes, tensor, now, collective, algorithm)
            ends.append(end)
            key = (rank, peer, step, nbytes) if kind == "send" else (peer, rank, step, nbytes)
            waiting = unmatched.get(key)
            if waiting and waiting[0].kind != kind:
                other = waiting.pop(0)
                if not waiting:
                    del unmatched[key]
                self._match(other, end)
            elif waiting:
                waiting.append(end)
            else:
                unmatched[key] = [end]
        if self.schedule is not None:
            first = self.posted_ends[rank]
            for i, end in enumerate(ends):
                end.seq = first + i
            self.posted_ends[rank] = first + len(ends)
            self.schedule[rank].append(("post", [(e.kind, e.peer, e.step, e.nbytes) for e in ends]))
        if self.watch_posts:
            self._posted(rank, step, ends)
        if done is not None:
            # the rank is busy posting until ``done``; its first messages may start, and end,
            # before
            if self.lazy:
                r.ahead = done
            else:
                self.at(done, r.let.switch)
                self._block(r)
        return ends

    def _posted(self, rank, step, ends):
        """Called once a post's messages exist, before the rank spends its posting time (o per
        message), during which the first of them may already complete: what a watcher
        (:class:`collectives.viz.record.VizWorld`) keeps of them must be kept here."""

    def _route(self, src, dst):
        """(links, alpha, gap, the class of each link, the smallest capacity of the links: a
        flow's rate alone on them) of a message from ``src`` to ``dst``, kept: a ring asks for
        the same N pairs 2(N-1) times each. An all_to_all asks for N^2 pairs, once or twice
        each, so the table is emptied when it passes 8N: keeping those would cost memory and
        save nothing."""
        routes, fabric = self.routes, self.fabric
        if len(routes) > 8 * self.n:
            routes.clear()
        links, alpha = fabric.route(src, dst)
        capacity = self.network.capacity
        route = routes[src * self.n + dst] = (links, alpha, fabric.gap_of(src, dst, alpha),
                                              [fabric.classes[link] for link in links],
                                              min(capacity[link] for link in links))
        return route

    def _match(self, a, b):
        send, recv = (a, b) if a.kind == "send" else (b, a)
        src, dst = send.rank, recv.rank
        links, alpha, gap, classes, rate = self.routes.get(src * self.n + dst) or self._route(src, dst)
        if self.slow is not None:
            factor = max(self.slow[src], self.slow[dst])
            alpha, gap = alpha * factor, gap * factor
        if self.noise is not None:
            alpha += self.noise.expovariate(1.0 / self.jitter)
        counts, nbytes = self.link_bytes, send.nbytes
        for cls in classes:
            counts[cls] += nbytes
        send.links = links
        start = max(self.now, send.posted, recv.posted, self.send_free[src], self.recv_free[dst])
        self.send_free[src] = self.recv_free[dst] = start + gap
        self.at(start + alpha, self.network.start, links, nbytes, rate, self._complete, send, recv)

    def _saw(self, rank, i):
        """``rank`` took part in the step of index ``i`` (``step_ids``)."""
        seen = rank.steps
        if i >= len(seen):
            seen.extend(bytes(max(i + 1 - len(seen), len(seen))))
        if not seen[i]:
            seen[i] = 1
            rank.nsteps += 1

    def _complete(self, send, recv):
        if self.real_data and not recv.tensor.is_meta:
            recv.tensor.copy_(send.tensor)
        now = self.now
        s, r = self.ranks[send.rank], self.ranks[recv.rank]
        s.sent_messages += 1
        s.sent_bytes += send.nbytes
        r.recv_messages += 1
        r.recv_bytes += recv.nbytes
        i = self.step_ids.get(send.step)     # both ends have the same step: they matched on it
        if i is None:
            i = self.step_ids[send.step] = len(self.step_ids)
        if i >= len(s.steps) or not s.steps[i]:     # (most messages: a step the rank has seen)
            self._saw(s, i)
        if i >= len(r.steps) or not r.steps[i]:
            self._saw(r, i)
        if self.watching:
            classes, per = self.fabric.classes, {}
            for link in send.links:
                per[classes[link]] = per.get(classes[link], 0) + send.nbytes
            for end in (send, recv):
                src, dst = (end.rank, end.peer) if end.kind == "send" else (end.peer, end.rank)
                observers.report_message(Message(end.collective, end.algorithm, end.step, end.kind, src, dst,
                                                 end.nbytes, end.posted, now, per))
        send.done = recv.done = True
        send.tensor = recv.tensor = None
        # both ends are done before either rank runs on
        wake_s = s.left == 1 and send.watched
        wake_r = r.left == 1 and recv.watched
        if send.watched:
            s.left -= 1
        if recv.watched:
            r.left -= 1
        if wake_s:
            self._wake(s, now)
        if wake_r:
            self._wake(r, now)

    def _wake(self, rank, now):
        rank.waiting = None
        if self.wake_later:
            wake = self.fabric.wake if self.slow is None else self.fabric.wake * self.slow[rank.id]
            self.at(self._cpu(now, wake, rank.id), rank.let.switch)
        else:
            rank.let.switch()   # on at once: it runs until it waits again, then we are back here

    def wait(self, rank, ends):
        if self.schedule is not None and ends:
            self.schedule[rank].append(("wait", [e.seq for e in ends]))
        r = self.ranks[rank]
        t = r.ahead
        if t is None:
            if self._waits(r, ends):
                self._block(r)
            return
        r.ahead = None
        floor = self.least_latency
        # none of its ends can complete by the time its clock says (each comes at least a
        # latency after it was posted): it waits from now, and no event need look
        for e in ends:                # all(...) of a generator, without making one per wait
            if not e.done and e.posted + floor <= t:
                break
        else:
            if self._waits(r, ends):
                self._block(r)
                return
        # the event that would switch the rank in when its clock is reached looks at its ends
        # itself: a rank whose messages are still moving then is not switched in
        self.at(t, self._wait_at, r, ends)
        self._block(r)

    def _waits(self, r, ends):
        """``r`` waits for ``ends`` from now: whether it must (some are not done)."""
        left = []
        for e in ends:
            if not e.done:
                e.watched = True
                left.append(e)
        if not left:
            return False
        r.waiting, r.left = left, len(left)
        return True

    def _wait_at(self, r, ends):
        """The event of a rank that waits from when its clock is reached: it runs on if its
        ends are done by then, else the last of them wakes it (``_complete``)."""
        if not self._waits(r, ends):
            r.let.switch()


# events between two calls of a world's ``progress``: each sums over the ranks, well under 1%
# of the time the events take
PROGRESS_EVENTS = 1024


def check_noise(n, stragglers=None, delays=None, jitter=0.0, seed=0, slow_links=None):
    """Raise ValueError, before anything runs, unless ``stragglers`` maps ranks of 0..n-1 to
    factors > 0, ``delays`` maps such ranks to seconds >= 0, ``slow_links`` maps such ranks to
    finite factors >= 1, ``jitter`` is seconds >= 0 and ``seed`` a whole number
    (docs/errors.md)."""
    def number(x):
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

    for name, table, unit, ok, what in (
            ("stragglers", stragglers, "factor", lambda x: x > 0, "a slowdown factor > 0 (2: twice as slow)"),
            ("delays", delays, "seconds", lambda x: x >= 0, "a delay in seconds >= 0"),
            ("slow_links", slow_links, "factor", lambda x: x >= 1,
             "a bandwidth divisor >= 1 (4: a quarter of the bandwidth)")):
        if table is None:
            continue
        if not isinstance(table, dict):
            raise ValueError(f"{name} must be a dict {{rank: {unit}}}, got {table!r}")
        for rank, x in table.items():
            if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < n:
                raise ValueError(f"{name}: rank {rank!r} is not a rank of 0..{n - 1} ({n} ranks)")
            if not number(x) or not ok(x):
                raise ValueError(f"{name}: rank {rank}'s {x!r} is not {what}")
    if not number(jitter) or jitter < 0:
        raise ValueError(f"jitter must be seconds >= 0 (the mean of each message's extra latency), got {jitter!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be a whole number, got {seed!r}")


def slowed(fabric, slow_links=None):
    """``fabric``'s link capacities with each slow rank's links divided by its factor
    (``slow_links={rank: F}``): the first link of every route out of the rank and the last of
    every route into it, found by asking ``fabric.route`` for each peer (N routes per slow
    rank); a link of two slow ranks takes the larger factor. Without one (or with factors of 1
    only), ``fabric.capacity`` itself."""
    factor = {}
    for rank, f in (slow_links or {}).items():
        if f == 1:
            continue
        for peer in range(fabric.n):
            if peer != rank:
                for link in (fabric.route(rank, peer)[0][0], fabric.route(peer, rank)[0][-1]):
                    factor[link] = max(factor.get(link, 1.0), float(f))
    if not factor:
        return fabric.capacity
    capacity = list(fabric.capacity)
    for link, f in factor.items():
        capacity[link] = capacity[link] / f
    return capacity


class SimPending:
    """What :meth:`SimDoor.post` returns: ``wait()`` suspends the rank until every end completed."""
    __slots__ = ("world", "rank", "ends")

    def __init__(self, world, rank, ends):
        self.world, self.rank, self.ends = world, rank, ends

    def wait(self):
        self.world.wait(self.rank, self.ends)
        self.ends = []


class SimDoor:
    """The simulator's door (:class:`collectives.door.Door`) for one virtual rank."""
    nccl = False    # algorithms ask (barrier's token lives on the CPU)

    def __init__(self, world, rank, collective, algorithm):
        self.world, self.rank, self.size = world, rank, world.n
        self.collective, self.algorithm = collective, algorithm

    def post(self, step, sends=(), recvs=()):
        return SimPending(self.world, self.rank, self.world.post(self.rank, step, sends, recvs,
                                                                 self.collective, self.algorithm))

    def exchange(self, step, sends=(), recvs=()):
        world = self.world
        ends = world.post(self.rank, step, sends, recvs, self.collective, self.algorithm)
        if ends:
            world.wait(self.rank, ends)

    def send(self, tensor, peer, step):
        self.exchange(step, sends=((tensor, peer),))

    def recv(self, tensor, peer, step):
        self.exchange(step, recvs=((tensor, peer),))

    def sendrecv(self, send_tensor, dst, recv_tensor, src, step):
        # exchange's body: the ring's every step comes here
        world = self.world
        ends = world.post(self.rank, step, ((send_tensor, dst),), ((recv_tensor, src),),
                          self.collective, self.algorithm)
        if ends:
            world.wait(self.rank, ends)


class ChargedOp:
    """A :class:`~collectives.reduce_ops.Reduction` whose ``combine`` also charges the rank gamma
    per reduced byte (on ``meta`` tensors only the time: there is nothing to add)."""

    def __init__(self, red, world, rank):
        self.red, self.world, self.rank = red, world, rank
        self.op, self.name, self.fn, self.average = red.op, red.name, red.fn, red.average

    def combine(self, acc, x):
        world = self.world
        if not acc.is_meta:
            with world.aside(world.ranks[self.rank]):
                self.red.combine(acc, x)
        if world.ranks[self.rank].debt:
            world.settle(self.rank)
        world.compute(self.rank, acc.nbytes)
        return acc


class MemoryWork(TorchDispatchMode):
    """Charges each rank for the memory its own torch operations write, where the topology
    gives rates for it (``copy``: seconds per byte written; ``alloc``: more per byte of new
    memory, which the first write must fault in), as the machine spends them: an algorithm
    that concatenates, rotates or copies out pays for it, as it does for real.

    It sees every operation, on real and ``meta`` tensors alike (a meta tensor has sizes, so
    its bytes are known). Views are free; an operation that mutates its input writes its
    output's bytes; any other allocates its output and, unless it is an ``empty``, writes it.
    The time is added to the running rank's debt and taken (on a shared core, if cores are
    shared) before its next message or at its end: a dispatch handler must not switch to
    another rank. Reductions are ``gamma``'s (:class:`ChargedOp`), not counted again."""

    EMPTY = ("empty", "new_empty", "empty_like", "empty_strided", "new_empty_strided")

    def __init__(self, world):
        super().__init__()
        self.world = world
        self.ranks = {r.let: r for r in world.ranks}
        self.copy, self.alloc = world.fabric.copy_at, world.fabric.alloc_at

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        rank = self.ranks.get(greenlet.getcurrent())
        timed = rank is not None and rank.clock is not None
        if timed:                         # this handler is the simulator's work, not the rank's
            self.world.pause(rank)
        out = func(*args, **(kwargs or {}))
        if not (func.is_view or self.world.quiet or rank is None):   # no rank: the loop (data landing)
            rank.debt += self.charge(func, out)
        if timed:
            self.world.resume(rank)
        return out

    def charge(self, func, out):
        """Seconds of memory work for ``func``, which wrote ``out``."""
        nbytes = sum(t.nbytes for t in (out if isinstance(out, (tuple, list)) else (out,))
                     if isinstance(t, torch.Tensor))
        if func._schema.is_mutable:
            return self.copy(nbytes) * nbytes
        fresh = func.__name__.split(".")[0] in self.EMPTY
        return self.alloc(nbytes) * nbytes + (0.0 if fresh else self.copy(nbytes) * nbytes)

