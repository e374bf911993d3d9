"""The one door to the network.

Every byte that a collective in this package moves goes through :class:`Comm`.
No other module calls a transport's ``send``/``recv``. Keeping the door narrow
buys five things, each of which lives here and nowhere else:

* **group ranks**: algorithms speak in ranks 0..N-1 of their group; the door
  hands them to the group's transport (which takes group ranks) and names global
  ranks in traces and errors.
* **tags that identify the call**: every message's tag holds a hash of the call
  (its number on this group, collective, algorithm, op, dtype, shape, root) and
  of the message's size, next to the algorithm's step. A receive only matches a
  send with the same tag, so ranks that called different collectives, or the same
  one with another size or algorithm, or that skipped a call, never pair: they
  wait, and the timeout explains what each rank called (``desync``).
* **timeouts**: every wait is bounded by ``COLLECTIVES_TIMEOUT`` seconds
  (default 300). On expiry the error names the collective, the algorithm, the
  step and the peer, instead of leaving the program hanging.
* **counting**: bytes and messages each rank sends and receives, and the steps
  they happen in, go to every active :func:`count_traffic` counter. The tests
  use them to prove each algorithm moves exactly the traffic its card claims.
* **tracing**: :func:`trace` records every message (collective, algorithm,
  step, src, dst, bytes, start and end time) and every call, for the timeline
  pictures and Perfetto, and ``COLLECTIVES_VERBOSE=1`` prints each message.

A send and its matching receive are always *posted together* and then waited
on together (``Comm.exchange``). Issued one after the other, a blocking send on
both sides of a pair deadlocks on NCCL and on any transport without buffering.

**Which transport.** Ranks of a gloo group that share a host exchange their messages
through shared memory (:mod:`collectives.shm`), the others over gloo: the group's
agreement (:mod:`collectives.tuning.agreed`) says, once, which ranks share a host, the
first collective call after it sets their mailboxes up (:func:`shm_transport`), and each
message then goes the way of its peer. A point-to-point message of the program's own
(:mod:`collectives.p2p_api`) takes them too, once both of its ends say they have them
(:func:`p2p_transport`). Nothing above the door sees the difference.
``COLLECTIVES_TRANSPORT`` chooses (``auto`` by default).

The first message on a gloo group also takes the wake-up preemption away from
gloo's socket threads (:func:`calm_transport_threads`): without it, a rank that
shares a CPU with its peer loses milliseconds per message (docs/benchmarks.md,
"The mid-size cliff").
"""
import datetime
import os
import re
import sys
import threading
import time
import weakref
import zlib

import torch

from . import flight_recorder, observers, settings, shm
from .door import Door, each_message
from .errors import CollectiveError, CollectiveTimeout
from .group import group_info
from .observers import Message

# A tag is a 31-bit int: the call's hash above STEP_BITS, the algorithm's step below.
STEP_BITS = 14
MAX_STEP = (1 << STEP_BITS) - 1
_CALL_MASK = (1 << (31 - STEP_BITS)) - 1


def call_hash(text):
    """The part of every tag that identifies a call: a hash of its description."""
    return zlib.crc32(text.encode()) & _CALL_MASK


# Transports whose socket threads calm_transport_threads has seen, and those threads.
_calmed = weakref.WeakSet()
_calmed_ids = set()     # transports that cannot be weakly referenced, by id
_calmed_tids = set()
_calm_lock = threading.Lock()
GLOO_IO_THREAD = "gloo_tcp_loop"


def calm_transport_threads(transport):
    """Run gloo's socket threads as ``SCHED_BATCH``: they no longer preempt the thread they wake.

    Why: every ``send``/``recv`` a rank posts takes its gloo pair's lock and
    writes a notice to the socket while holding it. The write wakes the peer's
    socket thread; on a CPU both ranks share, the woken thread preempts the
    writer, lock and all, and answers, which wakes this rank's socket thread.
    That one finds the lock taken and retries at once (gloo's loop polls with
    ``try_lock`` on a level-triggered epoll), spinning on the CPU the lock's
    holder is waiting for until the scheduler's next tick (4 ms here). A
    ``SCHED_BATCH`` thread is woken as usual but never preempts the running
    thread on waking (sched(7)), so the writer finishes its post and releases
    the lock first. Measured on the 2-core machine: a 128 KiB exchange twice in
    a row stalled in 28 of 40 calls (median 3.8 ms) before, 1 of 40 (0.19 ms)
    after, with raw ``torch.distributed`` isend/irecv, no collectives code.

    Linux only; a no-op elsewhere, for NCCL groups, with ``COLLECTIVES_GLOO_BATCH=0``,
    and for threads already seen. gloo starts its socket threads when a group is
    made, so checking once per transport finds each group's threads.
    """
    try:
        if transport in _calmed:
            return
        _calmed.add(transport)
    except TypeError:   # not weakly referenceable
        if id(transport) in _calmed_ids:
            return
        _calmed_ids.add(id(transport))
    with _calm_lock:
        if not settings.gloo_batch() or not hasattr(os, "SCHED_BATCH") or not os.path.isdir("/proc/self/task"):
            return
        for tid in os.listdir("/proc/self/task"):
            tid = int(tid)
            if tid in _calmed_tids:
                continue
            try:
                with open(f"/proc/self/task/{tid}/comm") as f:
                    name = f.read().strip()
                if name.startswith(GLOO_IO_THREAD) and os.sched_getscheduler(tid) == os.SCHED_OTHER:
                    os.sched_setscheduler(tid, os.SCHED_BATCH, os.sched_param(0))
                    _calmed_tids.add(tid)
            except OSError:
                continue    # the thread exited since the listing, or the system forbids it


def _gloo_backend(transport):
    """The gloo backend behind a ProcessGroup, whose ``send``/``recv`` skip torch's dispatcher
    (5-9 us of CPU less per exchange measured on the 2-core machine); the transport itself
    where it is one already (the torch backend's inner group) or has no CPU backend.

    Resolved once per transport (asking torch costs a dictionary walk and a device object per
    call) and kept while the transport lives."""
    try:
        found = _resolved.get(transport)
    except TypeError:   # not weakly referenceable: nothing to keep it by
        return _resolve(transport)
    if found is None:
        found = _resolved[transport] = _resolve(transport)
    return found


def _resolve(transport):
    get = getattr(transport, "_get_backend", None)
    if get is None:
        return transport
    try:
        return get(_CPU)
    except Exception:   # a private torch method: if a version lacks it, the group does the same
        return transport


_resolved = weakref.WeakKeyDictionary()
_CPU = torch.device("cpu")


# group (GroupInfo.transport) -> (shm transport or None, group ranks it reaches): the agreement of each
# group, made once. Keyed weakly where torch allows it, so a destroyed group takes its
# mailboxes with it.
_shm_of = weakref.WeakKeyDictionary()
_shm_of_ids = {}
_shm_lock = threading.Lock()
# per group (as _shm_of: its transport), per engine lane and dtype: the largest receive
# buffer a call of that lane asked for (Comm.scratch)
_scratch_of = weakref.WeakKeyDictionary()
_scratch_of_ids = {}
SCRATCH_MIN = 1 << 20       # bytes; smaller buffers come from the allocator's warm memory
SETUP_BYTES = 1024                      # one rank's part of a setup all-gather
SETUP_TAG = call_hash("collectives.shm setup") << STEP_BITS


def shm_transport(comm):
    """The group's shared-memory transport and the group ranks it reaches, set up once.

    Who shares this rank's host, and their pids, come from the group's agreement
    (``comm.pids``, :mod:`collectives.tuning.agreed`: exchanged once per group, before its
    first call), so the setup itself spends only two all-gathers (over gloo,
    :meth:`Comm._setup_allgather`) on making and opening the mailboxes. Called at the first
    message of a collective call, which every rank of the group makes, so those pair on
    every rank; a rank that never comes is reported as for any message of the call.
    Returns ``(None, ())`` with ``COLLECTIVES_TRANSPORT=gloo``, where no peer shares the
    host, and on a door without the agreement (the agreement's own messages, or a door made
    by hand) on a group not set up yet: every rank of a group reaches the agreement and the
    setup at the same call, so all of them take gloo there alike. A door made by hand on a
    group that a call has set up uses its mailboxes.
    """
    mode = settings.transport()
    if mode == "gloo":
        return None, ()
    # keyed by the group as the caller holds it: the gloo backend behind it may be a new
    # Python wrapper at every call (torch 2.11), which would set up again each time
    transport = comm.info.transport
    found = _kept(_shm_of, _shm_of_ids, transport)
    if found is not None or comm.pids is None:
        return found or (None, ())
    # no lock held across the setup: two groups' lanes may set up at once, in any order
    phases = iter(range(2))
    found = shm.connect(comm.rank, comm.pids, lambda data: comm._setup_allgather(data, next(phases)),
                        required=(mode == "shm"), direct_min=settings.shm_direct_min())
    with _shm_lock:
        return _keep(_shm_of, _shm_of_ids, transport, found)


# group (as _shm_of) -> {point-to-point lane: True once on shared memory, else the
# message number from which its two ends compare next}
_p2p_of = weakref.WeakKeyDictionary()
_p2p_of_ids = {}


def p2p_transport(comm, todo):
    """The way of one point-to-point message: the group's shared memory or gloo (``(None, ())``).

    Only a collective sets a group's mailboxes up (it has every rank of the group at the door),
    and the two ends of a message may see that at different times: a receive posted on its own
    lane can run beside the collective that sets them up, and its sender may send only after
    that collective has ended. So the two ends of a lane (one direction and tag, numbered alike
    on both) compare: at its first message with bytes, each tells the other in one byte over
    gloo whether it reaches the other through the group's mailboxes, and if both do, that
    message and every later one of the lane go through them; if not, they compare again at the
    first message with bytes from the 2nd on, then the 4th, 8th, ...: a lane that never gets
    there (another host, ``COLLECTIVES_TRANSPORT=gloo``, a group that never runs a collective)
    pays for ``log2`` of its messages one small exchange each, a lane that gets there moves
    within twice the messages it had sent. Both ends see the same messages with bytes (the
    sizes must match), so they compare at the same ones. ``COLLECTIVES_TRANSPORT=gloo`` (like
    every setting, the same on every rank) sends a message over gloo without comparing, even
    on a lane that had moved.
    """
    if settings.transport() == "gloo" or comm.seq is None or len(comm.involved) != 2:
        # the setting is read at every message, as a collective reads it; a door made by hand
        # has no lane numbering both ends alike, so nothing to compare at
        return None, ()
    transport, lane = comm.info.transport, comm.lane
    with _shm_lock:
        lanes = _kept(_p2p_of, _p2p_of_ids, transport)
        if lanes is None:
            lanes = _keep(_p2p_of, _p2p_of_ids, transport, {})
        due = lanes.get(lane, 0)
    found = _kept(_shm_of, _shm_of_ids, transport)
    if due is True:
        return found
    if comm.seq < due:
        return None, ()
    peer = next(p for p in comm.involved if p != comm.rank)
    ready = found is not None and peer in found[1]
    _, _, _, nbytes, _ = todo[0]
    both = comm._compare(peer, ready, nbytes) and ready
    with _shm_lock:
        lanes[lane] = True if both else 2 * comm.seq + 1
    return found if both else (None, ())


def transport_in_use(group=None):
    """``"shm"`` if ``group``'s messages go through shared memory (to at least one peer, set
    up by a call on it), else ``"gloo"``: what ``COLLECTIVES_TRANSPORT=auto`` came to here."""
    from .group import group_info
    found = _kept(_shm_of, _shm_of_ids, group_info(group, "transport_in_use").transport)
    return "shm" if found and found[0] is not None and found[1] else "gloo"


def _kept(table, ids, transport):
    """What ``table`` keeps for a group's ``transport``, or None: weakly keyed by it where it
    can be, else (a transport that takes no weak reference) in ``ids`` by its id, beside it."""
    try:
        return table.get(transport)
    except TypeError:
        return ids.get(id(transport), (None, None))[1]


def _keep(table, ids, transport, value):
    """Keep ``value`` for ``transport`` (as :func:`_kept` finds it); returns it."""
    try:
        table[transport] = value
    except TypeError:
        ids[id(transport)] = (transport, value)
    return value


class Pending:
    """Messages posted by :meth:`Comm.post` and not yet waited for."""

    report = True     # False for the transport's own setup messages: not the algorithm's traffic

    def __init__(self, comm, step, entries, start):
        self.comm, self.step, self.entries, self.start = comm, step, entries, start

    def wait(self):
        """Wait for every message; all of them share one deadline of ``COLLECTIVES_TIMEOUT``."""
        comm = self.comm
        deadline = time.monotonic() + comm.timeout
        record = comm.record
        for work, kind, peer, nbytes in self.entries:
            if record is not None:   # what this call waits on now, for a flight-recorder dump
                flight_recorder.waiting(record, self.step, kind, comm.ranks[peer], nbytes)
            try:
                left = max(deadline - time.monotonic(), 0.001)
                if comm.nccl:
                    # NCCL's wait() only orders streams; poll so the CPU side is bounded too.
                    while not work.is_completed():
                        if time.monotonic() > deadline:
                            raise TimeoutError("no completion")
                        time.sleep(0)
                    work.wait()
                elif comm.shm is not None and not isinstance(work, shm.Work) and comm.shm.in_flight():
                    # gloo's wait, while this rank's shared-memory messages keep moving
                    comm.shm.wait_elsewhere(work, left)
                else:
                    work.wait(timeout=datetime.timedelta(seconds=left))
            except Exception as exc:
                raise comm._failure(comm._message(self.step, kind, peer, nbytes, self.start), peer, exc) from exc
            if self.report and (observers.watched() or comm.verbose):
                comm._report(comm._message(self.step, kind, peer, nbytes, self.start, time.time()))
        self.entries = []


def hosts_of(ranks):
    """The host of each of ``ranks`` (global ranks), or None when unknown.

    In a lab (``--lab``), ``COLLECTIVES_LAB_LAYOUT`` names every rank's host, whatever the
    placement (interleaved too); otherwise ``LOCAL_WORLD_SIZE`` says how many consecutive
    ranks share a host, as torchrun places them.
    """
    layout = settings.lab_layout()
    if layout is not None:
        return tuple(layout[g] for g in ranks)
    local = settings.local_world_size()
    return None if local is None else tuple(g // local for g in ranks)


class Comm(Door):
    """The real door (:class:`collectives.door.Door`): messages between processes for one
    collective call on one group.

    Algorithms get a ``Comm`` and use ``comm.rank`` and ``comm.size`` (ranks of
    the group, 0..N-1) and the messaging methods below, whose ``peer``
    arguments are group ranks and whose ``step`` is a small int (< 2**14) that
    both sides of a message agree on. Tensors must be contiguous; empty tensors
    are not sent at all (both sides know the sizes, so both skip them).

    Args:
        group: None (the world), a torch ``ProcessGroup``, or a
            :class:`~collectives.group.GroupInfo`.
        collective, algorithm: names, for tags, traces and errors.
        seq: the call's number on this group (the engine counts); None outside a call.
        description: what every rank of a correct program agrees the call is
            (``all_reduce(op=SUM, shape=[4], dtype=float32, algorithm=ring)``).
        timeout: seconds each wait may take (default: ``COLLECTIVES_TIMEOUT``).
        involved: the group ranks the call involves (default: all); a point-to-point
            message involves two, and only they are asked when it times out.
        lane: the engine lane that numbers the call (default: the group's).
        tag_text: what the tags identify, where it is not the description (the group's
            agreement pairs whatever call it precedes).
    """

    def __init__(self, group, collective, algorithm, seq=None, description=None, timeout=None,
                 involved=None, lane=None, tag_text=None):
        info = group_info(group, f"collectives.{collective}")
        self.info = info
        self.group = info.transport
        self.ranks = info.ranks
        self.rank = info.rank
        self.size = info.size
        self.collective = collective
        self.algorithm = algorithm
        self.seq = seq
        self.involved = tuple(range(info.size)) if involved is None else tuple(involved)
        self.lane = lane or info.key
        self.description = description or f"{collective}(algorithm={algorithm})"
        # read once per call, not per message
        self.timeout = settings.timeout_seconds() if timeout is None else timeout
        self.verbose = settings.verbose()
        self.backend = info.backend
        self.nccl = "nccl" in info.backend
        # which way the messages go: resolved at the first post, not here (a collective sets
        # the group's mailboxes up there; a point-to-point message compares with its peer)
        self.shm, self.shm_peers = None, ()
        self._shm_pending = not self.nccl
        if not self.nccl:
            calm_transport_threads(self.group)
            self.group = _gloo_backend(self.group)
        # what the tags hash: the description, unless the call says what must pair instead
        self._tag_text = f"{seq}|{tag_text or self.description}"
        self.call_tag = call_hash(self._tag_text)
        self.record = None    # the call's flight-recorder entry (collectives.flight_recorder)
        # per group rank, the pid of a peer on this host (the group's agreement), else None:
        # a transport that can watch a peer's process (shared memory) reads it
        self.pids = None

    @property
    def hosts(self):
        """The host of each group rank (a tuple of host numbers), or None where nothing says.

        From ``LOCAL_WORLD_SIZE`` (torchrun's L ranks per host, global ranks placed
        host by host): global rank g sits on host g // L. Every rank of a group
        computes the same tuple from the same variable, so a topology-aware
        algorithm (``all_reduce_hierarchical``) agrees on its layout without a
        message. Read only when an algorithm asks (the others never pay for it).
        """
        return hosts_of(self.ranks)

    def tag(self, step, nbytes):
        """The message's tag: which call, how many bytes, which step.

        The size is in the tag because gloo lets a 16-byte send fill the first
        16 bytes of a 32-byte receive without a word: with it, a size mismatch
        waits (and is explained) instead of returning half-written data.
        """
        if not 0 <= step <= MAX_STEP:
            raise ValueError(f"{self.collective}/{self.algorithm}: step {step} does not fit in a tag "
                             f"(0..{MAX_STEP})")
        return (((self.call_tag ^ (nbytes * 0x9E3779B1 >> 7)) & _CALL_MASK) << STEP_BITS) | step

    def post(self, step, sends=(), recvs=(), tagged=True):
        """Post receives ``[(tensor, peer)]`` and sends ``[(tensor, peer)]`` back to back.

        Everything is checked before the first message is posted, so a bad
        tensor raises here with nothing half-sent. ``tagged=False`` tags by step
        only: for the desync check, whose messages must pair even when the calls
        around them differ.
        """
        todo = []
        for kind, tensor, peer, nbytes in each_message(self.collective, self.algorithm, step, sends, recvs):
            if tensor.is_cuda and not self.nccl:
                # gloo would write() from a device pointer and abort the whole process
                raise ValueError(f"collectives.{self.collective}: a message holds a CUDA tensor but the "
                                 f"{self.backend} group sends host memory only: stage it to the CPU first")
            todo.append((kind, tensor, peer, nbytes, self.tag(step, nbytes) if tagged else step))
        start = time.time()
        if self._shm_pending and todo:
            self._shm_pending = False
            self._step_now = step
            self.shm, self.shm_peers = p2p_transport(self, todo) if self.collective == "send_recv" \
                else shm_transport(self)
        if self.nccl:
            works = self._post_nccl(todo)
        else:
            works = []
            for kind, tensor, peer, nbytes, tag in todo:
                try:
                    way = self.shm if peer in self.shm_peers else self.group
                    post = way.send if kind == "send" else way.recv
                    works.append(post([tensor], peer, tag))
                except Exception as exc:
                    raise self._failure(self._message(step, kind, peer, nbytes, start), peer, exc) from exc
        return Pending(self, step, [(work, kind, peer, nbytes)
                                    for work, (kind, _, peer, nbytes, _) in zip(works, todo)], start)

    def _setup_allgather(self, data, phase):
        """Every rank's ``data`` (bytes) in group-rank order, over gloo: the shared-memory
        setup's messages. A peer that does not answer is reported as for the call's
        message at the step the setup began in."""
        if len(data) > SETUP_BYTES - 4:
            raise ValueError(f"shared-memory setup: {len(data)} bytes do not fit in one message")
        mine = torch.zeros(SETUP_BYTES, dtype=torch.uint8)
        mine[:4] = torch.tensor([len(data)], dtype=torch.int32).view(torch.uint8)
        mine[4:4 + len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        theirs = {p: torch.empty(SETUP_BYTES, dtype=torch.uint8) for p in range(self.size) if p != self.rank}
        self._over_gloo(SETUP_TAG | phase, [("recv", theirs[p], p, SETUP_BYTES) for p in theirs] +
                        [("send", mine, p, SETUP_BYTES) for p in theirs])
        out = []
        for p in range(self.size):
            t = mine if p == self.rank else theirs[p]
            n = int(t[:4].view(torch.int32).item())
            out.append(bytes(t[4:4 + n].tolist()))
        return out

    def _compare(self, peer, ready, nbytes):
        """Tell ``peer``, the other end of this point-to-point message, whether this end is
        ``ready`` for shared memory and learn whether it is: one byte each way, over gloo, under
        a tag of this message's own (:func:`p2p_transport`). A peer that never comes is reported
        as for the message (``nbytes``) itself."""
        kind = "send" if self.rank == self.involved[0] else "recv"
        mine = torch.tensor([int(ready)], dtype=torch.uint8)
        theirs = torch.zeros(1, dtype=torch.uint8)
        tag = (call_hash(self._tag_text + "|shm compare") << STEP_BITS) | self._step_now
        self._over_gloo(tag, [("recv", theirs, peer, nbytes), ("send", mine, peer, nbytes)], kind)
        return bool(theirs.item())

    def _over_gloo(self, tag, posts, kind=None):
        """Post ``[(kind, tensor, peer, nbytes)]`` on gloo under ``tag`` and wait for all: the
        transport's own messages (the shared-memory setup, a point-to-point comparison), not
        the algorithm's traffic, so not counted or traced. A failure is reported as a message
        of ``nbytes`` at the step the call is at, of ``kind`` where given (the message the
        exchange stands for), else of its own kind."""
        start, entries = time.time(), []
        for own_kind, tensor, peer, nbytes in posts:
            shown = kind or own_kind
            try:
                post = self.group.recv if own_kind == "recv" else self.group.send
                entries.append((post([tensor], peer, tag), shown, peer, nbytes))
            except Exception as exc:
                raise self._failure(self._message(self._step_now, shown, peer, nbytes, start), peer, exc) from exc
        pending = Pending(self, self._step_now, entries, start)
        pending.report = False
        pending.wait()

    def _post_nccl(self, todo):
        """NCCL pairs messages by order, not tag, and wants them batched (``batch_isend_irecv``)."""
        import torch.distributed as dist
        group = self.group
        p2p_group = None if group is dist.group.WORLD else group
        ops = [dist.P2POp(dist.isend if kind == "send" else dist.irecv, tensor, self.ranks[peer], p2p_group)
               for kind, tensor, peer, _, _ in todo]
        return dist.batch_isend_irecv(ops) if ops else []

    def _message(self, step, kind, peer, nbytes, start, end=float("nan")):
        me, other = self.ranks[self.rank], self.ranks[peer]
        src, dst = (me, other) if kind == "send" else (other, me)
        return Message(self.collective, self.algorithm, step, kind, src, dst, nbytes, start, end)

    def _report(self, msg):
        observers.report_message(msg)
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

    def scratch(self, like, numel):
        """A receive buffer of ``numel`` elements of ``like``'s dtype, kept by the group.

        An algorithm's inbox for one call (``algorithms._util.inbox``). Its memory outlives
        the call: the next call of this group's lane reuses it instead of new pages, which
        the kernel would fault in one by one (``tensor.new_empty`` of 32 MiB: 8,192 faults,
        30-40 ms on the 2-core machine, every call). One buffer per lane and dtype, grown
        to the largest asked for; calls of one lane run one at a time, so no two calls
        share it. Below ``SCRATCH_MIN`` and off the CPU (CUDA's caching allocator already
        reuses) it is a new tensor.
        """
        if like.device.type != "cpu" or numel * like.element_size() < SCRATCH_MIN:
            return like.new_empty(numel)
        transport = self.info.transport
        with _shm_lock:      # lanes of several groups run on their own threads
            kept = _kept(_scratch_of, _scratch_of_ids, transport)
            if kept is None:
                kept = _keep(_scratch_of, _scratch_of_ids, transport, {})
            key = (self.lane, like.dtype)
            buf = kept.get(key)
            if buf is None or buf.numel() < numel:
                buf = kept[key] = like.new_empty(numel)
        return buf[:numel]

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
                f"COLLECTIVES_TIMEOUT sets the limit.", self.ranks[peer], self)
        return CollectiveError(f"{where}failed {what} {msg.nbytes} bytes "
                               f"{'to' if msg.kind == 'send' else 'from'} {peer_text}: "
                               f"{_explain(text, peer_text)}", self.ranks[peer], self)


def _explain(text, peer_text):
    """Say what a transport error means for the user; keep the transport's words after it."""
    brief = re.sub(r"^\[[^\]]*\]\s*", "", text).split(". ")[0]
    if "Application timeout caused pair closure" in text:
        return (f"the connection to {peer_text} was closed by an earlier timeout on this group, "
                f"which cannot be used again; create a new group ({brief})")
    if "exited while this rank waited" in text or "exited while this rank read" in text:
        # the shared-memory transport's notice (a pidfd, or a message it could no longer read
        # from the dead sender's memory): the same news as a closed socket
        return (f"{peer_text} closed the connection: its process exited while this rank waited "
                f"for it, killed or failed (shared memory)")
    if any(s in text for s in ("Connection closed by peer", "Connection reset", "Broken pipe")):
        return (f"{peer_text} closed the connection: it exited, or gave up on this group after "
                f"its own error or timeout ({brief})")
    return brief
