"""One communication thread per group, running that group's collectives in issue order.

``async_op=True`` must return at once and let the caller compute while the
messages move; ``async_op=False`` must block. Both kinds, mixed in any order,
must complete in the order they were issued *on each group*, because every
member of a group has to see the same sequence of collectives on it. Different
groups must not wait for each other: ranks 0 and 1 may run an async call on
group A and then a blocking one on B while ranks 2 and 3 do B then A, and
torch completes that. So each group gets its own lane: a FIFO queue and a
thread. A blocking call runs inline in the caller when its lane is idle (no
thread hop on the fast path) and otherwise queues behind the earlier work.

An async call that is waited for before the lane's thread has started it is
*claimed*: ``wait()`` runs it on the waiting thread, if it is the oldest call
of its lane not yet started and nothing of the lane is running (so calls still
start in issue order, one at a time). Without it, ``h = all_reduce(x,
async_op=True); h.wait()`` paid two thread hand-offs (the lane's thread runs
the call, then wakes the waiter), each of which may wait for a core and the
GIL when ranks share few cores: 1.12-1.22x a blocking call (4-byte all_reduce,
2 ranks on 2 shared cores, interleaved runs), and 0.85-1.03x with the claim.
The lane's thread is still woken for every queued call (nobody may ever wait
for it), and sometimes starts the call before its waiter can claim it (about a
fifth of the time in those runs), so a call known to be waited at once is best
issued blocking: the torch backend does so, from torch's ``opts.asyncOp``
(with the claim alone a blocking ``dist.all_reduce`` stayed at 1.3-1.75x our
blocking call in the same runs; issued blocking, 1.06-1.21x).

Each lane also numbers its calls (0, 1, 2, ...): the door puts that number in
every message's tag, so a message of call 5 can never complete a receive of
call 6 (``p2p_communications``).

Two situations that hang a naive engine are handled here:

* a callback on ``work.get_future().then(cb)`` runs on whichever thread ran
  the work (the lane's, or a waiter's that claimed it), after the work has left
  the lane free; if it issues a collective on the same group and waits for it,
  it does not wait for itself: on a waiter's thread the call is claimed or run
  by the lane's thread as any other; on the lane's thread, which nobody else
  would come to relieve, the call runs right there, after any calls queued
  before it (in issue order, as every rank must run them);
* the program exits (or destroys the process group) with async work nobody
  waited for: at exit the lanes are drained first, with one warning, so no
  thread is inside the transport while the interpreter tears it down.

The heavy parts of a collective (socket I/O, ``torch.add`` on large buffers)
release the GIL, so the caller's computation really overlaps.
"""
import atexit
import collections
import datetime
import sys
import threading
import weakref

import torch


def wait_for(done, timeout, description):
    """Wait on the event ``done``, bounded by ``timeout`` (seconds or a timedelta; None, 0 or less:
    no bound): the one bounded wait behind every handle's ``wait(timeout=...)``, ours and the
    torch backend's. Raises TimeoutError naming ``description``."""
    if isinstance(timeout, datetime.timedelta):
        timeout = timeout.total_seconds()
    if not done.wait(timeout if timeout and timeout > 0 else None):
        raise TimeoutError(f"{description} did not finish within {timeout:g} s (wait(timeout=...))")


def bounded(timeout):
    """Whether ``timeout`` (as :func:`wait_for` takes it) bounds a wait."""
    if isinstance(timeout, datetime.timedelta):
        timeout = timeout.total_seconds()
    return bool(timeout and timeout > 0)


class Work:
    """Handle of an asynchronous collective, like torch's ``Work``.

    ``wait()`` blocks until the collective has finished and re-raises its
    error, if any; ``is_completed()`` asks without blocking; ``get_future()``
    gives a ``torch.futures.Future`` whose value is the list of output tensors,
    as torch's is (what DDP communication hooks return).
    """

    def __init__(self, description):
        self.description = description
        self._done = threading.Event()
        self._error = None
        self._result = None
        self._futures = []
        self._lock = threading.Lock()
        self._job = None        # while queued and not started: what claim() may run here

    def wait(self, timeout=None):
        """Block until done; ``timeout`` (seconds or a timedelta) bounds the wait.

        An unbounded wait first claims the call (runs it on this thread) if it is next on
        its lane; a bounded one never does, as a claimed call runs to its end (or to the
        group's timeout), which may be later than ``timeout``."""
        if not bounded(timeout):
            self.claim()
        wait_for(self._done, timeout, self.description)
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self):
        return self._done.is_set()

    def is_success(self):
        return self._done.is_set() and self._error is None

    def exception(self):
        return self._error

    def claim(self):
        """Run the call on this thread now, if it is queued, not started, and next on its lane
        with nothing of the lane running; True if it ran here. (The torch backend's handle
        calls this from its own ``wait``.)"""
        job = self._job
        return job is not None and job.lane.claim(job)

    def result(self):
        """The output tensors (a list), as ``get_future().value()`` gives them."""
        self.wait()
        return self._result

    def get_future(self):
        fut = torch.futures.Future()
        with self._lock:
            if not self._done.is_set():
                self._futures.append(fut)
                return fut
        self._complete_future(fut)
        return fut

    def _complete_future(self, fut):
        if self._error is not None:
            fut.set_exception(self._error)
        else:
            fut.set_result(self._result if self._result is not None else [])

    def _finish(self, result=None, error=None):
        with self._lock:
            self._result, self._error = result, error
            self._done.set()
            futures, self._futures = self._futures, []
        for fut in futures:
            self._complete_future(fut)

    def __repr__(self):
        state = "done" if self.is_completed() else "pending"
        return f"<collectives.Work {self.description} {state}>"


class _Job:
    """One queued call: ``fn(seq)``, and the handle it finishes."""
    __slots__ = ("lane", "fn", "seq", "work", "taken")

    def __init__(self, lane, fn, seq, work):
        self.lane, self.fn, self.seq, self.work = lane, fn, seq, work
        self.taken = False      # started, by the lane's thread or a waiter (set under lane.state)


class _Lane:
    """The queue, the thread and the call counter of one group."""

    def __init__(self, key, owner=None, on_collected=None):
        self.key = key
        # the group's transport, weakly: a lane outlives neither its group nor a new group
        # that reuses the key (destroy_process_group, then init_process_group again)
        self.owner = None if owner is None else weakref.ref(owner, on_collected)
        self.run_lock = threading.Lock()    # held while one of this group's collectives runs
        # guards everything below; notified when a call finishes (drain waits on it)
        lock = threading.RLock()
        self.state = threading.Condition(lock)
        # the same lock, notified only when the lane's thread may have a job to start (one is
        # queued with nothing running, or the lane retires): apart from ``state``, so that
        # a call run by its caller never wakes the lane's thread for nothing, which costs
        # as much as the call's own thread hand-offs did
        self.ready = threading.Condition(lock)
        self.pending = 0                    # issued and not yet finished
        self.running = 0                    # started and not yet returned (inside run_lock or waiting for it)
        self.seq = 0                        # calls issued on this group so far
        self.helping = 0                    # 0 or 1: the lane's thread, waiting in claim()
        # Queued and not started, in seq order. Whoever starts a job (this lane's thread or a
        # claiming waiter) pops it here, under ``state``, and counts it in ``running`` in the
        # same step: a job is never started twice, and jobs start in seq order.
        self.jobs = collections.deque()
        self.retired = False
        self.thread = None

    def loop(self):
        while True:
            with self.state:
                self.ready.wait_for(lambda: (self.jobs and not self.running) or
                                    (self.retired and not self.jobs))
                if not self.jobs:   # retired (the group was destroyed) and nothing left: the thread ends
                    return
                job = self.take()
            self.run(job)
            # Drop the job while idle: its closure holds the process group, and a group kept
            # alive here past destroy_process_group() is torn down at interpreter exit with
            # gloo's threads still running (SIGABRT).
            job = None

    def take(self):
        """Pop the next job and count it running; the caller holds ``state``."""
        self.running += 1
        job = self.jobs.popleft()
        job.taken = True
        return job

    def claim(self, job):
        """Run ``job`` on the calling thread if it is next and nothing of this lane runs; True
        if it ran here. Issue order is kept: the lane's thread would have started it next
        anyway. (A thread inside one of this lane's jobs never finds ``running`` at 0.)

        The lane's own thread gets here only from a future's callback (between two jobs),
        waiting for a call of this group. It must not wait for itself, so it runs the jobs
        queued before ``job`` and then ``job``, in order, as its loop would have."""
        if threading.current_thread() is not self.thread:
            with self.state:
                if job.taken or self.running or self.jobs[0] is not job:
                    return False
                self.take()
            self.run(job)
            return True
        while True:
            with self.state:
                self.helping += 1
                try:    # running may be a waiter's claim: it notifies when it stops
                    self.ready.wait_for(lambda: job.taken or (self.jobs and not self.running))
                finally:
                    self.helping -= 1
                if job.taken:
                    return False
                head = self.take()
            self.run(head)
            if head is job:
                return True

    def run(self, job):
        """Run a taken job and finish its handle."""
        fn, seq, work = job.fn, job.seq, job.work
        job.fn = job.work = work._job = None
        result = error = None
        try:
            with self.run_lock:
                result = fn(seq)
        except BaseException as exc:  # handed to whoever waits on the handle
            error = exc
        finally:
            fn = None
            self.stopped_running()
        # futures' callbacks run here, with the lane free: a blocking collective they issue on
        # this group runs inline or is claimed (see submit), instead of waiting for this job
        try:
            work._finish(result=result, error=error)
        finally:
            self.done_one()

    def stopped_running(self):
        with self.state:
            self.running -= 1
            if self.jobs or self.helping:
                self.ready.notify_all()

    def done_one(self):
        with self.state:
            self.pending -= 1
            self.state.notify_all()

    def drain(self, timeout=None):
        with self.state:
            return self.state.wait_for(lambda: self.pending == 0, timeout)

    def belongs_to(self, owner):
        return self.owner is None if owner is None else (self.owner is not None and self.owner() is owner)

    def retire(self):
        """End the thread once the work queued before this has started (it is never reused)."""
        with self.state:
            self.retired = True
            self.ready.notify_all()


class Engine:
    """The lanes of this process, one per group key (see :func:`engine`)."""

    def __init__(self):
        self._lanes = {}
        # reentrant: a lane's weakref callback (its group collected) may run inside any
        # allocation, also one made while this thread holds the lock
        self._lock = threading.RLock()
        self._exit_hook = False

    def _lane(self, key, owner=None):
        lane = self._lanes.get(key)
        if lane is not None and lane.belongs_to(owner):
            return lane
        with self._lock:
            lane = self._lanes.get(key)
            if lane is None or not lane.belongs_to(owner):
                if lane is not None:   # a new group under an old key: numbered from 0 again
                    lane.retire()
                lane = self._lanes[key] = _Lane(key, owner, self._collected(key))
            return lane

    def _collected(self, key):
        """The weakref callback of a lane's group: its thread ends when the group is gone."""
        def collected(ref):
            with self._lock:
                lane = self._lanes.get(key)
                if lane is not None and lane.owner is ref:
                    del self._lanes[key]
                else:
                    lane = None
            if lane is not None:
                lane.retire()
        return collected

    def close(self, key, timeout=None):
        """Finish group ``key``'s work (only its own), end its thread and forget its call numbers:
        what destroying the group does. False if ``timeout`` ran out first."""
        with self._lock:
            lane = self._lanes.pop(key, None)
        if lane is None:
            return True
        finished = lane.drain(timeout) if threading.current_thread() is not lane.thread else True
        lane.retire()
        return finished

    def submit(self, fn, description, async_op, key="", owner=None):
        """Run ``fn(seq)`` after all earlier work on group ``key``; ``seq`` numbers the call.

        Async: return a :class:`Work`. Blocking: return ``fn``'s result. ``owner``: the
        group's transport; a lane is never shared by two groups that use the same key.

        Called from the lane's own thread (a future's callback issuing a collective on its
        group), the call runs right there, async or not, after the calls queued before it:
        left in the queue, it would wait for the very thread that waits for it.
        """
        lane = self._lane(key, owner)
        started = False
        with lane.state:
            seq = lane.seq
            lane.seq += 1
            lane.pending += 1
            inline = not async_op and not lane.jobs and not lane.running
            if inline:
                lane.running += 1
            else:
                # queued under the lock that numbered it: the queue's order is seq order
                work = Work(description)
                work._job = _Job(lane, fn, seq, work)
                lane.jobs.append(work._job)
                if lane.thread is None:
                    lane.thread = threading.Thread(target=lane.loop, daemon=True,
                                                   name=f"collectives-comm[{key or 'world'}]")
                    lane.thread.start()
                    started = True
                if not lane.running:    # else the running call's end notifies
                    lane.ready.notify_all()
        if started:
            self._register_exit_hook()
        if inline:
            try:
                with lane.run_lock:
                    return fn(seq)
            finally:
                lane.stopped_running()
                lane.done_one()
        if threading.current_thread() is lane.thread:
            work.claim()    # a callback's call: run now, after the earlier ones (see claim)
        if async_op:
            return work
        work.wait()     # claimed here if the lane became free meanwhile
        return work._result

    def pending(self):
        with self._lock:
            lanes = list(self._lanes.values())
        return sum(lane.pending for lane in lanes)

    def drain(self, timeout=None):
        """Block until everything issued so far has finished; False if ``timeout`` ran out."""
        with self._lock:
            lanes = list(self._lanes.values())
        return all(lane.drain(timeout) for lane in lanes)

    def _register_exit_hook(self):
        with self._lock:
            if not self._exit_hook:
                self._exit_hook = True
                # registered after init_process_group, so it runs before torch's own exit hooks
                atexit.register(self._finish_at_exit)

    def _finish_at_exit(self):
        left = self.pending()
        if not left:
            return
        print(f"collectives: warning: {left} asynchronous collective(s) were never waited for; "
              f"finishing them before exit (call .wait() on the handles to avoid this)",
              file=sys.stderr, flush=True)
        # Each wait inside them is bounded by COLLECTIVES_TIMEOUT, so this ends.
        self.drain()


_engine = None
_engine_lock = threading.Lock()


def engine():
    global _engine
    with _engine_lock:
        if _engine is None:
            _engine = Engine()
        return _engine
