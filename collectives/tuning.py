"""What ``algorithm=None`` picks, from the message size and the group size.

Sources, first match wins:

1. **This machine's table**, measured by ``python -m benchmarks.tune``
   (``collectives-tune``) and kept in the per-user cache
   (``$XDG_CACHE_HOME/collectives/``, else ``~/.cache/collectives/``), one file
   per machine (host name, CPU model and core count), inside it one table per
   group size: the fastest algorithm measured at each size. A size between two
   measured ones takes the nearer one on a log scale; below the smallest, the
   smallest (small messages are all latency-bound); more than ``BEYOND`` times
   the largest is left to the model, since a bandwidth-bound regime may begin
   there.
2. **The cost model with this machine's parameters** (alpha, beta, gamma that
   the same tune run fitted; those of the nearest group size measured), for
   group sizes and message sizes the table does not cover. It predicts each
   algorithm's time from the cost its module states (``collectives.cost_model``).
3. **The shipped defaults**: the table packaged next to this file (measured on
   this project's 2-core machine, with its fitted model), then rules of thumb
   from the model's shape: latency-bound (small) messages want few steps
   (trees, recursive doubling), bandwidth-bound (large) ones few bytes per rank
   (rings, pipelines).

Whatever the source, the choice is among the algorithms that need at most S/N +
4 MiB of temporary memory (each module's ``cost().extra_memory``; :func:`allowed`):
a whole-tensor algorithm may win at 16 MiB by a few percent, but not at the price
of a second copy of the tensor.

``COLLECTIVES_TUNING_TABLE=FILE`` names a table to use instead of the first
and the third (read at first use; a file that cannot be read is an error).
Which source a choice came from is logged once per group size, at debug level,
on the ``collectives.tuning`` logger.

``nbytes`` is the size nccl-tests and the benchmarks use: the tensor for
all_reduce, broadcast and reduce; the whole output (N pieces) for all_gather
and gather; the whole input for reduce_scatter and scatter.
"""
import functools
import hashlib
import json
import logging
import math
import os
import platform
import re
import socket

from . import cost_model
from .algorithms import ALGORITHMS, cost

log = logging.getLogger(__name__)

SMALL_BYTES = 64 * 1024
BEYOND = 4
TABLE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tuning_table.json")


def table_path():
    """The shipped table ``algorithm=None`` falls back to: ``COLLECTIVES_TUNING_TABLE`` if set,
    else the packaged one."""
    return os.environ.get("COLLECTIVES_TUNING_TABLE") or TABLE_PATH


def cache_dir():
    """Where tuning tables measured on this machine live (per user)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "collectives")


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine():
    """What identifies this machine's measurements: host name, CPU model, cores."""
    return {"host": socket.gethostname(), "cpu": _cpu_model(), "cores": os.cpu_count()}


def machine_key():
    """A file-name-safe key for :func:`machine` ('host-16cpu-1a2b3c4d5e')."""
    m = machine()
    digest = hashlib.sha1(json.dumps(m, sort_keys=True).encode()).hexdigest()[:10]
    host = re.sub(r"[^A-Za-z0-9_.-]", "_", m["host"])[:40]
    return f"{host}-{m['cores']}cpu-{digest}"


def cache_path():
    """This machine's tuning table in the per-user cache (it may not exist yet)."""
    return os.path.join(cache_dir(), f"tuning-{machine_key()}.json")


def _read(path):
    with open(path) as f:
        return json.load(f)


@functools.lru_cache(maxsize=None)
def _table():
    """The shipped table (or ``COLLECTIVES_TUNING_TABLE``'s)."""
    path = table_path()
    try:
        return _read(path)
    except (OSError, ValueError) as exc:
        if path != TABLE_PATH:  # a table the user named must exist: a typo would pass unnoticed
            raise ValueError(f"COLLECTIVES_TUNING_TABLE={path}: cannot read a tuning table ({exc})") from None
        return {}


@functools.lru_cache(maxsize=None)
def _cache():
    """This machine's measured table, or {} if ``collectives-tune`` has not run here."""
    if os.environ.get("COLLECTIVES_TUNING_TABLE"):
        return {}
    try:
        return _read(cache_path())
    except (OSError, ValueError):
        return {}


_said = set()


def _say(source, group_size):
    if (source, group_size) not in _said:
        _said.add((source, group_size))
        log.debug("algorithm=None on %d ranks: choosing from %s", group_size, source)


def reload():
    """Forget every table read so far (after a new one was written)."""
    _table.cache_clear()
    _cache.cache_clear()
    choose.cache_clear()
    _said.clear()


MEMORY_SLACK = 4 << 20


def allowed(collective, nbytes, group_size):
    """The algorithms ``algorithm=None`` may pick: those needing at most S/N + ``MEMORY_SLACK``
    bytes of temporary memory (their ``cost().extra_memory``), so whole-tensor algorithms
    (recursive doubling, trees, naive_ring) serve small tensors only; if none is that frugal
    (reduce_scatter copies its input), those that need the least."""
    names = ALGORITHMS[collective]
    if group_size < 2:
        return names
    need = {a: cost(collective, a, group_size, nbytes).extra_memory for a in names}
    fits = tuple(a for a in names if need[a] <= nbytes // group_size + MEMORY_SLACK)
    return fits or tuple(a for a in names if need[a] == min(need.values()))


def _measured(table, collective, nbytes, group_size, names):
    points = table.get("choices", {}).get(collective, {}).get(str(group_size))
    if points and nbytes <= BEYOND * max(size for size, _ in points):
        pick = _nearest(points, nbytes)
        if pick in names:
            return pick
    return None


def _model(table, group_size):
    """The fitted parameters for ``group_size``, else those of the nearest group size measured."""
    models = table.get("models") or {}
    if models:
        return models[min(models, key=lambda n: (abs(int(n) - group_size), -int(n)))]
    return table.get("model")


@functools.lru_cache(maxsize=4096)
def choose(collective, nbytes, group_size):
    """Name of the default algorithm for ``collective`` with ``nbytes`` on ``group_size`` ranks."""
    pick, source = explain(collective, nbytes, group_size)
    _say(source, group_size)
    return pick


def explain(collective, nbytes, group_size):
    """(algorithm, where the choice came from): what :func:`choose` picks, and why."""
    if len(ALGORITHMS[collective]) == 1:
        return ALGORITHMS[collective][0], "the only algorithm"
    names = allowed(collective, nbytes, group_size)
    if group_size > 1:
        mine, shipped = _cache(), _table()
        where = f"COLLECTIVES_TUNING_TABLE={table_path()}" if table_path() != TABLE_PATH else \
            f"the shipped table {TABLE_PATH}"
        steps = [(mine, _measured, f"the table measured on this machine ({cache_path()})"),
                 (mine, None, f"the cost model with this machine's parameters ({cache_path()})"),
                 (shipped, _measured, where),
                 (shipped, None, f"the cost model with the parameters of {where}")]
        for table, measured, source in steps:
            if measured is not None:
                pick = measured(table, collective, nbytes, group_size, names)
            else:
                params = _model(table, group_size)
                pick = params and cost_model.best(collective, names, group_size, max(nbytes, 1), params)
            if pick:
                return pick, source
    pick = rule_of_thumb(collective, nbytes, group_size)
    return (pick if pick in names else names[0]), "rules of thumb"


def _nearest(points, nbytes):
    """Algorithm of the measured size nearest to ``nbytes`` on a log scale."""
    x = math.log(max(nbytes, 1))
    return min(points, key=lambda p: abs(math.log(p[0]) - x))[1]


def rule_of_thumb(collective, nbytes, group_size):
    """The choice without any measurement."""
    small = nbytes <= SMALL_BYTES
    if collective == "all_reduce":
        return "recursive_doubling" if small else "ring"
    if collective == "broadcast":
        if small or group_size <= 2:
            return "binomial_tree"
        return "pipeline"
    if collective in ("reduce", "scatter", "gather"):
        return "binomial_tree"
    if collective == "all_gather":
        return "recursive_doubling" if small else "ring"
    if collective == "reduce_scatter":
        return "recursive_halving" if small else "ring"
    if collective == "all_to_all":
        return "linear"
    return "dissemination"


def best_from_rows(rows):
    """{collective: {N: [[size, algorithm], ...]}}: the fastest algorithm at each measured point.

    On a noisy machine one sample can make an algorithm look fastest at a size where
    it is slower on both sides (all_gather, N=4, 16K, on the 2-core machine: ring
    measured 1.14x faster, between sizes where it was 1.3x and 1.9x slower). The
    regime changes slowly with size, so each algorithm is scored by its time over
    the fastest at this size and at the two neighbouring sizes, a geometric mean
    in which this size counts twice; the lowest score wins (ties: the faster here).
    Sizes where an algorithm was not timed do not count for it.
    """
    times = {}
    for r in rows:
        name = r["algorithm"]
        if name in ("builtin", "default") or name.endswith("+debug") or name not in ALGORITHMS[r["collective"]]:
            continue
        key = (r["collective"], r["world_size"])
        times.setdefault(key, {}).setdefault(r["size"], {})[name] = r["time_us"]
    out = {}
    for (collective, n), by_size in sorted(times.items()):
        sizes = sorted(by_size)
        over = [{a: t / min(by_size[s].values()) for a, t in by_size[s].items()} for s in sizes]

        def score(a, i):
            near = [(2 if j == i else 1, over[j][a]) for j in range(max(0, i - 1), min(len(sizes), i + 2))
                    if a in over[j]]
            return math.exp(sum(w * math.log(x) for w, x in near) / sum(w for w, _ in near))
        out.setdefault(collective, {})[str(n)] = [
            [s, min(over[i], key=lambda a: (score(a, i), over[i][a]))] for i, s in enumerate(sizes)]
    return out


def write_table(path, rows, model, meta):
    """Merge the fastest algorithms measured in ``rows`` into the table at ``path``.

    ``model``: {group size: fitted parameters} (may be empty); ``meta``: what was run where.
    """
    try:
        table = _read(path)
    except (OSError, ValueError):
        table = {}
    choices = table.setdefault("choices", {})
    for collective, by_n in best_from_rows(rows).items():
        choices.setdefault(collective, {}).update(by_n)
    if model:
        table.setdefault("models", {}).update({str(n): params for n, params in model.items()})
        # The model for unmeasured group sizes: the largest world measured is the most typical.
        table["model"] = model[max(model)]
    table.setdefault("measured", []).append(meta)
    table["measured"] = table["measured"][-5:]
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(table, f, indent=1, sort_keys=True)
    os.replace(tmp, path)   # a reader never sees half a table
    reload()
