"""Doorbells: which wake-up the shared-memory door should ring, measured (issue 37).

**What it measures.** ``collectives/shm.py`` moves bytes through mailboxes in shared
memory and needs one more thing from the kernel: a way to wake a receiver that sleeps.
Two processes (a pair) ping-pong a wake-up through each *mechanism*: A rings B's bell
and sleeps on its own; B, woken, rings A's. One round trip is two wake-ups; A times it
with ``time.perf_counter_ns``. ``--pairs P`` runs P pairs at once (2P processes): on a
2-core machine ``--pairs 2`` is four processes on two cores, the "ranks outnumber cores"
case, where a waiter that spins would steal the core its peer needs.

**Mechanisms** (one bell per direction; every wait sleeps in the kernel, none spins).
System calls are per wake, ringer / sleeping waiter; descriptors per bell; and what a
waiter sees when its peer dies (SIGKILL included):

* ``fifo``, as shm.py does it: ``write`` one byte to a named FIFO / ``poll`` its read
  end (opened ``O_RDWR|O_NONBLOCK``, so it never reads end of file), then drain it with
  ``read`` until ``EAGAIN``: 1 / 3 (poll, read, read; in Python the ``EAGAIN`` is a
  raised ``BlockingIOError`` too). 2 descriptors (read end, write end). The peer's
  pidfd, polled beside the bell, wakes the waiter at once.
* ``fifo_one_read``: the same FIFO drained with one ``read`` of 4096 bytes (every
  pending ring; more than 4096 would leave the rest for the next ``poll``, which
  returns at once): 1 / 2. As ``fifo`` otherwise.
* ``pipe``: the same kernel object unnamed (``pipe2``), one ``read``: 1 / 2, 2
  descriptors, pidfd beside it.
* ``eventfd``: ``eventfd_write(1)`` / ``poll`` + one ``eventfd_read`` (the counter:
  every ring since the last read, in 8 bytes): 1 / 2, 1 descriptor, pidfd beside it.
* ``socket``: a unix datagram ``socketpair``, ``send`` one byte / ``poll`` + one
  ``recv``: 1 / 2, 1 descriptor per end, pidfd beside it.
* ``futex``: a 32-bit sequence number in a shared ``mmap``; the ringer increments it
  and calls ``FUTEX_WAKE``, the waiter calls ``FUTEX_WAIT`` while the word holds the
  value it last saw (the kernel compares and sleeps atomically, so a ring between the
  look and the wait is not lost): 1 / 1 (no wait call when the word changed first).
  No descriptor, and nothing to ``poll``: a dead peer is seen only when the wait times
  out (here every 50 ms, shm.py's ``SLICE``) and ``kill(pid, 0)`` says it is gone.
  Here it is called through ``ctypes`` (``syscall``), which costs more Python per call
  than ``os.read``; a ring that skipped ``FUTEX_WAKE`` when nobody sleeps (a waiters
  word beside the counter, Drepper's design) would save the ringer's call.

A named FIFO (or a unix socket bound to a path) is what lets ``shm.py`` set up between
processes that share no ancestor: each rank opens its peers' bells by name. An eventfd
or a socketpair exists only as a descriptor and must be handed over (``SCM_RIGHTS`` over
a unix socket, or ``pidfd_getfd``: opening ``/proc/PID/fd/N`` of an eventfd fails with
``ENXIO``); here they are inherited through ``fork``. A futex needs no descriptor but
has no ``poll`` either, so it cannot sleep on a bell and on the peers' pidfds at once:
dead-peer detection becomes a timeout (a 50 ms wake-up per waiter, and up to 50 ms
before a death is seen), where today a pidfd names the peer at once.

**Steps** (one run):

1. The parent makes every pair's bells (both directions, every mechanism), then forks B
   and A of each pair and unlinks the FIFOs (the open descriptors keep them): nothing
   is left in the file system.
2. Every process waits at a start line (its own pipe), then runs ``-w + -n``
   iterations. Iteration i runs every mechanism once, in an order rotated by i, so
   load from elsewhere on the machine hits all mechanisms alike (as the sweep does).
   A: ring B, sleep until woken; B: sleep until woken, ring A.
3. Each side counts the wake-ups its waits consumed (bytes drained, the eventfd's
   counter, datagrams, steps of the futex word). A wait that is not woken within
   ``--timeout`` seconds is a lost wake: the process stops, its peer sees it die, and
   the run fails. Every mechanism must deliver ``2 x P x (w + n)`` wakes.
4. The parent prints, per ``--pairs`` value and mechanism: the median, p90 and p99
   round trip in microseconds over every pair's samples, ``vs_fifo`` (the median over
   iterations of round trip / the FIFO's round trip of the same iteration and pair:
   ``benchmarks.common.paired_ratio``), the CPU both processes spent per round trip
   (thread CPU time, A's and B's medians added: from Python it is about the round trip
   itself, the system calls and the interpreter around them; the two overlap on two
   cores) and the wakes delivered.
5. ``--idle S``: every mechanism's wait once more, each in its own process, all at once,
   with nobody ringing, until its ``S`` s timeout: the thread CPU time it used and the
   kernel waits it made. A wait that sleeps makes about ``S / SLICE`` of them and uses
   only those wake-ups' CPU (milliseconds); one that spun would make thousands and use
   its share of the cores for all ``S`` seconds. Rows go to
   ``--out``/doorbell.csv and .json with the machine and its load.

**Worked example**, ``--pairs 2`` on 2 cores: four processes; at any moment each pair has
one process awake (the one ringing) and one asleep, so two runnable processes share
two cores. A mechanism that spun in its wait would keep four runnable, and each wake
would wait for a time slice (milliseconds) instead of a few microseconds. With
``-n 2000 -w 100`` each of the six mechanisms delivers 2 x 2 x 2100 = 8400 wakes; on
the 2-core machine (docs/benchmarks.md, "Doorbells") a FIFO round trip took 32-57 us
at a median there, shm.py's drain taking 3 system calls per wake of it.

``cost()`` gives a mechanism's system calls per wake and descriptors per bell.

Usage::

    python -m benchmarks.doorbell -n 2000 -w 100 --pairs 1,2

The program imports no torch (it measures the operating system), and forks: Linux only
(``os.eventfd``, ``os.pidfd_open`` and the futex system call are Linux's; the futex is
called by number, known here for x86-64 only: elsewhere it is skipped with a line
saying so). Citation: futex(2), eventfd(2), pipe(7), unix(7), pidfd_open(2);
U. Drepper, "Futexes Are Tricky", 2011.
"""
import argparse
import csv
import ctypes
import errno
import json
import mmap
import os
import platform
import select
import socket
import statistics
import sys
import tempfile
import time

from benchmarks.flags import positive, whole, whole_list

MECHANISMS = ("fifo", "fifo_one_read", "pipe", "eventfd", "socket", "futex")
BASELINE = "fifo"
SLICE = 0.05                   # seconds a waiter sleeps before it checks its peer and deadline
SYS_FUTEX = {"x86_64": 202}    # the futex system call's number, per architecture we know
FUTEX_WAIT, FUTEX_WAKE = 0, 1  # not FUTEX_PRIVATE_FLAG: the word is shared between processes
WORD_GAP = 64                  # the two directions' futex words on separate cache lines


def cost(mechanism):
    """System calls one wake costs, and the descriptors a bell holds.

    Returns:
        dict: ``ring`` (calls by the ringer), ``wait`` (calls by a waiter that was
        asleep), ``fds`` (descriptors a bell keeps open in a process that holds both
        ends), ``pollable`` (whether its wait can sleep beside a peer's pidfd).

    Example::

        >>> cost("fifo")["wait"]     # poll, read, read (until EAGAIN)
        3
        >>> cost("futex")["pollable"]
        False
    """
    table = {
        "fifo": {"ring": 1, "wait": 3, "fds": 2, "pollable": True},
        "fifo_one_read": {"ring": 1, "wait": 2, "fds": 2, "pollable": True},
        "pipe": {"ring": 1, "wait": 2, "fds": 2, "pollable": True},
        "eventfd": {"ring": 1, "wait": 2, "fds": 1, "pollable": True},
        "socket": {"ring": 1, "wait": 2, "fds": 2, "pollable": True},
        "futex": {"ring": 1, "wait": 1, "fds": 0, "pollable": False},
    }
    return dict(table[mechanism])


class Lost(RuntimeError):
    """A wait that nobody woke within the timeout: the mechanism lost a wake."""


class PeerDied(RuntimeError):
    """The process on the other end exited while this one waited for it."""


def available():
    """{mechanism: None if it runs here, else why not}."""
    why = {m: None for m in MECHANISMS}
    if not hasattr(os, "eventfd"):
        why["eventfd"] = "os.eventfd needs Linux and Python 3.10"
    if platform.machine() not in SYS_FUTEX:
        why["futex"] = f"the futex system call's number is known here for x86-64 only, not {platform.machine()}"
    return why


# ---------------------------------------------------------------- bells (made in the parent)

def make_bell(mechanism, tmp):
    """One direction's bell, made before the fork so both processes inherit it: a dict with
    the descriptors or the shared word it needs."""
    if mechanism in ("fifo", "fifo_one_read"):
        path = os.path.join(tmp, f"bell-{os.urandom(4).hex()}")
        os.mkfifo(path, 0o600)
        # shm.py's way: the read end first (else the write end's open fails with ENXIO),
        # O_RDWR so that it never sees end of file when the last writer closes
        r = os.open(path, os.O_RDWR | os.O_NONBLOCK)
        w = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        os.unlink(path)
        return {"r": r, "w": w}
    if mechanism == "pipe":
        r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        return {"r": r, "w": w}
    if mechanism == "eventfd":
        fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        return {"r": fd, "w": fd}
    if mechanism == "socket":
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        a.setblocking(False)
        b.setblocking(False)
        return {"r": b, "w": a}
    if mechanism == "futex":
        return {"word": None}   # placed in the pair's shared page by make_pair
    raise ValueError(f"unknown mechanism {mechanism!r}; known: {', '.join(MECHANISMS)}")


def make_pair(mechanisms, tmp):
    """Both directions of every mechanism for one pair: {mechanism: (A->B bell, B->A bell)}."""
    page = mmap.mmap(-1, mmap.PAGESIZE, flags=mmap.MAP_SHARED)   # inherited through fork
    bells = {}
    for m in mechanisms:
        ab, ba = make_bell(m, tmp), make_bell(m, tmp)
        if m == "futex":
            ab["word"] = ctypes.c_uint32.from_buffer(page, 0)
            ba["word"] = ctypes.c_uint32.from_buffer(page, WORD_GAP)
        bells[m] = (ab, ba)
    bells["_page"] = page
    return bells


# ---------------------------------------------------------------- ringing and waiting (in a child)

class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _futex_call():
    libc = ctypes.CDLL(None, use_errno=True)
    call = libc.syscall
    call.restype = ctypes.c_long
    call.argtypes = [ctypes.c_long, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32,
                     ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint32]
    return call


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def arm(mechanism, ring_bell, wait_bell, peer_pid, pidfd, timeout):
    """(ring, wait) for one process: ``ring()`` wakes the peer; ``wait()`` sleeps until
    woken and returns how many rings it consumed (1 in a ping-pong), or raises
    :class:`Lost` after ``timeout`` s and :class:`PeerDied` when the peer exits."""
    if mechanism == "futex":
        return _arm_futex(ring_bell["word"], wait_bell["word"], peer_pid, timeout)
    w, r = ring_bell["w"], wait_bell["r"]
    if mechanism in ("fifo", "fifo_one_read", "pipe"):
        def ring():
            try:
                os.write(w, b"!")
            except BlockingIOError:
                pass        # the pipe is full of rings already: the peer will wake

        if mechanism == "fifo":
            def take():     # shm.py's _drain: read until EAGAIN
                n = 0
                try:
                    while True:
                        got = os.read(r, 4096)
                        if not got:
                            break
                        n += len(got)
                except BlockingIOError:
                    pass
                return n
        else:
            def take():     # one read takes every pending byte up to 4096
                try:
                    return len(os.read(r, 4096))
                except BlockingIOError:
                    return 0
    elif mechanism == "eventfd":
        def ring():
            os.eventfd_write(w, 1)

        def take():
            try:
                return os.eventfd_read(r)
            except BlockingIOError:
                return 0
    elif mechanism == "socket":
        def ring():
            try:
                w.send(b"!")
            except BlockingIOError:
                pass

        def take():
            try:
                return len(r.recv(64))
            except BlockingIOError:
                return 0
    else:
        raise ValueError(f"unknown mechanism {mechanism!r}")
    fd = r if isinstance(r, int) else r.fileno()
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    if pidfd is not None:
        poller.register(pidfd, select.POLLIN)

    sleeps = [0]     # the kernel waits it made (its loop's turns): a spinning wait makes thousands

    def wait():
        deadline = time.monotonic() + timeout
        while True:
            sleeps[0] += 1
            events = poller.poll(int(SLICE * 1000))
            for f, _ in events:
                if f == fd:
                    n = take()
                    if n:
                        return n
            if any(f == pidfd for f, _ in events):
                n = take()      # a ring it sent before it died still counts
                if n:
                    return n
                raise PeerDied(f"pid {peer_pid} exited while this process waited for its {mechanism} ring")
            if not events:
                if pidfd is None and not _alive(peer_pid):
                    raise PeerDied(f"pid {peer_pid} exited while this process waited for its {mechanism} ring")
                if time.monotonic() > deadline:
                    raise Lost(f"{mechanism}: no ring within {timeout:g} s")
    wait.sleeps = sleeps
    return ring, wait


def _arm_futex(ring_word, wait_word, peer_pid, timeout):
    call = _futex_call()
    nr = SYS_FUTEX[platform.machine()]
    ring_addr, wait_addr = ctypes.addressof(ring_word), ctypes.addressof(wait_word)
    slice_ts = _Timespec(0, int(SLICE * 1e9))
    seen = [0]     # the page is fresh: not its value now, which the peer may have rung already

    def ring():
        # one writer per word: a plain store is atomic on x86-64 for an aligned 32-bit word
        ring_word.value = (ring_word.value + 1) & 0xFFFFFFFF
        call(nr, ring_addr, FUTEX_WAKE, 1, None, None, 0)

    sleeps = [0]     # the kernel waits it made (its loop's turns): a spinning wait makes thousands

    def wait():
        deadline = time.monotonic() + timeout
        while True:
            now = wait_word.value
            if now != seen[0]:
                n = (now - seen[0]) & 0xFFFFFFFF
                seen[0] = now
                return n
            # sleeps only while the word still holds `seen`: a ring between the load above
            # and this call makes the kernel return EAGAIN at once, so no wake is lost
            sleeps[0] += 1
            if call(nr, wait_addr, FUTEX_WAIT, seen[0], ctypes.addressof(slice_ts), None, 0) == -1:
                err = ctypes.get_errno()
                if err == errno.ETIMEDOUT:
                    if not _alive(peer_pid):
                        raise PeerDied(f"pid {peer_pid} exited while this process waited for its futex ring")
                    if time.monotonic() > deadline:
                        raise Lost(f"futex: no ring within {timeout:g} s")
                elif err not in (errno.EAGAIN, errno.EINTR):
                    raise OSError(err, f"futex wait: {os.strerror(err)}")
    wait.sleeps = sleeps
    return ring, wait


def child(role, pair, bells, mechanisms, iters, warmup, timeout, drop, go_fd, out_path):
    """One process of a pair: wait at the start line, ping-pong, write what it counted."""
    peer_pid = int(os.read(go_fd, 64).decode())
    try:
        pidfd = os.pidfd_open(peer_pid)
    except (AttributeError, OSError):
        pidfd = None
    armed = {}
    for m in mechanisms:
        ab, ba = bells[m]
        ring_bell, wait_bell = (ab, ba) if role == "A" else (ba, ab)
        armed[m] = arm(m, ring_bell, wait_bell, peer_pid, pidfd, timeout)
    wall = {m: [] for m in mechanisms}
    cpu = {m: [] for m in mechanisms}
    wakes = {m: 0 for m in mechanisms}
    error = None
    clock, cpu_clock = time.perf_counter_ns, time.thread_time_ns
    try:
        for it in range(warmup + iters):
            k = it % len(mechanisms)
            for m in mechanisms[k:] + mechanisms[:k]:
                ring, wait = armed[m]
                c0 = cpu_clock()
                t0 = clock()
                if role == "A":
                    if drop != (m, it):
                        ring()
                    got = wait()
                else:
                    got = wait()
                    ring()
                t1 = clock()
                c1 = cpu_clock()
                wakes[m] += got
                if it >= warmup:
                    wall[m].append(t1 - t0)
                    cpu[m].append(c1 - c0)
    except (Lost, PeerDied, OSError) as exc:
        error = f"{role}{pair}: {type(exc).__name__}: {exc}"
    with open(out_path, "w") as f:
        json.dump({"role": role, "pair": pair, "wall": wall, "cpu": cpu, "wakes": wakes, "error": error}, f)


# ---------------------------------------------------------------- the parent

def run(pairs, mechanisms, iters, warmup, timeout, drop=None):
    """Run ``pairs`` pairs at once through every mechanism. Returns (results per process,
    errors): each result as :func:`child` wrote it."""
    tmp = tempfile.mkdtemp(prefix="collectives-doorbell-")
    kids = []                 # (pid, go pipe's write end, result path)
    try:
        everything = [make_pair(mechanisms, tmp) for _ in range(pairs)]
        for pair, bells in enumerate(everything):
            for role in ("B", "A"):
                go_r, go_w = os.pipe()
                out_path = os.path.join(tmp, f"{role}{pair}.json")
                pid = os.fork()
                if pid == 0:
                    code = 0
                    try:
                        os.close(go_w)
                        child(role, pair, bells, list(mechanisms), iters, warmup, timeout, drop, go_r, out_path)
                    except BaseException:   # noqa: BLE001 (a child must never return into the parent's code)
                        import traceback
                        traceback.print_exc()
                        code = 1
                    os._exit(code)
                os.close(go_r)
                kids.append((pid, go_w, out_path))
        for i, (pid, go_w, _) in enumerate(kids):
            peer = kids[i + 1][0] if i % 2 == 0 else kids[i - 1][0]
            os.write(go_w, str(peer).encode())
            os.close(go_w)
        # a lost wake ends its process after `timeout` and its peer when it sees it die;
        # this bound is for a bug in this program, so that it still never hangs a test
        budget = 60 + 3 * timeout + pairs * len(mechanisms) * (iters + warmup) * 0.01
        deadline = time.monotonic() + budget
        left = {pid for pid, _, _ in kids}
        errors = []
        while left:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                if time.monotonic() > deadline:
                    for p in left:
                        os.kill(p, 9)
                    errors.append(f"the run outlived its {budget:.0f} s bound: its processes were killed")
                    for p in list(left):
                        os.waitpid(p, 0)
                    break
                time.sleep(0.05)
                continue
            left.discard(pid)
            if os.waitstatus_to_exitcode(status) != 0:
                errors.append(f"process {pid} exited with {os.waitstatus_to_exitcode(status)}")
        results = []
        for _, _, path in kids:
            try:
                with open(path) as f:
                    results.append(json.load(f))
            except (OSError, ValueError):
                errors.append(f"no result from {os.path.basename(path)}")
        errors += [r["error"] for r in results if r["error"]]
        return results, errors
    finally:
        for name in os.listdir(tmp):
            os.unlink(os.path.join(tmp, name))
        os.rmdir(tmp)


def _quantile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def idle(mechanisms, seconds):
    """Each mechanism's wait with nobody ringing, for ``seconds``, all at once in one process
    each (the parent, alive and asleep, is the peer). Returns one row per mechanism: the
    thread CPU time the wait used; a wait that spun would use most of ``seconds`` (or its
    share of the cores), one that sleeps only its wake-ups every ``SLICE``."""
    tmp = tempfile.mkdtemp(prefix="collectives-doorbell-")
    kids = []
    try:
        bells = make_pair(mechanisms, tmp)
        parent = os.getpid()
        for m in mechanisms:
            out_path = os.path.join(tmp, f"idle-{m}.json")
            pid = os.fork()
            if pid == 0:
                code = 0
                try:
                    pidfd = os.pidfd_open(parent) if hasattr(os, "pidfd_open") else None
                    _, wait = arm(m, bells[m][1], bells[m][0], parent, pidfd, seconds)
                    c0, t0 = time.thread_time(), time.monotonic()
                    try:
                        wait()
                        outcome = "woken by nobody's ring"
                    except Lost:
                        outcome = None
                    with open(out_path, "w") as f:
                        json.dump({"cpu": time.thread_time() - c0, "wall": time.monotonic() - t0,
                                   "sleeps": wait.sleeps[0], "error": outcome}, f)
                except BaseException:   # noqa: BLE001 (a child must never return into the parent's code)
                    import traceback
                    traceback.print_exc()
                    code = 1
                os._exit(code)
            kids.append((m, pid, out_path))
        rows = []
        for m, pid, out_path in kids:
            os.waitpid(pid, 0)      # each wait ends by itself after `seconds`
            try:
                with open(out_path) as f:
                    got = json.load(f)
            except (OSError, ValueError):
                got = {"cpu": None, "wall": None, "sleeps": None, "error": "no result"}
            rows.append({"mechanism": m, "idle_s": seconds, **got})
        return rows
    finally:
        for name in os.listdir(tmp):
            os.unlink(os.path.join(tmp, name))
        os.rmdir(tmp)


def summarize(results, mechanisms, pairs, iters, warmup):
    """One row per mechanism from every process's samples."""
    rows = []
    expected = 2 * pairs * (warmup + iters)
    a_side = [r for r in results if r["role"] == "A"]
    b_side = {r["pair"]: r for r in results if r["role"] == "B"}
    for m in mechanisms:
        wall = [t / 1e3 for r in a_side for t in r["wall"][m]]
        ratios = [x / y for r in a_side for x, y in zip(r["wall"][m], r["wall"][BASELINE])]
        cpu_a = [t / 1e3 for r in a_side for t in r["cpu"][m]]
        cpu_b = [t / 1e3 for r in b_side.values() for t in r["cpu"][m]]
        wakes = sum(r["wakes"][m] for r in results)
        c = cost(m)
        row = {"pairs": pairs, "mechanism": m, "calls_ring": c["ring"], "calls_wait": c["wait"],
               "pollable": c["pollable"], "samples": len(wall), "wakes": wakes, "wakes_expected": expected}
        if wall:
            row.update({"median_us": round(statistics.median(wall), 2),
                        "p90_us": round(_quantile(wall, 0.90), 2), "p99_us": round(_quantile(wall, 0.99), 2),
                        "vs_fifo": round(statistics.median(ratios), 3) if ratios else None,
                        "cpu_per_rt_us": round(statistics.median(cpu_a) + (statistics.median(cpu_b) if cpu_b else 0),
                                               2)})
        rows.append(row)
    return rows


def machine():
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "command": " ".join(["python -m benchmarks.doorbell"] + sys.argv[1:]),
            "host": platform.node(), "cpu": model, "arch": platform.machine(), "cores": os.cpu_count(),
            "kernel": platform.release(), "python": platform.python_version()}


def _load():
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _mechanism_list(text):
    names = [x.strip() for x in str(text).split(",") if x.strip()]
    unknown = [x for x in names if x not in MECHANISMS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown mechanism(s) {', '.join(unknown) or text!r}; "
                                         f"known: {', '.join(MECHANISMS)}")
    return list(dict.fromkeys(names))


def _drop(text):
    try:
        m, it = text.split(":")
        it = int(it)
    except ValueError:
        m, it = None, -1
    if m not in MECHANISMS or it < 0:
        raise argparse.ArgumentTypeError(f"MECHANISM:ITERATION expected (a mechanism of {', '.join(MECHANISMS)}, "
                                         f"an iteration of 0 or more), got {text!r}")
    return m, it


def _seconds_or_none(text):
    return 0.0 if str(text).strip() in ("0", "0.0") else _seconds(text)


_seconds = positive("a number of seconds")


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.doorbell", description=__doc__.split("\n")[0])
    p.add_argument("-n", "--iters", type=whole(1), default=1000,
                   help="timed round trips per mechanism and pair (default 1000)")
    p.add_argument("-w", "--warmup-iters", type=whole(0), default=50, help="untimed round trips first (default 50)")
    p.add_argument("--pairs", type=whole_list(1), default="1",
                   help="pairs of processes at once; several run in turn (1,2: 2 then 4 processes; default 1)")
    p.add_argument("--mechanisms", type=_mechanism_list, default=",".join(MECHANISMS),
                   help=f"comma-separated (default {','.join(MECHANISMS)}); fifo, the baseline, is always run")
    p.add_argument("--timeout", type=_seconds, default=10.0,
                   help="seconds a wait lasts before its wake counts as lost and the run fails (default 10)")
    p.add_argument("--idle", type=_seconds_or_none, default=1.0,
                   help="then every mechanism's wait, never rung, for this many seconds (all at once): "
                        "the CPU it used shows whether it sleeps (default 1; 0 leaves it out)")
    p.add_argument("--drop", type=_drop, default=None,
                   help="MECHANISM:ITERATION: A does not ring then (the test's lost wake, which must fail the run)")
    p.add_argument("--out", default=os.path.join("bench_out", "doorbell"),
                   help="folder for doorbell.csv and doorbell.json (default bench_out/doorbell)")
    args = p.parse_args(argv)
    if not hasattr(os, "fork") or not hasattr(os, "pipe2"):
        p.error("this benchmark forks and uses Linux's pipe2, eventfd and futex: run it on Linux")
    mechanisms = list(args.mechanisms)
    if BASELINE not in mechanisms:
        mechanisms.insert(0, BASELINE)
    skipped = {m: why for m, why in available().items() if why and m in mechanisms}
    mechanisms = [m for m in mechanisms if m not in skipped]
    meta = machine()
    print(f"# doorbell round trips (A wakes B, B wakes A): -n {args.iters} -w {args.warmup_iters}, "
          f"pairs {','.join(map(str, args.pairs))}", flush=True)
    print(f"# {meta['host']}: {meta['cpu']}, {meta['cores']} cores, Linux {meta['kernel']}, "
          f"Python {meta['python']}; load average {_load()}", flush=True)
    for m, why in skipped.items():
        print(f"# {m} skipped: {why}", flush=True)
    print("# every wait sleeps in the kernel (poll beside the peer's pidfd, or FUTEX_WAIT): none spins; "
          "calls: system calls per wake, ringer/waiter; pidfd: whether a dead peer wakes the waiter at once",
          flush=True)
    print(f"#{'pairs':>6} {'mechanism':>13} {'calls':>5} {'pidfd':>5} {'median(us)':>11} {'p90(us)':>9} {'p99(us)':>9} "
          f"{'vs_fifo':>8} {'cpu/rt(us)':>11} {'wakes':>15}", flush=True)
    rows, failed = [], []
    for pairs in args.pairs:
        results, errors = run(pairs, mechanisms, args.iters, args.warmup_iters, args.timeout, args.drop)
        for row in summarize(results, mechanisms, pairs, args.iters, args.warmup_iters):
            row["loadavg"] = _load()
            rows.append(row)
            wakes = f"{row['wakes']}/{row['wakes_expected']}"
            calls, pidfd = f"{row['calls_ring']}/{row['calls_wait']}", "yes" if row["pollable"] else "no"
            if row["wakes"] != row["wakes_expected"]:
                failed.append(f"{row['mechanism']} (pairs {pairs}) delivered {wakes} wakes")
            head = f" {pairs:>6} {row['mechanism']:>13} {calls:>5} {pidfd:>5}"
            if "median_us" in row:
                print(f"{head} {row['median_us']:>11.2f} {row['p90_us']:>9.2f} {row['p99_us']:>9.2f} "
                      f"{row['vs_fifo']:>8.2f} {row['cpu_per_rt_us']:>11.2f} {wakes:>15}", flush=True)
            else:
                print(f"{head} {'-':>11} {'-':>9} {'-':>9} {'-':>8} {'-':>11} {wakes:>15}", flush=True)
        print(f"# pairs {pairs} done, load average {_load()}", flush=True)
        failed += errors
    idle_rows = []
    if args.idle > 0:
        print(f"# idle: each mechanism's wait, never rung, for {args.idle:g} s, all at once, each in its own "
              f"process: the CPU it used (a spinning wait would use up to {args.idle:g} s) and its kernel "
              f"waits (sleeps; each up to {SLICE * 1e3:g} ms, so about {args.idle / SLICE:.0f})", flush=True)
        print(f"#{'mechanism':>13} {'wall(s)':>8} {'cpu(ms)':>8} {'sleeps':>7}", flush=True)
        for row in idle(mechanisms, args.idle):
            idle_rows.append(row)
            if row["error"]:
                failed.append(f"{row['mechanism']} idle wait: {row['error']}")
                print(f" {row['mechanism']:>13} {'-':>8} {'-':>8} {'-':>7}", flush=True)
            else:
                print(f" {row['mechanism']:>13} {row['wall']:>8.2f} {row['cpu'] * 1e3:>8.2f} {row['sleeps']:>7}",
                      flush=True)
        print(f"# idle done, load average {_load()}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "doorbell.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
        writer.writeheader()
        writer.writerows(rows)
    with open(os.path.join(args.out, "doorbell.json"), "w") as f:
        json.dump({"meta": meta, "skipped": skipped, "rows": rows, "idle": idle_rows}, f, indent=1)
    print(f"# wrote {args.out}/ (doorbell.csv, doorbell.json)", flush=True)
    if failed:
        for line in failed:
            print(f"# FAILED: {line}", flush=True)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
