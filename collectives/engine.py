"""One communication thread per process, running collectives in issue order.

``async_op=True`` must return at once and let the caller compute while the
messages move; ``async_op=False`` must block. Both kinds, mixed in any order,
must complete in the order they were issued, because every rank of a group has
to see the same sequence of collectives. A single FIFO worker thread gives all
of that: async calls are queued and return a :class:`Work` handle; a blocking
call runs inline when nothing is queued (no thread hop on the fast path) and
otherwise queues behind the earlier work and waits for its own turn.

The heavy parts of a collective (socket I/O, ``torch.add`` on large buffers)
release the GIL, so the caller's computation really overlaps.
"""
import datetime
import queue
import threading

import torch


class Work:
    """Handle of an asynchronous collective, like torch's ``Work``.

    ``wait()`` blocks until the collective has finished and re-raises its
    error, if any; ``is_completed()`` asks without blocking; ``get_future()``
    gives a ``torch.futures.Future`` (what DDP communication hooks return).
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
        if isinstance(timeout, datetime.timedelta):
            timeout = timeout.total_seconds()
        if not self._done.wait(timeout if timeout else None):
            raise TimeoutError(f"{self.description} did not finish within {timeout:g} s")
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
            fut.set_result(self._result)

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


class Engine:
    """The FIFO runner. One per process (see :func:`engine`)."""

    def __init__(self):
        self._run_lock = threading.Lock()    # held while any collective runs
        self._state = threading.Condition()
        self._pending = 0                    # issued and not yet finished
        self._queue = queue.SimpleQueue()
        self._thread = None

    def submit(self, fn, description, async_op):
        """Run ``fn()`` after all earlier work. Async: return a Work; else: fn's result."""
        if not async_op:
            with self._state:
                inline = self._pending == 0
                self._pending += 1 if inline else 0
            if inline:
                try:
                    with self._run_lock:
                        return fn()
                finally:
                    self._done_one()
        work = Work(description)
        with self._state:
            self._pending += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="collectives-comm", daemon=True)
                self._thread.start()
        self._queue.put((fn, work))
        if async_op:
            return work
        work.wait()
        return work._result

    def _done_one(self):
        with self._state:
            self._pending -= 1
            self._state.notify_all()

    def _loop(self):
        while True:
            fn, work = self._queue.get()
            try:
                with self._run_lock:
                    result = fn()
            except BaseException as exc:  # handed to whoever waits on the handle
                work._finish(error=exc)
            else:
                work._finish(result=result)
            finally:
                # Drop the job while idle: its closure holds the process group, and a
                # group kept alive here past destroy_process_group() is torn down at
                # interpreter exit with gloo's threads still running (SIGABRT).
                fn = work = result = None
                self._done_one()

    def drain(self):
        """Block until everything issued so far has finished."""
        with self._state:
            while self._pending:
                self._state.wait()


_engine = None
_engine_lock = threading.Lock()


def engine():
    global _engine
    with _engine_lock:
        if _engine is None:
            _engine = Engine()
        return _engine
