"""What a collective needs to know about the group it runs on, in one small record.

The public functions take what torch.distributed takes (``None`` for the world, or
a group from ``new_group``). The torch backend in :mod:`collectives.backend` runs
the same functions over its own inner transport, which torch.distributed does not
know about. Both become a :class:`GroupInfo`, so validation, the door and the
engine read one shape whoever called them.

This module sits below the backend and never imports it: a group on our backend
is recognised by what it offers (a ``group_info`` attribute), not by its class.
"""
import weakref
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class GroupInfo:
    """A group as the door and the engine see it.

    Attributes:
        transport: has ``send([tensor], peer, tag)`` and ``recv([tensor], peer, tag)``
            taking group ranks (a torch ``ProcessGroup`` or a c10d ``Backend``).
        ranks: global ranks of the members, in group-rank order (for messages,
            traces and errors).
        rank: this process's rank in the group, or -1 if it is not a member.
        backend: the transport's kind, ``"gloo"`` or ``"nccl"``.
        key: names the group identically on every member and uniquely in the process:
            the engine keeps one queue per key, and calls are numbered per key.
        store: a c10d Store every member reaches, used only to explain a timeout
            (which call each rank is in); None if there is none.
        timeout: seconds the group was created with (``init_process_group(timeout=...)``
            on our torch backend), or None: each wait is bounded by it and by
            ``COLLECTIVES_TIMEOUT``, whichever is shorter.
    """
    transport: object
    ranks: tuple
    rank: int
    backend: str
    key: str
    store: object = None
    timeout: Optional[float] = None

    @property
    def size(self):
        return len(self.ranks)

    @property
    def member(self):
        return self.rank >= 0


# per ProcessGroup, weakly (a destroyed group leaves with its entry): what group_info worked
# out for it, which cannot change while the group lives. Working it out asks torch.distributed
# five questions (~9 us), on every call of every collective before this cache. The entry is
# the GroupInfo our backend carries, or its fields less the group itself (a GroupInfo holds
# its group: kept as a value here, it would keep its own key alive)
_found = weakref.WeakKeyDictionary()


def group_info(group, where):
    """The :class:`GroupInfo` for ``group`` (None, a ProcessGroup, or a GroupInfo)."""
    if isinstance(group, GroupInfo):
        return group
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(f"{where}: the default process group is not initialised; "
                         f"call torch.distributed.init_process_group(...) first")
    if group is dist.GroupMember.NON_GROUP_MEMBER:
        # new_group() hands ranks outside the group this marker instead of a group
        return GroupInfo(group, (), -1, "", "", None)
    if group is None:
        group = dist.group.WORLD
    elif not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"{where}: group must be a process group from "
                        f"torch.distributed.new_group(...) or None, got {type(group).__name__}")
    if not _registered(group):
        # torch forgets a destroyed group (and would fail deep inside, or not at all): say so
        raise ValueError(f"{where}: this process group was destroyed "
                         f"(torch.distributed.destroy_process_group); a call needs a live group: "
                         f"make a new one with torch.distributed.new_group(...)")
    try:
        found = _found.get(group)
    except TypeError:            # a group that takes no weak reference: worked out each time
        found = None
    if found is None:
        found = _work_out(group)
        try:
            _found[group] = found
        except TypeError:
            pass
    if isinstance(found, GroupInfo):
        return found
    return GroupInfo(group, *found)


def _registered(group):
    """Whether torch.distributed still knows ``group`` (not destroyed): one dictionary lookup."""
    try:
        return group in dist.distributed_c10d._world.pg_map
    except AttributeError:       # a private table: without it, ask the public way
        try:
            dist.get_process_group_ranks(group)
            return True
        except (KeyError, ValueError, RuntimeError):
            return False


def _work_out(group):
    """The GroupInfo a group on our backend carries, or (ranks, rank, backend, key, store)."""
    me = dist.get_rank()
    ranks = tuple(dist.get_process_group_ranks(group))
    if me not in ranks:
        return ranks, -1, "", "", None
    backend = str(dist.get_backend(group))
    if "collectives" in backend:
        # a group on our torch backend (collectives.backend): run on its inner transport
        # and in its engine lane, so our calls and torch's keep their issue order
        info = group_info_of(group)
        if info is not None:
            return info
    return ranks, ranks.index(me), backend, "pg:" + group.group_name, _default_store()


def group_info_of(group):
    """The :class:`GroupInfo` a ``collectives``-backend group carries, or None.

    On torch 2.11 the group *is* our backend; from 2.15 on it wraps one per device.
    """
    info = getattr(group, "group_info", None)
    if isinstance(info, GroupInfo):
        return info
    try:
        backend = group._get_backend(torch.device("cpu"))
    except Exception:
        return None
    info = getattr(backend, "group_info", None)
    return info if isinstance(info, GroupInfo) else None


def _default_store():
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:  # a private helper: if a torch version lacks it, timeouts say less
        return None
