"""One training per ``--out``: a lock file that names its owner, and stale locks taken over."""
import contextlib
import json
import os
import socket
import sys

from ..tools.launch import SetupError
from .checkpoint import cannot_write, remove_partial_writes


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def acquire_lock(out):
    """Make this process the only training writing to ``out``; return the lock's path.

    The lock file holds the owner's pid and host. A lock whose owner is dead
    (same host, no such pid) is stale and taken over.

    Raises:
        SetupError: another live training holds ``out``; the message names it.
    """
    path = os.path.join(out, "train.lock")
    try:
        os.makedirs(out, exist_ok=True)
        return _take(out, path)
    except OSError as exc:   # a read-only or full --out: said in one line, before any rank starts
        raise cannot_write(path, exc) from None


def _take(out, path):
    mine = {"pid": os.getpid(), "host": socket.gethostname(), "command": " ".join(sys.argv)}
    for _ in range(3):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                with open(path) as f:
                    owner = json.load(f)
            except (OSError, ValueError):
                owner = {}
            if owner.get("host") != mine["host"] or _alive(owner.get("pid", -1)):
                raise SetupError(
                    f"{out} is in use by another training (pid {owner.get('pid')} on "
                    f"{owner.get('host')}: {owner.get('command', '?')}). Give another --out, or wait "
                    f"for it; if no such training runs, delete {path}.") from None
            print(f"collectives.train: taking over a stale lock in {out} (pid {owner.get('pid')} "
                  f"is no longer running)", flush=True)
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
            continue
        with os.fdopen(fd, "w") as f:
            json.dump(mine, f)
        remove_partial_writes(out)
        return path
    raise SetupError(f"could not take the lock {path}; is another training starting?")


def release_lock(path):
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)
