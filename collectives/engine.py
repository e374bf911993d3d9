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

Each lane also numbers its calls (0, 1, 2, ...): the door puts that number in
every message's tag, so a message of call 5 can never complete a receive of
call 6 (``p2p_communications``).

Two situations that hang a naive engine are handled here:

* a callback on ``work.get_future().then(cb)`` runs on the lane's thread when
  the work finishes; if it issues a blocking collective on the same group, that
  call runs inline right there (the lane is between jobs), instead of queueing
  behind itself forever;
* the program exits (or destroys the process group) with async work nobody
  waited for: at exit the lanes are drained first, with one warning, so no
  thread is inside the transport while the interpreter tears it down.

The heavy parts of a collective (socket I/O, ``torch.add`` on large buffers)
release the GIL, so the caller's computation really overlaps.
"""
import atexit
import datetime
import queue
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

    def wait(self, timeout=None):
        """Block until done; ``timeout`` (seconds or a timedelta) bounds the wait."""
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


class _Lane:
    """The queue, the thread and the call counter of one group."""

    def __init__(self, key, owner=None, on_collected=None):
        self.key = key
        # the group's transport, weakly: a lane outlives neither its group nor a new group
        # that reuses the key (destroy_process_group, then init_process_group again)
        self.owner = None if owner is None else weakref.ref(owner, on_collected)
        self.run_lock = threading.Lock()    # held while one of this group's collectives runs
        self.state = threading.Condition()
        self.pending = 0                    # issued and not yet finished
        self.seq = 0                        # calls issued on this group so far
        self.queue = queue.SimpleQueue()
        self.thread = None

    def loop(self):
        while True:
            fn, seq, work = self.queue.get()
            if fn is None:      # retired (the group was destroyed): the thread ends
                return
            try:
                with self.run_lock:
                    result = fn(seq)
            except BaseException as exc:  # handed to whoever waits on the handle
                work._finish(error=exc)
            else:
                # futures' callbacks run here, outside run_lock: a blocking
                # collective they issue on this group runs inline (see submit)
                work._finish(result=result)
            finally:
                # Drop the job while idle: its closure holds the process group, and a
                # group kept alive here past destroy_process_group() is torn down at
                # interpreter exit with gloo's threads still running (SIGABRT).
                fn = work = result = None
                self.done_one()

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
        """End the thread once the work queued before this has run (it is never reused)."""
        with self.state:
            if self.thread is not None:
                self.queue.put((None, None, None))


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
        group), the call runs right there, async or not: queued, it would wait for the very
        thread that waits for it.
        """
        lane = self._lane(key, owner)
        on_lane_thread = threading.current_thread() is lane.thread
        with lane.state:
            seq = lane.seq
            lane.seq += 1
            inline = on_lane_thread or (not async_op and lane.pending == 0)
            lane.pending += 1
        if inline and async_op:
            work = Work(description)
            try:
                with lane.run_lock:
                    result = fn(seq)
            except BaseException as exc:
                work._finish(error=exc)
            else:
                work._finish(result=result)
            finally:
                lane.done_one()
            return work
        if inline:
            try:
                with lane.run_lock:
                    return fn(seq)
            finally:
                lane.done_one()
        work = Work(description)
        with lane.state:
            started = lane.thread is None
            if started:
                lane.thread = threading.Thread(target=lane.loop, daemon=True,
                                               name=f"collectives-comm[{key or 'world'}]")
                lane.thread.start()
        if started:
            # after the lane's lock is let go: the engine's lock is taken first, the lane's
            # second everywhere else (_lane retiring a lane, a collected group's callback)
            self._register_exit_hook()
        lane.queue.put((fn, seq, work))
        if async_op:
            return work
        work.wait()
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
        print(f"collectives: warning: {left} asynchronous call(s) (collectives, isend, irecv) were never waited for; "
              f"finishing them before exit (call .wait() on the handles to avoid this)",
              file=sys.stderr, flush=True)
        # Each wait inside them is bounded by COLLECTIVES_TIMEOUT, so this ends.
        self.drain()


_engine = None
_engine_lock = threading.Lock()


def finish_at_exit():
    """What the exit hook does, for a process that ends without running exit hooks: a rank
    forked by multiprocessing ends with ``os._exit``, and calls it left unwaited would be lost
    (a peer then waits for a message that never comes)."""
    with _engine_lock:
        current = _engine
    if current is not None:
        current._finish_at_exit()


def engine():
    global _engine
    with _engine_lock:
        if _engine is None:
            _engine = Engine()
        return _engine
