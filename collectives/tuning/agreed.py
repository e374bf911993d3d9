"""One agreement per group, over the group's own messages: the same ``algorithm=None``
choice, the same settings and the same map of hosts on every rank.

Each rank's automatic choice reads tuning tables: the one measured on its machine (per user,
per host) and the shipped one (or ``COLLECTIVES_TUNING_TABLE``). Across hosts these differ,
and ranks that read different tables can pick different algorithms for the same call: their
messages never pair and the call ends in a ``DesyncError`` after the timeout. Likewise a rank
started with another ``COLLECTIVES_ALGO`` would run another algorithm for the same call.

So once per group every member takes part in one small exchange through the door, the same
point-to-point messages every collective is built from (:func:`agree`):

1. every rank sends group rank 0 its *identity*: the settings that must be equal everywhere
   (``COLLECTIVES_ALGO`` on the torch backend) and its host (:func:`host_identity`);
2. group rank 0 answers everyone with the *agreement*: its own tuning tables and every
   rank's identity (a binomial-tree broadcast of its length, then of its bytes);
3. every rank checks the settings in the agreement: one ``ValueError``, the same on every
   rank, if any two differ.

The torch backend agrees when a group is created (``init_process_group``/``new_group``:
creating a group is collective, so every member is there); a group that the public
functions use directly agrees at its first call, whatever that call is. After that nothing
is exchanged per call. ``N - 1`` messages of 4 KiB and two broadcasts, once.

No Store is touched on this path (nor anywhere a collective runs): the rendezvous Store is
for ``init_process_group`` and, after a timeout has happened, for explaining it
(:mod:`collectives.desync`), where a peer may be gone and messages cannot ask it.
"""
import hashlib
import json
import os
import socket
import threading
import weakref

import torch

from ..algorithms.broadcast_binomial_tree import broadcast
from . import tables
from .tables import TABLE_PATH, cache_path, table_path

IDENTITY_BYTES = 4096          # one rank's identity, padded: rank 0 knows every size in advance
_IDENTITY_STEP, _LENGTH_STEP, _BODY_STEP = 0, 1, 100


class Tables:
    """The tables a group's automatic choice reads (hashable by content, for the choice's cache)."""

    def __init__(self, mine, shipped, whose, place, where):
        self.mine, self.shipped = mine, shipped
        self.whose, self.place, self.where = whose, place, where
        self.digest = hashlib.sha1(json.dumps([mine, shipped], sort_keys=True).encode()).hexdigest()

    def __eq__(self, other):
        return isinstance(other, Tables) and (self.digest, self.whose, self.where) == \
            (other.digest, other.whose, other.where)

    def __hash__(self):
        return hash(self.digest)

    def fields(self):
        return {"mine": self.mine, "shipped": self.shipped, "place": self.place, "where": self.where}


def local(rank_name="this machine"):
    """This process's own tables (what the group adopts when this process is group rank 0)."""
    mine = {k: v for k, v in tables.measured_here().items() if k in ("choices", "models", "model")}
    shipped = {k: v for k, v in tables.shipped().items() if k in ("choices", "models", "model")}
    where = f"COLLECTIVES_TUNING_TABLE={table_path()}" if table_path() != TABLE_PATH else \
        f"the shipped table {TABLE_PATH}"
    return Tables(mine, shipped, rank_name, cache_path(), where)


def host_identity():
    """What tells two processes apart as hosts: the host name, the network namespace (a lab
    host is a namespace on one machine) and the ``/dev/shm`` they see (shared memory is only
    shared where that is the same file system)."""
    parts = [socket.gethostname()]
    for path in ("/proc/self/ns/net", "/dev/shm"):
        try:
            st = os.stat(path)
            parts.append(f"{st.st_dev}:{st.st_ino}")
        except OSError:
            parts.append("-")
    return "/".join(parts)


class Agreement:
    """What every member of a group agreed on, the same object on every rank.

    Attributes:
        tables: group rank 0's :class:`Tables` (what ``algorithm=None`` chooses from).
        settings: per group rank, the settings it was started with (``{name: text}``).
        hosts: per group rank, a host number (0, 1, ...: in order of first appearance):
            ranks with the same number share a host and its memory.
        local_pids: per group rank, its process id where it shares this rank's host, else None.
    """

    def __init__(self, tables_, settings, hosts, pids=None, me=None):
        self.tables, self.settings, self.hosts = tables_, settings, tuple(hosts)
        # the pids of the ranks on this rank's host (None elsewhere): a dead one is seen at once
        self.local_pids = tuple(p if me is not None and h == hosts[me] else None
                                for h, p in zip(hosts, pids or [None] * len(hosts)))


def _host_numbers(identities):
    seen = {}
    return [seen.setdefault(i, len(seen)) for i in identities]


def _pack(obj, device, size=None):
    raw = json.dumps(obj, sort_keys=True).encode()
    if size is not None and len(raw) > size:
        raise ValueError(f"collectives: a group's agreement entry is {len(raw)} bytes, over {size}")
    buf = torch.zeros(size or len(raw), dtype=torch.uint8, device="cpu")
    if raw:
        buf[:len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    return buf.to(device)


def _unpack(buf):
    return json.loads(bytes(buf.cpu().tolist()).rstrip(b"\0").decode())


def _identity(settings):
    shown = {k: (v if len(v) <= 1000 else v[:1000] + "... sha1 " + hashlib.sha1(v.encode()).hexdigest())
             for k, v in settings.items()}
    return {"settings": shown, "host": host_identity(), "pid": os.getpid()}


def agree(comm, settings=None):
    """The group's :class:`Agreement`, exchanged over ``comm`` (a door on the whole group).

    ``settings``: ``{name: text}`` that must be equal on every member (compared here: a
    ``ValueError`` naming each rank's value, raised on every rank alike).
    """
    n, me = comm.size, comm.rank
    # explicit devices: a program may have set torch's default device to a GPU, and an NCCL
    # group sends GPU memory only
    device = torch.device("cuda", torch.cuda.current_device()) if comm.nccl else torch.device("cpu")
    mine = _pack(_identity(settings or {}), device, IDENTITY_BYTES)
    if me == 0:
        boxes = {p: torch.empty(IDENTITY_BYTES, dtype=torch.uint8, device=device) for p in range(1, n)}
        comm.exchange(_IDENTITY_STEP, recvs=[(b, p) for p, b in boxes.items()])
        identities = [_unpack(mine)] + [_unpack(boxes[p]) for p in range(1, n)]
        first = comm.ranks[0]
        body = _pack({"tables": local(f"rank {first}'s machine").fields(), "identities": identities,
                      "whose": f"rank {first}'s machine"}, device)
        length = torch.tensor([body.numel()], dtype=torch.int64, device=device)
    else:
        comm.exchange(_IDENTITY_STEP, sends=[(mine, 0)])
        length = torch.zeros(1, dtype=torch.int64, device=device)
    broadcast(comm, length, 0, step0=_LENGTH_STEP)
    if me != 0:
        body = torch.empty(int(length.item()), dtype=torch.uint8, device=device)
    broadcast(comm, body, 0, step0=_BODY_STEP)
    agreed = _unpack(body)
    _check_settings(comm.ranks, [i["settings"] for i in agreed["identities"]])
    t = agreed["tables"]
    return Agreement(Tables(t["mine"], t["shipped"], agreed["whose"], t["place"], t["where"]),
                     [i["settings"] for i in agreed["identities"]],
                     _host_numbers([i["host"] for i in agreed["identities"]]),
                     [i.get("pid") for i in agreed["identities"]], me)


def _check_settings(ranks, each):
    names = sorted({k for s in each for k in s})
    for what in names:
        values = [s.get(what, "") for s in each]
        if len(set(values)) > 1:
            shown = "\n  ".join(f"rank {g}: {what}={v!r}" for g, v in zip(ranks, values))
            raise ValueError(f"collectives: the ranks of the group {list(ranks)} were started with different "
                             f"{what}, so they would run different algorithms for the same call (and wait "
                             f"for each other until the timeout). Give every rank the same value:\n  {shown}")


# A group's agreement, by the group's key, with the transport it was made on: a group destroyed
# and created anew under the same key (a new transport) agrees again.
_agreed = {}
_locks = {}
_lock = threading.Lock()


def _owner_ref(transport):
    try:
        return weakref.ref(transport)
    except TypeError:
        return lambda: transport


def known(info):
    """The agreement of the group ``info`` made in this process, or None."""
    found = _agreed.get(info.key)
    if found is not None and found[0]() is info.transport:
        return found[1]
    return None


def of(info, make_comm, settings=None):
    """The agreement of the group ``info``: the one made before, or a new one, made over the
    door ``make_comm()`` returns (every member calls this at the same point: its first call
    on the group, or the group's creation)."""
    found = known(info)
    if found is not None:
        return found
    with _lock:   # one lock per group: two groups agree at once without waiting for each other
        lock = _locks.setdefault(info.key, threading.Lock())
    with lock:
        found = known(info)
        if found is None:
            found = agree(make_comm(), settings)
            _agreed[info.key] = (_owner_ref(info.transport), found)
    return found


def tables_of(info):
    """The tables every member of ``info`` chooses from: group rank 0's, once agreed; this
    process's own before that (a group of one, or a choice made outside a call)."""
    found = known(info)
    return found.tables if found is not None else local()


def forget(key=None):
    """Forget the agreement of group ``key`` (all groups when None)."""
    with _lock:
        for k in [k for k in _agreed if key is None or k == key]:
            del _agreed[k]
