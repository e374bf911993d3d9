"""Every ``COLLECTIVES_*`` environment variable, read here and nowhere else.

Each setting is one function: it reads its variable when called (so a test or a
launcher can change the environment between calls), checks the value, and raises
``ValueError`` naming the variable, the value and what is accepted. ``VARIABLES``
lists them with their defaults and meaning; README's table of variables is
checked against it (``tests/test_layers.py``).

Callers that run per message read a setting once per call, not per message. A lookup reads
``os.environ``'s own dictionary (0.1-0.3 us; ``os.environ.get`` encodes the name first, 2 us).
"""
import math
import os

from .algorithms import ALGORITHMS

DEFAULT_TIMEOUT = 300.0
MAX_TIMEOUT = 7 * 24 * 3600.0   # a week: beyond it a timedelta wait is no longer a bound anyone means

# name -> (default as README states it, what it does)
VARIABLES = {
    "COLLECTIVES_TIMEOUT": ("300", "seconds any rank waits for a peer"),
    "COLLECTIVES_DEBUG": ("0", "exchange a fingerprint of each call before any data moves"),
    "COLLECTIVES_VERBOSE": ("0", "print every message as it moves"),
    "COLLECTIVES_ALGO": ("", "algorithms per collective, e.g. all_reduce:ring,broadcast:binomial_tree"),
    "COLLECTIVES_TUNING_TABLE": ("", "a tuning table algorithm=None reads instead of this machine's"),
    "COLLECTIVES_TRANSPORT": ("auto", "gloo, shm or auto: how ranks on one host exchange messages"),
    "COLLECTIVES_SHM_DIRECT_MIN": ("auto", "shared memory: messages this large are read from the sender, one copy (off: never; auto: 4M where ranks outnumber cores, else off)"),
    "COLLECTIVES_GLOO_BATCH": ("1", "gloo's socket threads never preempt the thread they wake (SCHED_BATCH)"),
    "COLLECTIVES_DATA": ("./data", "where MNIST lives (a folder with MNIST/raw/*.gz)"),
    "COLLECTIVES_CACHE": ("~/.cache/collectives", "where MNIST from a read-only folder is unpacked"),
    "COLLECTIVES_TRACE_DIR": ("./collectives_trace", "where each rank's flight recorder is dumped (torch's format)"),
    "COLLECTIVES_DUMP_ON_TIMEOUT": ("0", "on a timeout every rank dumps its flight recorder"),
    "COLLECTIVES_TRACE_BUFFER": ("2000", "calls each rank's flight recorder keeps"),
    "LOCAL_WORLD_SIZE": ("", "ranks per host (torchrun sets it): the layout the hierarchical all_reduce uses"),
    "COLLECTIVES_LAB_LAYOUT": ("", "set by --lab: the lab host of every rank, e.g. 0,0,1,1"),
    "COLLECTIVES_LAB_RATE": ("", "set by --lab: each lab link's rate in bits per second, one way"),
}


# ``os.environ`` keeps its variables in ``_data``, keyed by the encoded name: read there, a
# lookup costs 0.1 us instead of 2 (``os.environ.get`` encodes the name on every call), and a
# call reads about six settings. ``os.environ[...] = ...``, ``del`` and ``putenv`` through it
# all write ``_data``, so nothing is missed. Elsewhere (no ``_data``) the plain lookup.
_DATA = getattr(os.environ, "_data", None)
_ENCODE = getattr(os.environ, "encodekey", None)
_DECODE = getattr(os.environ, "decodevalue", None)
if not (isinstance(_DATA, dict) and callable(_ENCODE) and callable(_DECODE)):
    _DATA = None
_KEYS = {}


def _raw(name):
    if _DATA is None:
        value = os.environ.get(name)
    else:
        key = _KEYS.get(name)
        if key is None:
            key = _KEYS[name] = _ENCODE(name)
        value = _DATA.get(key)
        if value is not None:
            value = _DECODE(value)
    return value if value is not None and value.strip() else None


def _flag(name):
    value = _raw(name)
    if value is None:
        return False
    value = value.strip().lower()
    if value in ("0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise ValueError(f"{name}={os.environ[name]!r} is not valid: use 1 (on) or 0 (off); unset, it is 0")


def timeout_seconds():
    """The per-wait limit in seconds, ``COLLECTIVES_TIMEOUT`` (default 300).

    Raises ValueError naming the variable and the accepted range for anything
    that is not a finite number of seconds in (0, one week].
    """
    value = _raw("COLLECTIVES_TIMEOUT")
    if value is None:
        return DEFAULT_TIMEOUT
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_TIMEOUT):
        raise ValueError(f"COLLECTIVES_TIMEOUT={value!r} is not valid: it must be a finite number "
                         f"of seconds with 0 < seconds <= {MAX_TIMEOUT:g} (one week); "
                         f"unset, it is {DEFAULT_TIMEOUT:g}")
    return seconds


def desync_check():
    """``COLLECTIVES_DEBUG=1``: every call first compares its fingerprint with the group's."""
    return _flag("COLLECTIVES_DEBUG")


def verbose():
    """``COLLECTIVES_VERBOSE=1``: print every message as it moves."""
    return _flag("COLLECTIVES_VERBOSE")


def gloo_batch():
    """``COLLECTIVES_GLOO_BATCH`` (default 1): run gloo's socket threads as ``SCHED_BATCH``
    (``p2p_communications.calm_transport_threads``); 0 leaves them as torch made them."""
    return _raw("COLLECTIVES_GLOO_BATCH") is None or _flag("COLLECTIVES_GLOO_BATCH")


TRANSPORTS = ("gloo", "shm", "auto")


def transport():
    """``COLLECTIVES_TRANSPORT`` (default ``auto``): how ranks that share a host exchange messages.

    ``gloo``: every message over gloo's TCP loopback. ``shm``: shared memory between
    the ranks of each host (``collectives/shm.py``), an error on every rank if it cannot
    be set up. ``auto``: shared memory where it can be set up, else gloo with one
    warning line. Ranks on different hosts use gloo whatever the value.
    """
    value = _raw("COLLECTIVES_TRANSPORT")
    if value is None:
        return "auto"
    value = value.strip().lower()
    if value not in TRANSPORTS:
        raise ValueError(f"COLLECTIVES_TRANSPORT={os.environ['COLLECTIVES_TRANSPORT']!r} is not valid: "
                         f"use one of {', '.join(TRANSPORTS)}; unset, it is auto")
    return value


def shm_direct_min():
    """``COLLECTIVES_SHM_DIRECT_MIN`` (default ``auto``): bytes from which the shared-memory door
    reads a message straight from the sender's memory (one copy, ``collectives/shm.py``);
    ``off``: every message through the mailboxes (two copies, side by side where each rank of
    the host has a core); ``auto``: ``4M`` where the host's ranks outnumber its cores, else
    ``off``. Bytes, or with K, M or G. Read when a group's mailboxes are set up (its first call)."""
    value = _raw("COLLECTIVES_SHM_DIRECT_MIN")
    if value is None:
        return "auto"
    text = value.strip().upper().removesuffix("B")
    if text == "AUTO":
        return "auto"
    if text in ("OFF", "NONE", "NEVER"):
        return None
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    try:
        number = int(text[:-1] if scale > 1 else text)
    except ValueError:
        number = -1
    if number < 1:
        raise ValueError(f"COLLECTIVES_SHM_DIRECT_MIN={value!r} is not valid: use a positive size in bytes "
                         f"(e.g. 1048576, 256K, 1M), off or auto; unset, it is auto")
    return number * scale


def set_transport(value):
    """Set ``COLLECTIVES_TRANSPORT`` for this process and the ranks it starts (``--transport``)."""
    os.environ["COLLECTIVES_TRANSPORT"] = value
    transport()     # checked now, not at the first message


def parse_algorithms(text, where="COLLECTIVES_ALGO"):
    """``"all_reduce:ring,broadcast:binomial_tree"`` -> ``{"all_reduce": "ring", ...}``.

    Raises ValueError naming the bad entry and the valid names; a collective named
    twice is an error (which one was meant?).

    Example::

        >>> parse_algorithms("all_reduce:ring, all_gather:recursive_doubling")
        {'all_reduce': 'ring', 'all_gather': 'recursive_doubling'}
    """
    chosen = {}
    for entry in (text or "").split(","):
        entry = entry.strip()
        if not entry:
            continue
        collective, sep, algorithm = (s.strip() for s in entry.partition(":"))
        if not sep or not algorithm:
            raise ValueError(f"{where}: entry {entry!r} must read collective:algorithm, "
                             f"e.g. all_reduce:ring")
        if collective not in ALGORITHMS:
            raise ValueError(f"{where}: unknown collective {collective!r} in {entry!r}; "
                             f"valid: {', '.join(ALGORITHMS)}")
        if algorithm not in ALGORITHMS[collective]:
            raise ValueError(f"{where}: unknown algorithm {algorithm!r} for {collective}; "
                             f"valid: {', '.join(ALGORITHMS[collective])}")
        if collective in chosen:
            raise ValueError(f"{where}: {collective} is named twice ({collective}:{chosen[collective]} "
                             f"and {entry!r}); name each collective once")
        chosen[collective] = algorithm
    return chosen


def algorithm_overrides():
    """``COLLECTIVES_ALGO``, parsed: {collective: algorithm} (empty when unset)."""
    return parse_algorithms(_raw("COLLECTIVES_ALGO") or "")


def tuning_table():
    """``COLLECTIVES_TUNING_TABLE``: a table file ``algorithm=None`` reads instead, or None."""
    return _raw("COLLECTIVES_TUNING_TABLE")


def local_world_size():
    """``LOCAL_WORLD_SIZE``: how many ranks share each host, or None when unset.

    torchrun sets it (``--nproc-per-node``), and places global ranks host by host:
    ranks 0..L-1 on the first host, L..2L-1 on the next, and so on. The
    ``hierarchical`` all_reduce takes its layout from it. Not a ``COLLECTIVES_*``
    variable, but read here like one, with the same checks.

    Raises ValueError naming the variable for anything but a positive integer.
    """
    value = _raw("LOCAL_WORLD_SIZE")
    if value is None:
        return None
    try:
        ranks = int(value)
    except ValueError:
        ranks = 0
    if ranks < 1:
        raise ValueError(f"LOCAL_WORLD_SIZE={value!r} is not valid: it must be a positive integer, "
                         f"the number of ranks on each host (torchrun sets it); unset, every rank "
                         f"of a group is taken to share one host")
    return ranks


def data_dir(path=None):
    """The MNIST root: ``path`` if given, else ``COLLECTIVES_DATA``, else ``./data``."""
    return os.path.abspath(path or _raw("COLLECTIVES_DATA") or "data")


def data_cache_dir():
    """``COLLECTIVES_CACHE``: a writable place for an unpacked copy of a read-only data folder."""
    return os.path.abspath(_raw("COLLECTIVES_CACHE")
                           or os.path.join(os.path.expanduser("~"), ".cache", "collectives"))


def lab_layout():
    """``COLLECTIVES_LAB_LAYOUT`` (set by ``--lab``): the host of rank 0, 1, ..., or None outside a lab.

    Ranks with the same host share its loopback; others cross rate-limited links. Hosts are
    numbered 0..K-1 and each has a rank.

    Example::

        >>> os.environ["COLLECTIVES_LAB_LAYOUT"] = "0,0,1,1"; lab_layout()
        [0, 0, 1, 1]
    """
    value = _raw("COLLECTIVES_LAB_LAYOUT")
    if value is None:
        return None
    try:
        layout = [int(x) for x in value.split(",")]
    except ValueError:
        layout = []
    if not layout or min(layout) < 0 or set(layout) != set(range(max(layout) + 1)):
        raise ValueError(f"COLLECTIVES_LAB_LAYOUT={value!r} is not valid: it must list the host of "
                         f"every rank, comma-separated, hosts numbered 0..K-1 each with a rank "
                         f"(e.g. 0,0,1,1); --lab sets it, unset it outside a lab")
    return layout


def lab_rate():
    """``COLLECTIVES_LAB_RATE`` (set by ``--lab``): a lab link's rate in bits/s one way, or None."""
    value = _raw("COLLECTIVES_LAB_RATE")
    if value is None:
        return None
    try:
        rate = int(value)
    except ValueError:
        rate = 0
    if rate <= 0:
        raise ValueError(f"COLLECTIVES_LAB_RATE={value!r} is not valid: a whole number of bits per "
                         f"second above 0 (--lab sets it); unset it outside a lab")
    return rate


def trace_dir():
    """Where flight-recorder dumps go: ``COLLECTIVES_TRACE_DIR`` (default ``./collectives_trace``)."""
    return _raw("COLLECTIVES_TRACE_DIR") or os.path.join(".", "collectives_trace")


def trace_dir_set():
    return _raw("COLLECTIVES_TRACE_DIR") is not None


def dump_on_timeout():
    """``COLLECTIVES_DUMP_ON_TIMEOUT``: on a timeout, every rank dumps its flight recorder."""
    return _flag("COLLECTIVES_DUMP_ON_TIMEOUT")


def trace_buffer():
    """How many calls each rank's flight recorder keeps: ``COLLECTIVES_TRACE_BUFFER`` (default 2000)."""
    value = _raw("COLLECTIVES_TRACE_BUFFER")
    if value is None:
        return 2000
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"COLLECTIVES_TRACE_BUFFER={value!r} is not valid: a whole number of calls, 1 or more")
    return n
