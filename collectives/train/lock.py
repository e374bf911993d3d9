"""One training per ``--out``: a ``flock``ed lock file that names its owner; stale locks taken over atomically."""
import contextlib
import fcntl
import json
import os
import socket
import sys

from ..shm import alive
from ..tools.launch import SetupError
from .checkpoint import cannot_write, remove_partial_writes


class Lock:
    """A held ``train.lock``: its path and the open file whose ``flock`` holds it."""

    def __init__(self, path, fd):
        self.path, self.fd = path, fd


def acquire_lock(out):
    """Make this process the only training writing to ``out``; return the held :class:`Lock`.

    The lock is an exclusive ``flock`` on ``out/train.lock``, which also holds the
    owner's pid and host for the message a second training gets. The kernel drops
    the ``flock`` when its owner dies, so a stale lock is taken over by whoever locks
    the file next, atomically: a check-then-remove-then-create let two trainings
    restarted together both hold one ``out`` (4 of 50 trials).

    Raises:
        SetupError: another live training holds ``out``; the message names it.
    """
    path = os.path.join(out, "train.lock")
    try:
        os.makedirs(out, exist_ok=True)
        return _take(out, path)
    except OSError as exc:   # a read-only or full --out: said in one line, before any rank starts
        raise cannot_write(path, exc) from None


def _owner(fd):
    try:
        return json.loads(os.pread(fd, 65536, 0) or b"{}")
    except ValueError:
        return {}


def _in_use(out, path, owner):
    who = (f"pid {owner.get('pid')} on {owner.get('host')}: {owner.get('command', '?')}" if owner
           else "it is starting now")
    return SetupError(f"{out} is in use by another training ({who}). Give another --out, or wait "
                      f"for it; if no such training runs, delete {path}.")


def _take(out, path):
    mine = {"pid": os.getpid(), "host": socket.gethostname(), "command": " ".join(sys.argv)}
    for _ in range(3):
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _owner(fd)
            os.close(fd)
            raise _in_use(out, path, owner) from None
        except BaseException:
            os.close(fd)
            raise
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if not same:        # its holder released it (removed the file) between our open and our lock
            os.close(fd)
            continue
        owner = _owner(fd)
        if owner and owner.get("pid") != mine["pid"]:
            # A lock file whose writer holds no flock: a training on this host still alive
            # (one started before locks were flocks, or a file system without flock) keeps it.
            if owner.get("host") == mine["host"] and alive(owner.get("pid", -1)):
                os.close(fd)
                raise _in_use(out, path, owner)
            print(f"collectives.train: taking over a stale lock in {out} (pid {owner.get('pid')} "
                  f"is no longer running)", flush=True)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(mine).encode(), 0)
        remove_partial_writes(out)
        return Lock(path, fd)
    raise SetupError(f"could not take the lock {path}; is another training starting?")


def release_lock(lock):
    """Give ``out`` back: the file is removed while still locked, so no one locks a file on its way out."""
    with contextlib.suppress(FileNotFoundError):
        os.remove(lock.path)
    os.close(lock.fd)
