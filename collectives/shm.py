"""The shared-memory transport: messages between ranks on one host without the network stack.

**What it replaces.** On gloo, a message between two processes on one machine goes
through TCP on the loopback interface: the sender's ``write`` copies the bytes into a
kernel socket buffer, the kernel runs them through TCP and IP, wakes gloo's socket
thread on the other side, and its ``read`` copies them out again; every 64 KiB or so
is one more pair of system calls. This transport keeps the two copies and drops the
rest: the sender copies into a mailbox both processes have mapped, the receiver copies
out of it, and a one-byte doorbell wakes whoever waits. NCCL does the same for GPUs of
one node (its SHM transport, beside P2P and NET) for the same reason.

**Semantics.** Under the door (:class:`collectives.p2p_communications.Comm`), as a
drop-in for gloo's ``send([tensor], peer, tag)`` / ``recv([tensor], peer, tag)``: both
return a work whose ``wait(timeout)`` blocks until the message is on its way or in: a send
once its last byte is in the mailbox (the sender's tensor may then be reused), a receive
once its bytes are in our tensor. That is MPI's *eager* protocol for messages a buffer
holds, and it differs from gloo's, whose send waits for the receiver to take it: a
broadcast's root here goes on to its next call without waiting for a wake-up in each
child and one back (at 4 KiB on 4 ranks that halved the root's time per call, which the
children's receives then decide). A rank that never receives is noticed by the ranks that
wait for it, as on gloo, and by its sender only when the mailbox is full; a message read
straight from the sender's memory (below) completes only when its receiver has it.
Messages of one ordered pair arrive in the order they were sent; a receive takes the
first waiting message with its tag (gloo matches by tag too, not by order). A message
whose tag no posted receive has waits in the mailbox, unless a posted receive waits for a
message behind it: then it is moved aside into a staging buffer (one more copy of its
bytes) and handed to its receive when that is posted. A desynchronised program waits and
is explained by the door's timeout.

**Steps** (one group, set up once when its first collective runs, after the group's
agreement; every rank of the group takes part, over the gloo group, in two small
all-gathers):

1. The group's agreement (:mod:`collectives.tuning.agreed`, made once per group before
   its first call) already says who shares a host: every rank's *host identity*
   (hostname, the inode of its network namespace, the device and inode of ``/dev/shm``:
   two lab hosts on one machine differ in the second) and, for the ranks of this host,
   their pids. Pairs on different hosts keep gloo. No message is spent on it here.
2. Every rank creates its *inbox*: one file in ``/dev/shm`` holding one mailbox per
   peer on its host (a ring of ``capacity`` bytes with a ``head`` the sender advances
   and a ``tail`` the receiver advances), with its space reserved by ``posix_fallocate``
   (so a full ``/dev/shm`` is an error here, never a SIGBUS later), and a FIFO, its
   doorbell. It says whether that worked (first all-gather). If any rank of the host
   failed, the whole host keeps gloo (``auto``: one warning line) or every rank raises
   (``shm``).
3. Every rank maps its peers' inboxes and opens their doorbells and a pidfd for each
   peer, and says so; after that second all-gather every file has been opened by
   everyone who needs it, and its owner unlinks it. Nothing is left in ``/dev/shm``
   from then on, whatever happens to the processes: the memory goes when the last one
   unmaps it. A job killed inside the few milliseconds between steps 2 and 3 leaves its
   files, named with the creator's pid; the next job on the host removes the files of
   pids that no longer run.

Moving a message of S bytes from rank a to rank b (a's mailbox in b's inbox):

1. a waits for 64 bytes of room and writes a record header (tag, S) at ``head``;
2. a copies as much of the payload as the ring has room for, advances ``head``, and
   rings b's doorbell (writes one byte to b's FIFO);
3. b, woken (or finding it while polling), reads the header, matches it to its first
   posted receive from a with that tag, copies what has arrived into the tensor,
   advances ``tail``, and rings a's doorbell if a sleeps waiting for room (a raised a
   flag in the mailbox before it slept; a receiver rings no sender that does not wait);
4. steps 2-3 repeat until all S bytes are through: a message larger than the mailbox
   streams through it in pieces, the sender filling while the receiver drains;
5. a's send completes when its last piece is in the mailbox (the rest is b's to read).

Where every rank of the host has a core of its own (N=2 on 2 cores; not N=4 there), a
copies in pieces of ``PIECE`` (128 KiB) and publishes each (advances ``head``) as it goes,
ringing b after the first: b copies piece k out while a copies piece k+1 in, on the other
core, and a waiter that got bytes looks again for ``SPIN`` before it sleeps, since more are
coming. The two copies then take about the time of one: one way at N=2, 75 us instead of 107
for 256 KiB, 197 instead of 327 for 1 MiB, 2.4 ms instead of 3.9 for 16 MiB (where it also
beats reading the sender's memory; docs/benchmarks.md, "Two copies at once"). NCCL's SHM transport
moves its FIFO in steps for the same reason. Where ranks share cores it would only make
them take turns, so there a message is published whole.

Where the host's ranks outnumber its cores, a message of ``DIRECT_MIN`` (4 MiB) or more
skips the ring (``COLLECTIVES_SHM_DIRECT_MIN``, ``auto``): a writes only its record,
with the address of its tensor, and b copies the bytes straight out of a's memory into
its tensor (``process_vm_readv``: the kernel copies between the two address spaces, once)
before it advances ``tail`` past the record; a's send completes then, as above, and a
holds its tensor until it does. That is NCCL's second transport for ranks of one node
(P2P beside SHM: the receiver reads the sender's buffer) and MPI's single-copy mode
(CMA). Setup checks that every rank of the host may read every other (each reads a word
its peers published; under Yama's ``ptrace_scope`` 1 each rank first allows it, as Open
MPI does); where one may not (a container's seccomp, ``ptrace_scope`` 2), the whole host
keeps the two-copy ring, since a sender cannot know what its receiver may do.

A rank that waits looks again for ``SPIN`` (30 us, yielding its core between looks), then
sleeps in ``poll`` on its doorbell and on the pidfds of the peers it
waits for: it never spins, so four ranks on two cores leave the cores to the ranks with
work, and a peer that dies (SIGKILL included) wakes it at once with an error naming the
peer instead of a hang.

**Worked example**, ring all_reduce on 4 ranks of one host, 16 MiB of float32, mailboxes
of 2 MiB: each of the 6 steps moves a 4 MiB chunk from rank r to r+1. On 2 cores (ranks
outnumber cores) a chunk of 4 MiB is read directly: r writes a 64-byte record into the
r -> r+1 mailbox and rings; r+1 copies the chunk out of r's tensor once (then reduces it,
in the first 3 steps) and rings back: 2 doorbell rings and one copy per chunk. With direct
reads off, each chunk streams through the mailbox in 3 pieces, every byte copied twice,
with 5 rings (3 forward, 2 back); the rings cost a few microseconds each, against ~1 ms for
copying 4 MiB twice: memory bandwidth decides here. On 4 cores or more each chunk goes
through the mailbox in 128 KiB pieces, r+1 copying each out while r copies the next in,
with 7 rings (2 of them early). For a 4 KiB message the copies take ~1 us and the wake-up
(a system call and a context switch, tens of us on a loaded machine) decides.

**Who moves the bytes.** gloo moves its messages in its own threads, whatever the program
does meanwhile; this transport has no thread of its own: bytes move while a thread of the
rank posts or waits here. That is enough for a group all on one host. In a group that spans
hosts a rank also waits on gloo (its peers on other hosts), and a send posted here ahead of
that wait, larger than the mailbox, would stop half written: its receiver waits for the rest,
and if the gloo message the sender waits for comes only after that receiver has it, both
wait until the timeout (hierarchical all_reduce on 2 hosts x 2 ranks did). So while this
rank has messages in flight here, the door waits on gloo on a helper thread and keeps moving
ours (:meth:`ShmTransport.wait_elsewhere`): the rule NCCL keeps with its proxy thread.

**Copies per byte**, one message: shm 2 (sender into the mailbox, receiver out of it, at
once where each rank has a core; 3 for a message moved aside because a receive behind it was
posted first), no system call per byte, one wake-up per piece; 1 from 4 MiB where ranks
outnumber cores (read from the sender), one system call. gloo on loopback: 2 (``write`` into
the socket buffer, ``read`` out of it), plus TCP/IP's processing, socket-thread hand-offs in
both processes, and a system call per ~64 KiB on each side. Why not one copy for every size:
on the 2-core machine ``process_vm_readv`` pins the sender's pages as it goes and moved 3.3
GB/s at 16 MiB against 4.8 GB/s for one ``memmove``, and up to messages of about 2 MiB two
copies through a mailbox that stays in the cache are as fast or faster. ``python -m
benchmarks.transports --world-size 2,4 -b 4K -e 64M -f 4 -n 5 -w 1``, with
``COLLECTIVES_SHM_DIRECT_MIN=1M`` and ``=off`` one after the other (docs/benchmarks.md,
2026-11-27 22:31 UTC, load 1.5-2.2): the ring's busbw with one copy / with two, N=2: 0.88 at
1 MiB, 0.78 at 4 MiB, 1.18 at 16 MiB, 1.23 at 64 MiB; N=4: 0.93 at 4 MiB, 1.33 at 16 MiB,
1.12 at 64 MiB (those N=2 figures predate the pieces, which made the two copies faster than
one read there). The algorithms still receive into a buffer and reduce from it, as on gloo:
a reduction cannot read another process's memory in place.

Citation: NCCL's transports (``src/transport/shm.cc``: host-memory FIFO between
processes of one node); the single-producer single-consumer ring of Lamport,
"Specifying Concurrent Program Modules", TOPLAS 1983.

Memory ordering: head and tail are 8-byte aligned words, each written by one process
only; the payload is written before the ``head`` store that publishes it. That is
correct on x86-64 (total store order), which is where this project runs; another
architecture would need a release/acquire fence around those stores.
"""
import ctypes
import datetime
import errno
import json
import mmap
import os
import re
import select
import socket
import struct
import sys
import threading
import time
from collections import deque

import torch



PREFIX = "collectives-shm-"
DIRECTORY = "/dev/shm"
DEFAULT_CAPACITY = 2 << 20      # bytes of one mailbox's ring
ALIGN = 64                      # a cache line: records and counters start on one
HEADER = 2 * ALIGN              # head on the first line, tail on the second (no false sharing)
RECORD = ALIGN                  # a record header: tag, nbytes, address (three u64), padded
WAITS = 1                       # word of the head's line: 1 while the sender sleeps until the receiver
                                # gives room back or finishes a direct read (else no ring back)
SLICE = 0.05                    # seconds a waiter sleeps before checking its deadline again
SPIN = 30e-6                    # seconds a waiter looks again (yielding the core) before it sleeps
PIECE = 128 << 10               # bytes a sender copies into the ring before it publishes them, where
                                # the receiver has a core of its own to copy them out meanwhile
DIRECT_MIN = 4 << 20            # bytes from which a message is read straight from the sender (one copy;
                                # the door passes COLLECTIVES_SHM_DIRECT_MIN, whose default this is)


def cost(nbytes, capacity=DEFAULT_CAPACITY, direct_min=DIRECT_MIN, pipelined=False):
    """What one message of ``nbytes`` costs on this transport.

    Args:
        direct_min: the size from which a message is read straight out of the sender's
            memory (:data:`DIRECT_MIN`; None: every message through the mailbox, as on a
            host whose kernel refuses ``process_vm_readv``, or where each rank has a core).
        pipelined: each rank of the host has a core of its own: the sender publishes each
            :data:`PIECE` as it goes and rings once more per pass through the ring longer
            than a piece, so that the receiver copies out while it copies in.

    Returns:
        dict: ``copies`` (2 through the mailbox: into it, out of it; 1 read directly),
        ``bytes_copied`` (copies x nbytes), ``pieces`` (how many times it passes through
        the ring; 1 read directly: only its record passes), ``syscalls`` (a doorbell write
        per piece to the receiver, and one back to the sender for every piece but the last,
        which it waits for room to write, and pipelined the early ring of each pass longer
        than a piece; read directly: the record's ring, the read, and the ring back to a
        sender that waits for the read).

    Example::

        >>> cost(16 << 20, capacity=2 << 20, direct_min=None)["pieces"]   # 16 MiB, a 64-byte header
        9
        >>> cost(16 << 20)["copies"], cost(4096)["copies"]
        (1, 2)
        >>> cost(4 << 20, direct_min=None)["syscalls"], cost(4 << 20, direct_min=None, pipelined=True)["syscalls"]
        (5, 7)
    """
    if direct_min is not None and nbytes >= direct_min:
        return {"copies": 1, "bytes_copied": nbytes, "pieces": 1, "syscalls": 3}
    slot = _round(nbytes)
    pieces = max(1, -(-(RECORD + slot) // capacity))
    early = 0
    if pipelined and PIECE < capacity:
        # every pass but the last leaves the message unfinished after its first piece; the
        # last rings early only if it holds more than one piece
        last = RECORD + slot - capacity * (pieces - 1) - (RECORD if pieces == 1 else 0)
        early = pieces - 1 + (last > PIECE)
    return {"copies": 2, "bytes_copied": 2 * nbytes, "pieces": pieces, "syscalls": 2 * pieces - 1 + early}


def _round(n):
    return -(-n // ALIGN) * ALIGN


def alive(pid):
    """Whether process ``pid`` still runs on this host (one that is not ours to signal counts
    as running). The shared-memory waiter asks it where it has no pidfd; the trainer's lock
    asks it of a lock file's owner."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale(directory=DIRECTORY):
    """Remove the files a killed job left in ``directory``: ours, from this host, whose
    creating pid no longer runs. Returns the names removed."""
    removed = []
    host = _host_token()
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        m = re.match(re.escape(PREFIX) + r"([0-9a-f]+)-(\d+)-", name)
        if m is None or m.group(1) != host or alive(int(m.group(2))):
            continue
        try:
            os.unlink(os.path.join(directory, name))
            removed.append(name)
        except OSError:
            pass        # another job's cleaner took it first
    return removed


def _host_token():
    import zlib
    return f"{zlib.crc32(socket.gethostname().encode()):08x}"


class SetupFailed(RuntimeError):
    """A rank could not make or map its inbox (a full /dev/shm, a missing one, ...)."""


class PeerDied(RuntimeError):
    """The peer a message waited for exited before the message completed."""


class Work:
    """One posted message; ``wait(timeout)`` as gloo's work takes it."""

    __slots__ = ("transport", "kind", "peer", "tag", "tensor", "addr", "nbytes", "slot", "done_bytes",
                 "done", "error", "end", "target")

    def __init__(self, transport, kind, peer, tag, tensor):
        self.transport, self.kind, self.peer, self.tag = transport, kind, peer, tag
        self.tensor = tensor          # held until done: its memory is read or written by address
        self.addr = tensor.data_ptr()
        self.nbytes = tensor.nbytes
        self.slot = _round(self.nbytes)
        self.done_bytes = -1 if kind == "send" else 0    # -1: the record header is not written yet
        self.done = False
        self.error = None
        self.target = None    # a staged message: the receive it was matched to

    def is_completed(self):
        if not self.done and self.error is None:
            self.transport.progress()
        return self.done

    def wait(self, timeout=None):
        if isinstance(timeout, datetime.timedelta):
            timeout = timeout.total_seconds()
        self.transport.wait_for(self, timeout)
        return True


class Mailbox:
    """One direction of one pair: a ring of ``capacity`` bytes and its two counters.

    ``head`` (bytes ever written) is stored only by the sender, ``tail`` (bytes ever
    consumed) only by the receiver; ``head - tail`` bytes are waiting. Both only grow,
    by multiples of 64, so the ring never needs a flag to tell full from empty.
    """

    def __init__(self, buffer, offset, capacity):
        self.buffer, self.offset = buffer, offset + HEADER
        self.words = memoryview(buffer)[offset:offset + HEADER].cast("Q")
        self.base = ctypes.addressof(ctypes.c_char.from_buffer(buffer, offset + HEADER))
        self.capacity = capacity

    # Copies by address (memmove): a torch op costs microseconds of dispatch, which at
    # 4 KiB is more than the copy itself.
    def copy(self, pos, addr, n, into):
        """Copy ``n`` bytes between address ``addr`` and the ring at stream position ``pos``,
        wrapping: into the ring (``into``, a send) or out of it (a receive)."""
        at = pos % self.capacity
        first = min(n, self.capacity - at)
        for ring, mem, k in ((self.base + at, addr, first), (self.base, addr + first, n - first)):
            if k > 0:
                if into:
                    ctypes.memmove(ring, mem, k)
                else:
                    ctypes.memmove(mem, ring, k)

    def put_record(self, pos, tag, nbytes, addr=0):
        """A message's header: its tag, its size, and (a direct message) where its bytes are
        in the sender's memory; 0 there: its bytes follow in the ring."""
        struct.pack_into("<qqQ", self.buffer, self.offset + pos % self.capacity, tag, nbytes, addr)

    def get_record(self, pos):
        return struct.unpack_from("<qqQ", self.buffer, self.offset + pos % self.capacity)


_fence_lock = threading.Lock()


def _fence():
    """A full memory barrier: taking a lock is a locked instruction on x86-64, which orders a
    store before it against a load after it (plain stores may pass later loads there). Each
    side of the ring-back stores one word and then reads the other's: without it both could
    read the old values, and a sender would sleep until its poll's timeout (``SLICE``)."""
    _fence_lock.acquire()
    _fence_lock.release()


def _advance(box, pos, work, room, into):
    """Move as much of ``work``'s payload as ``room`` bytes of the ring allow, at stream
    position ``pos``: into the ring (a send) or out of it (a receive). The stream advances by
    the payload's slot (its size rounded up to 64), so only the real bytes are copied.
    Returns how far the stream advanced; the whole slot has passed once
    ``work.done_bytes == work.slot``."""
    amount = min(room, work.slot - work.done_bytes)
    if amount <= 0:
        return 0
    real = min(amount, work.nbytes - work.done_bytes)
    if real > 0:
        box.copy(pos, work.addr + work.done_bytes, real, into)
    work.done_bytes += amount
    return amount


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_libc = None
PROBE = 0x636F6C6C65637469      # "collecti": the word a rank publishes at setup (xor its pid)


def _c():
    """The C library, with ``process_vm_readv`` declared (loaded at the first use)."""
    global _libc
    if _libc is None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.process_vm_readv.restype = ctypes.c_ssize_t
        libc.process_vm_readv.argtypes = [ctypes.c_int, ctypes.POINTER(_Iovec), ctypes.c_ulong,
                                          ctypes.POINTER(_Iovec), ctypes.c_ulong, ctypes.c_ulong]
        _libc = libc
    return _libc


def _vm_read(pid, local, remote, nbytes):
    """``process_vm_readv`` of one range: the bytes copied, or minus the errno."""
    mine, theirs = _Iovec(local, nbytes), _Iovec(remote, nbytes)
    got = _c().process_vm_readv(pid, ctypes.byref(mine), 1, ctypes.byref(theirs), 1, 0)
    return got if got >= 0 else -ctypes.get_errno()


def _allow_peers_to_read():
    """Under Yama's ``ptrace_scope`` 1 (Ubuntu's default) only an ancestor may read a
    process's memory, and ranks are siblings: name any process of this user as allowed
    (``PR_SET_PTRACER_ANY``, as Open MPI's shared-memory transport does). Other scopes
    and kernels without Yama are left as they are; the probe in :func:`connect` decides."""
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            if f.read().strip() != "1":
                return
        _c().prctl(0x59616D61, ctypes.c_ulong(2 ** 64 - 1), 0, 0, 0)     # PR_SET_PTRACER, ANY
    except (OSError, AttributeError):
        pass


def _check_size(recv, nbytes):
    if recv.nbytes != nbytes:
        raise RuntimeError(f"a message of {nbytes} bytes arrived for a receive of "
                           f"{recv.nbytes} bytes with the same tag")


def _own_cores(local):
    """Whether this rank and its ``local`` peers can each run on a core of their own."""
    return len(local) + 1 <= len(os.sched_getaffinity(0))


def _inbox_size(peers, capacity):
    return max(1, peers) * (HEADER + capacity)


class ShmTransport:
    """Mailboxes between this rank and the ranks of its group on its host.

    Made by :func:`connect`; ``send``/``recv`` take group ranks in ``local`` (the peers
    it reaches), as gloo's do. Thread-safe: any thread may post or wait; one copies at
    a time.
    """

    def __init__(self, rank, local, pids, inbox, outboxes, bell_r, bells, pidfds, capacity, direct_min=None):
        self.rank, self.local, self.pids, self.capacity = rank, local, pids, capacity
        self.direct_min = direct_min       # messages this large are read from the sender: one copy
        # each rank of this host has a core of its own: a receiver can copy a message out while
        # its sender copies the rest in (else the two would only take turns on a core)
        self.pipelined = _own_cores(local)
        self.inbox = inbox                 # peer -> Mailbox the peer writes into (in my file)
        self.outbox = outboxes             # peer -> Mailbox I write into (in the peer's file)
        self.bell_r = bell_r               # my doorbell's read end
        self.bells = bells                 # peer -> the write end of its doorbell
        self.pidfds = pidfds               # peer -> pidfd (readable once it exits), or None
        self.sends = {p: deque() for p in local}
        self.unread = {p: deque() for p in local}   # sends written whole, not yet taken
        self.staged = {p: [] for p in local}        # messages moved aside, in arrival order
        self.recvs = {p: [] for p in local}
        self.current = {p: None for p in local}     # the receive a partly read message goes to
        self.head = {p: 0 for p in local}           # my copy of each outbox's head
        self.tail = {p: 0 for p in local}           # my copy of each inbox's tail
        self.flagged = set()                        # peers whose WAITS word this rank raised
        self.lock = threading.Lock()
        self.waiters = 0
        self.broken = None
        self._maps = []

    # -- posting -------------------------------------------------------------------------------
    def send(self, tensors, peer, tag):
        return self._post("send", tensors, peer, tag)

    def recv(self, tensors, peer, tag):
        return self._post("recv", tensors, peer, tag)

    def _post(self, kind, tensors, peer, tag):
        (tensor,) = tensors
        work = Work(self, kind, peer, tag, tensor)
        with self.lock:
            if self.broken is not None:
                raise PeerDied(self.broken)
            (self.sends[peer].append if kind == "send" else self.recvs[peer].append)(work)
            self._progress()      # a message that fits completes here, before any wait
        return work

    # -- moving bytes --------------------------------------------------------------------------
    def progress(self):
        with self.lock:
            return self._progress()

    def _progress(self):
        """Move every byte that can move now; ring the doorbell of each peer that has news."""
        moved = False
        for peer in self.local:
            rang = False
            if self.unread[peer] and self._taken(peer):
                moved = True       # a waiting thread of this rank may sleep on that send
            if self.sends[peer]:
                rang |= self._push(peer)
            if peer in self.flagged and not (self.sends[peer] or self.unread[peer]):
                self.outbox[peer].words[WAITS] = 0      # nothing of ours waits on that peer now
                self.flagged.discard(peer)
            if self.staged[peer] and self.recvs[peer] and self._match_staged(peer):
                moved = True
            if (self.recvs[peer] or self.current[peer] is not None) and self._pull(peer):
                moved = True
                # room again, or a direct read done: worth a ring only to a sender that sleeps
                # on it (it raised its flag first; the fence orders our tail before the read)
                _fence()
                rang |= bool(self.inbox[peer].words[WAITS])
            if rang:
                moved = True
                self._ring(peer)
        return moved

    def _push(self, peer):
        box, queue = self.outbox[peer], self.sends[peer]
        head, moved, rung = self.head[peer], False, False
        piece = PIECE if self.pipelined else box.capacity
        while queue:
            work = queue[0]
            free = box.capacity - (head - box.words[ALIGN // 8])
            if work.done_bytes < 0:
                if free < RECORD:
                    break
                if self._direct(work):
                    # only the record goes through the ring: the receiver reads the bytes
                    # from this tensor, which the work holds until the receiver is done
                    box.put_record(head, work.tag, work.nbytes, work.addr)
                    work.done_bytes = work.slot
                else:
                    box.put_record(head, work.tag, work.nbytes)
                    work.done_bytes = 0
                head += RECORD
                free -= RECORD
                moved = True
            while True:
                step = _advance(box, head, work, min(free, piece), into=True)
                head += step
                free -= step
                moved |= step > 0
                if step == 0 or work.done_bytes == work.slot or piece >= box.capacity:
                    break
                # publish this piece and wake the receiver now: it copies it out while we
                # copy the next (one ring per push; it looks for the rest itself)
                box.words[0] = self.head[peer] = head
                if not rung:
                    rung = True
                    self._ring(peer)
            if work.done_bytes < work.slot:
                break
            queue.popleft()
            work.end = head
            if self._direct(work):
                # read from our tensor: done once the receiver's tail has passed its record
                self.unread[peer].append(work)
            else:
                work.done = True
        if moved:
            box.words[0] = head      # publish: the payload above is written before this store
            self.head[peer] = head
        return moved

    def _direct(self, work):
        """Whether a send is read straight from its tensor (one condition for both the record
        that says so and the completion that must then wait for the reader)."""
        return self.direct_min is not None and work.nbytes >= self.direct_min

    def _taken(self, peer):
        """Complete the sends whose bytes the receiver has copied out (its tail passed their end)."""
        tail, unread, taken = self.outbox[peer].words[ALIGN // 8], self.unread[peer], False
        while unread and tail >= unread[0].end:
            unread.popleft().done = taken = True
        return taken

    def _match_staged(self, peer):
        """Give each posted receive the first message moved aside with its tag (copied now if
        it is whole, else when its last piece arrives). Returns whether a receive completed."""
        completed = False
        for recv in list(self.recvs[peer]):
            found = next((m for m in self.staged[peer] if m.tag == recv.tag and m.target is None), None)
            if found is None:
                continue
            _check_size(recv, found.nbytes)
            self.recvs[peer].remove(recv)
            found.target = recv
            if found.done:
                self._deliver(peer, found)
                completed = True
        return completed

    def _deliver(self, peer, staged):
        ctypes.memmove(staged.target.addr, staged.addr, staged.nbytes)
        staged.target.done = True
        self.staged[peer].remove(staged)

    def _pull(self, peer):
        box = self.inbox[peer]
        tail, moved = self.tail[peer], False
        while True:
            avail = box.words[0] - tail
            work = self.current[peer]
            if work is None:
                if avail < RECORD:
                    break
                tag, nbytes, addr = box.get_record(tail)
                work = next((w for w in self.recvs[peer] if w.tag == tag), None)
                if work is None:
                    if not self.recvs[peer]:
                        break       # no receive for it yet, none waits behind it: it stays
                    # a posted receive waits for a message behind this one: move this one
                    # aside (one more copy, only here), as gloo matches by tag, not order
                    work = Work(self, "stage", peer, tag, torch.empty(nbytes, dtype=torch.uint8))
                    self.staged[peer].append(work)
                else:
                    _check_size(work, nbytes)
                    self.recvs[peer].remove(work)
                tail += RECORD
                avail -= RECORD
                moved = True
                if addr:
                    # a direct message: one copy, from the sender's tensor into ours; its
                    # send completes when the tail below passes this record
                    self._read_direct(peer, work.addr, addr, nbytes)
                    work.done_bytes = work.slot
                    work.done = True        # moved aside: _match_staged delivers it whole
                    continue
                self.current[peer] = work
            step = _advance(box, tail, work, avail, into=False)
            tail += step
            moved |= step > 0
            if work.done_bytes < work.slot:
                break
            work.done = True
            self.current[peer] = None
            if work.target is not None:
                self._deliver(peer, work)
        if moved:
            box.words[ALIGN // 8] = tail    # the bytes are copied out before the room is given back
            self.tail[peer] = tail
        return moved

    def _read_direct(self, peer, local, remote, nbytes):
        """Copy ``nbytes`` from address ``remote`` of ``peer``'s process to ``local`` of ours
        (``process_vm_readv``: the kernel copies between the two address spaces, once)."""
        while nbytes > 0:
            got = _vm_read(self.pids[peer], local, remote, nbytes)
            if got > 0:
                local, remote, nbytes = local + got, remote + got, nbytes - got
                continue
            err = -got
            if err == errno.EINTR:
                continue
            if not alive(self.pids[peer]) or err == errno.ESRCH:
                # its memory went with it: what it wrote to the ring before dying is all
                self.broken = (f"the process of group rank {peer} (pid {self.pids[peer]}) exited "
                               f"while this rank read a message from it: it was killed or failed. "
                               f"Shared-memory transport")
                raise PeerDied(self.broken)
            raise OSError(err, f"shared memory: reading {nbytes} bytes from group rank {peer} "
                               f"(pid {self.pids[peer]}) failed: {os.strerror(err)}")

    # -- waiting -------------------------------------------------------------------------------
    def wait_for(self, work, timeout=None):
        """Block until ``work`` is done: progress, then sleep on the doorbell and the waited-for
        peers' pidfds; raise ``TimeoutError`` after ``timeout`` s or :class:`PeerDied`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        poller = select.poll()
        poller.register(self.bell_r, select.POLLIN)
        watched, spin_until = {}, None
        with self.lock:
            self.waiters += 1
        try:
            while True:
                with self.lock:
                    moved = self._progress()
                    if moved and self.pipelined:
                        spin_until = None   # a sender copying on another core publishes more soon
                    if moved and self.waiters > 1:
                        self._ring_self()      # another thread may sleep on news this one took
                    if work.done:
                        return
                    if work.error is not None:
                        raise PeerDied(work.error)
                    if self.broken is not None:
                        raise PeerDied(self.broken)
                    waiting = self._waited_peers()
                for peer in waiting:
                    fd = self.pidfds.get(peer)
                    if fd is not None and fd not in watched:
                        poller.register(fd, select.POLLIN)
                        watched[fd] = peer
                if spin_until is None:
                    # a peer running on another core answers within microseconds: look again
                    # for a moment before sleeping; sched_yield hands the core to a ready
                    # rank when ranks outnumber cores, so this spin never starves one
                    spin_until = time.monotonic() + SPIN
                if time.monotonic() < spin_until:
                    os.sched_yield()
                    continue
                with self.lock:
                    if self._ask_for_rings():
                        continue
                left = SLICE if deadline is None else min(SLICE, deadline - time.monotonic())
                if left <= 0:
                    raise TimeoutError(f"Timed out after {timeout:g} s waiting to "
                                       f"{work.kind} {work.nbytes} bytes (shared memory, peer {work.peer})")
                events = poller.poll(max(1, int(left * 1000)))
                dead = [watched[fd] for fd, _ in events if fd in watched]
                if self.pidfds and not events:
                    dead += [p for p in waiting if self.pidfds.get(p) is None and not alive(self.pids[p])]
                self._drain()
                if dead:
                    self._peer_died(dead[0], work)
        finally:
            with self.lock:
                self.waiters -= 1

    def in_flight(self):
        """Whether a message of this rank needs this rank to move more of it: a send not yet
        wholly in its mailbox, or a receive posted or partly read."""
        with self.lock:
            return any(self._moving(p) for p in self.local)

    def _moving(self, p):
        """Whether a message to or from ``p`` needs this rank to move more of its bytes."""
        return bool(self.sends[p] or self.recvs[p] or self.current[p] is not None)

    def wait_elsewhere(self, work, timeout):
        """Wait for ``work`` of another transport (a gloo message) while moving this one's.

        gloo's messages move in gloo's own threads; ours move only while a thread of this
        rank moves them. A rank blocked in gloo with a send here half written (the rest
        does not fit in the mailbox) leaves its peer waiting for the rest, and where that
        peer's answer is what the gloo wait needs, both wait until the timeout: a program
        that completes on gloo alone would hang here. Every algorithm that posts sends
        ahead and then waits on a receive meets it where a group spans hosts (hierarchical
        all_reduce on 2 hosts x 2 ranks hung so). So gloo's wait runs on a helper thread,
        bounded by its own ``timeout`` (seconds), and this thread moves our bytes until it
        ends; whatever gloo raised is raised here.
        """
        outcome = []

        def waiter():
            try:
                work.wait(timeout=datetime.timedelta(seconds=timeout))
                outcome.append(None)
            except BaseException as exc:    # noqa: BLE001 (handed to the waiting thread)
                outcome.append(exc)
            finally:
                self._ring_self()            # wake the mover below at once

        helper = threading.Thread(target=waiter, name="collectives-gloo-wait", daemon=True)
        helper.start()
        poller = select.poll()
        poller.register(self.bell_r, select.POLLIN)
        with self.lock:
            self.waiters += 1
        try:
            while not outcome:
                with self.lock:
                    if self._progress() and self.waiters > 1:
                        self._ring_self()
                if outcome:
                    break
                with self.lock:
                    if self._ask_for_rings():
                        continue
                # a peer that dies is the gloo wait's to report (it names the message);
                # this thread only moves bytes, so it sleeps on the doorbell alone
                poller.poll(int(SLICE * 1000))
                self._drain()
        finally:
            with self.lock:
                self.waiters -= 1
        helper.join()
        if outcome[0] is not None:
            raise outcome[0]

    def _ask_for_rings(self):
        """Before sleeping: raise the WAITS word of each peer this rank waits on for room or a
        direct read, so that peer rings back when it gives them (it rings no one else: a
        receiver's ring to a sender that does not wait is a system call on its side and a
        wake-up for nothing on ours). Returns whether bytes moved after the raise: then look
        again instead of sleeping, since the peer may have moved before it saw the word."""
        raised = False
        for p in self.local:
            if p not in self.flagged and (self.sends[p] or self.unread[p]):
                self.outbox[p].words[WAITS] = 1
                self.flagged.add(p)
                raised = True
        if not raised:
            return False
        _fence()
        return self._progress()

    def _waited_peers(self):
        return [p for p in self.local if self._moving(p) or self.unread[p]]

    def _peer_died(self, peer, work):
        with self.lock:
            self._progress()       # what the peer wrote before it died still counts
            if work.done:
                return
            self.broken = (f"the process of group rank {peer} (pid {self.pids[peer]}) exited "
                           f"while this rank waited for it: it was killed or failed. "
                           f"Shared-memory transport")
            raise PeerDied(self.broken)

    def _ring(self, rank):
        try:
            os.write(self.bells[rank], b"!")
        except BlockingIOError:
            pass    # the FIFO is full of rings already: its owner will wake

    def _ring_self(self):
        self._ring(self.rank)

    def _drain(self):
        try:
            while os.read(self.bell_r, 4096):
                pass
        except BlockingIOError:
            pass

    def close(self):
        for fd in [self.bell_r, *self.bells.values(), *(f for f in self.pidfds.values() if f is not None)]:
            try:
                os.close(fd)
            except OSError:
                pass


def connect(rank, pids, allgather, required=False, capacity=DEFAULT_CAPACITY, directory=DIRECTORY,
            warn=None, direct_min="auto"):
    """Set up shared memory between the ranks of one group that share a host.

    Args:
        rank: this rank in the group.
        pids: per group rank, its pid where it shares this rank's host, else None: the
            group's agreement (``agreed.known(info).local_pids``), which every rank holds
            alike, so no message is spent on who shares a host.
        allgather: ``allgather(bytes) -> [bytes of rank 0, 1, ...]`` over the group
            (the door's, over gloo). Called twice, by every rank.
        required: raise :class:`SetupFailed` on every rank if any rank of this host
            cannot make its inbox (``COLLECTIVES_TRANSPORT=shm``); else fall back.
        capacity: bytes of each mailbox's ring (a multiple of 64).
        warn: called with one line when falling back (default: print to stderr).
        direct_min: messages of at least this many bytes are read straight from the
            sender's memory (one copy) where every rank of the host can read every other's;
            None: all through the mailboxes; ``"auto"``: :data:`DIRECT_MIN` where the host's
            ranks outnumber its cores, else None (each rank has a core: the two copies of
            a mailbox run side by side, faster than one read). The door passes
            ``COLLECTIVES_SHM_DIRECT_MIN``.

    Returns:
        (ShmTransport or None, tuple of the group ranks it reaches): None when no
        peer shares this host or setup failed on the host (then gloo carries all).

    Example::

        >>> transport, peers = connect(comm.rank, agreement.local_pids, allgather)  # doctest: +SKIP
    """
    assert capacity % ALIGN == 0 and capacity >= 2 * RECORD
    if pids[rank] is None:
        raise ValueError("shm.connect: pids must give this rank's own pid")
    clean_stale(directory)
    local = tuple(r for r, pid in enumerate(pids) if r != rank and pid is not None)
    if direct_min == "auto":
        direct_min = None if _own_cores(local) else DIRECT_MIN
    host_ranks = sorted((rank,) + local)
    pids = {r: pids[r] for r in host_ranks}

    # 2. my inbox: one mailbox per local peer, in the order of their ranks
    made, status = [], {"ok": True}
    inbox_map, bell_r = None, None
    # a word every peer tries to read from this process (step 3): where the kernel lets
    # each rank of the host read the others' memory, large messages take one copy
    probe = ctypes.c_uint64(PROBE ^ os.getpid())
    if local and direct_min is not None:
        _allow_peers_to_read()
    if local:
        base = os.path.join(directory, f"{PREFIX}{_host_token()}-{os.getpid()}-{os.urandom(4).hex()}")
        try:
            fd = os.open(base, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            made.append(base)
            try:
                os.posix_fallocate(fd, 0, _inbox_size(len(local), capacity))
                inbox_map = mmap.mmap(fd, _inbox_size(len(local), capacity))
            finally:
                os.close(fd)
            os.mkfifo(base + ".bell", 0o600)
            made.append(base + ".bell")
            # open for reading now, before the peers open it to write (else they get ENXIO);
            # O_RDWR: the read end never sees end-of-file when a peer closes its end
            bell_r = os.open(base + ".bell", os.O_RDWR | os.O_NONBLOCK)
            status = {"ok": True, "path": base, "probe": ctypes.addressof(probe)}
        except OSError as exc:
            status = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    def gathered(data):
        try:
            return allgather(data)
        except BaseException:
            # a peer that never came (the timeout), Ctrl-C: the names must not outlive this job
            _unlink(made)
            raise

    statuses = [json.loads(b) for b in gathered(json.dumps(status).encode())]
    failed = {r: statuses[r]["error"] for r in host_ranks if not statuses[r]["ok"]}
    if failed:
        _unlink(made)
        if bell_r is not None:
            os.close(bell_r)
        gathered(json.dumps({"ok": True}).encode())   # the second all-gather, which other hosts make
        return _fallback(failed, required, warn, directory)
    if not local:
        allgather(b"{}")
        return None, ()

    # 3. map the peers' inboxes, open their doorbells and pidfds
    opened, bells, outboxes, pidfds, maps = {"ok": True}, {}, {}, {}, []
    bells[rank] = os.open(status["path"] + ".bell", os.O_WRONLY | os.O_NONBLOCK)
    inbox = {p: Mailbox(inbox_map, i * (HEADER + capacity), capacity) for i, p in enumerate(local)}
    try:
        for peer in local:
            path = statuses[peer]["path"]
            theirs = tuple(r for r in host_ranks if r != peer)
            fd = os.open(path, os.O_RDWR)
            try:
                m = mmap.mmap(fd, _inbox_size(len(theirs), capacity))
            finally:
                os.close(fd)
            maps.append(m)
            outboxes[peer] = Mailbox(m, theirs.index(rank) * (HEADER + capacity), capacity)
            bells[peer] = os.open(path + ".bell", os.O_WRONLY | os.O_NONBLOCK)
            try:
                pidfds[peer] = os.pidfd_open(pids[peer])
            except (AttributeError, OSError):
                pidfds[peer] = None      # no pidfds here: the waiter asks kill(pid, 0) instead
        opened["direct"] = direct_min is not None and all(
            _probe(pids[peer], statuses[peer]["probe"]) for peer in local)
    except OSError as exc:
        opened = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    results = [json.loads(b) for b in gathered(json.dumps(opened).encode())]
    _unlink(made)     # everyone who needs my files has them open (or gave up): the names can go
    failed = {r: results[r]["error"] for r in host_ranks if not results[r]["ok"]}
    if failed:
        for fd in [bell_r, *bells.values(), *(f for f in pidfds.values() if f is not None)]:
            os.close(fd)
        return _fallback(failed, required, warn, directory)
    # one copy only if every rank of the host can read every other: a sender cannot know
    # whether its receiver could
    direct = all(results[r].get("direct") for r in host_ranks)
    transport = ShmTransport(rank, local, pids, inbox, outboxes, bell_r, bells, pidfds, capacity,
                             direct_min if direct else None)
    transport._maps = [inbox_map, *maps]
    return transport, local


def _probe(pid, addr):
    """Whether this process may read process ``pid``'s memory: the word it published."""
    word = ctypes.c_uint64(0)
    return (_vm_read(pid, ctypes.addressof(word), addr, 8) == 8
            and word.value == PROBE ^ pid)


def _unlink(paths):
    for p in paths:
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass


def _fallback(failed, required, warn, directory):
    rank, error = next(iter(sorted(failed.items())))
    text = (f"shared memory between the ranks of this host failed on group rank {rank} "
            f"({error}; is {directory} full or missing?)")
    if required:
        raise SetupFailed(f"{text}. COLLECTIVES_TRANSPORT=shm requires it; set "
                          f"COLLECTIVES_TRANSPORT=auto to fall back to gloo, or free space in {directory}")
    (warn or (lambda line: print(line, file=sys.stderr, flush=True)))(
        f"collectives: {text}: this group uses gloo")
    return None, ()
