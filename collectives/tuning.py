"""What ``algorithm=None`` picks, from the message size and the group size.

Three sources, first match wins:

1. **The measured table** ``tuning_table.json`` (next to this file), written by
   ``python -m collectives.bench --write-table collectives/tuning_table.json``,
   or the file ``COLLECTIVES_TUNING_TABLE`` names (a table measured on the
   machine at hand: choices differ between machines; read at first use):
   for each collective and each group size the benchmark ran, the fastest
   algorithm at each measured size. A size between two measured ones takes
   the nearer one on a log scale; below the smallest, the smallest (small
   messages are all latency-bound); more than ``BEYOND`` times the largest
   is left to the model, since a bandwidth-bound regime may begin there.
2. **The cost model** (``collectives.cost_model``) with the alpha, beta and
   gamma fitted in the same benchmark run, for group sizes the table lacks.
3. **Rules of thumb** from the model's shape, when there is no table:
   latency-bound (small) messages want few steps (trees, recursive doubling);
   bandwidth-bound (large) ones want few bytes per rank (rings, pipelines).

``nbytes`` is the size ``collectives.bench`` and nccl-tests use: the tensor
for all_reduce, broadcast and reduce; the whole output (N pieces) for
all_gather and gather; the whole input for reduce_scatter and scatter.
"""
import functools
import json
import math
import os

from . import cost_model
from .algorithms import ALGORITHMS

SMALL_BYTES = 64 * 1024
BEYOND = 4
TABLE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tuning_table.json")


def table_path():
    """The table ``algorithm=None`` reads: ``COLLECTIVES_TUNING_TABLE`` if set, else the packaged one."""
    return os.environ.get("COLLECTIVES_TUNING_TABLE") or TABLE_PATH


@functools.lru_cache(maxsize=None)
def _table():
    path = table_path()
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as exc:
        if path != TABLE_PATH:  # a table the user named must exist: a typo would pass unnoticed
            raise ValueError(f"COLLECTIVES_TUNING_TABLE={path}: cannot read a tuning table ({exc})") from None
        return {}


@functools.lru_cache(maxsize=4096)
def choose(collective, nbytes, group_size):
    """Name of the default algorithm for ``collective`` with ``nbytes`` on ``group_size`` ranks."""
    names = ALGORITHMS[collective]
    if len(names) == 1:
        return names[0]
    table = _table()
    measured = table.get("choices", {}).get(collective, {}).get(str(group_size))
    if measured and group_size > 1 and nbytes <= BEYOND * max(size for size, _ in measured):
        pick = _nearest(measured, nbytes)
        if pick in names:
            return pick
    model = table.get("model")
    if model and group_size > 1:
        pick = cost_model.best(collective, names, group_size, max(nbytes, 1), model)
        if pick:
            return pick
    return rule_of_thumb(collective, nbytes, group_size)


def _nearest(points, nbytes):
    """Algorithm of the measured size nearest to ``nbytes`` on a log scale."""
    x = math.log(max(nbytes, 1))
    return min(points, key=lambda p: abs(math.log(p[0]) - x))[1]


def rule_of_thumb(collective, nbytes, group_size):
    """The choice without any measurement."""
    small = nbytes <= SMALL_BYTES
    if collective == "all_reduce":
        return "recursive_doubling" if small or group_size <= 2 else "ring"
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


NEAR = 1.10


def best_from_rows(rows, near=NEAR):
    """{collective: {N: [[size, algorithm], ...]}}: the fastest algorithm at each measured point.

    On a noisy machine two algorithms within a few percent swap places from run
    to run, so among those within ``near`` of the fastest at a point, the one
    that is also near-fastest at the most neighbouring sizes wins (ties: the
    faster here). Any of them keeps the default within ``near`` of the best.
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
        good = [{a for a, t in by_size[s].items() if t <= near * min(by_size[s].values())} for s in sizes]
        points = []
        for i, s in enumerate(sizes):
            votes = lambda a: sum(a in good[j] for j in range(max(0, i - 1), min(len(sizes), i + 2)))
            points.append([s, min(good[i], key=lambda a: (-votes(a), by_size[s][a]))])
        out.setdefault(collective, {})[str(n)] = points
    return out


def write_table(path, rows, model, meta):
    """Merge the fastest algorithms measured in ``rows`` into the table at ``path``."""
    try:
        with open(path) as f:
            table = json.load(f)
    except (OSError, ValueError):
        table = {}
    choices = table.setdefault("choices", {})
    for collective, by_n in best_from_rows(rows).items():
        choices.setdefault(collective, {}).update(by_n)
    if model:
        # The model for unmeasured group sizes: the largest world measured is the most typical.
        table["model"] = model[max(model)]
    table.setdefault("measured", []).append(meta)
    table["measured"] = table["measured"][-5:]
    with open(path, "w") as f:
        json.dump(table, f, indent=1, sort_keys=True)
    _table.cache_clear()
    choose.cache_clear()
