"""One set of tuning tables per group, agreed by every member: the same ``algorithm=None``
choice on every rank, whatever each host has measured.

Each rank's automatic choice reads tuning tables: the one measured on its machine (per user,
per host) and the shipped one (or ``COLLECTIVES_TUNING_TABLE``). Across hosts these differ,
and ranks that read different tables can pick different algorithms for the same call: their
messages never pair and the call ends in a ``DesyncError`` after the timeout. So the first
call on a group publishes group rank 0's tables in the group's rendezvous store, and every
member chooses from those (:func:`tables_of`): one store round trip per group and process,
nothing per call after it.

The torch backend also compares ``COLLECTIVES_ALGO`` across the members when it creates a
group (:func:`same_everywhere`): a rank with another value raises one clear error on every rank
at ``init_process_group``/``new_group``, before any collective.
"""
import hashlib
import json
import threading
from datetime import timedelta

from . import tables
from .tables import TABLE_PATH, cache_path, table_path

_KEY = "collectives/tables"


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

    def payload(self):
        return json.dumps({"mine": self.mine, "shipped": self.shipped, "place": self.place,
                           "where": self.where})


def local(rank_name="this machine"):
    """This process's own tables (what the group adopts when this process is group rank 0)."""
    mine = {k: v for k, v in tables.measured_here().items() if k in ("choices", "models", "model")}
    shipped = {k: v for k, v in tables.shipped().items() if k in ("choices", "models", "model")}
    where = f"COLLECTIVES_TUNING_TABLE={table_path()}" if table_path() != TABLE_PATH else \
        f"the shipped table {TABLE_PATH}"
    return Tables(mine, shipped, rank_name, cache_path(), where)


_agreed = {}
_lock = threading.Lock()


def tables_of(info, timeout):
    """The tables every member of the group ``info`` chooses from: group rank 0's.

    The first call on a group in this process publishes them (rank 0) or reads them (the
    others) through the group's store; later calls find them here. Without a store (a
    hand-built group) each rank reads its own.
    """
    key = (info.key, id(info.store))
    found = _agreed.get(key)
    if found is not None:
        return found
    with _lock:
        found = _agreed.get(key)
        if found is None:
            found = _agreed[key] = _agree(info, timeout)
    return found


def _agree(info, timeout):
    first = info.ranks[0]
    if info.store is None or info.size < 2:
        return local()
    name = f"{_KEY}/{info.key}"
    if info.rank == 0:
        mine = local(f"rank {first}'s machine")
        info.store.set(name, mine.payload())
        return mine
    try:
        info.store.wait([name], timedelta(seconds=timeout))
        agreed = json.loads(info.store.get(name))
    except Exception as exc:
        raise TimeoutError(f"collectives: rank {info.ranks[info.rank]} waited {timeout:g} s for the tuning "
                           f"tables of rank {first} (group rank 0 of {list(info.ranks)}), which publishes "
                           f"them at its first call on the group: it has not called yet, or died "
                           f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
    return Tables(agreed["mine"], agreed["shipped"], f"rank {first}'s machine", agreed["place"], agreed["where"])


def forget(key=None):
    """Forget the agreed tables of group ``key`` (all groups when None): its next first call
    agrees again (a group destroyed and created anew may have another rank 0)."""
    with _lock:
        for k in [k for k in _agreed if key is None or k[0] == key]:
            del _agreed[k]


def same_everywhere(store, rank, ranks, what, value, timeout):
    """Raise one ValueError on every member unless all of them hold the same ``value`` (text)
    for setting ``what``; each rank's value goes through ``store`` (a group's own store)."""
    store.set(f"collectives/setting/{what}/{rank}", value)
    keys = [f"collectives/setting/{what}/{r}" for r in range(len(ranks))]
    store.wait(keys, timedelta(seconds=timeout))
    values = [store.get(k).decode() for k in keys]
    if len(set(values)) > 1:
        shown = "\n  ".join(f"rank {g}: {what}={v!r}" for g, v in zip(ranks, values))
        raise ValueError(f"collectives: the ranks of the group {list(ranks)} were started with different "
                         f"{what}, so they would run different algorithms for the same call (and wait for "
                         f"each other until the timeout). Give every rank the same value:\n  {shown}")
