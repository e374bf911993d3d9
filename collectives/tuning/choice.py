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
   algorithm's time from the cost its module states (``collectives.tuning.cost_model``).
3. **The shipped defaults**: the table packaged next to this file (measured on
   this project's 2-core machine, with its fitted model), then rules of thumb
   from the model's shape: latency-bound (small) messages want few steps
   (trees, recursive doubling), bandwidth-bound (large) ones few bytes per rank
   (rings, pipelines).

Algorithms whose module sets ``AUTO = "measured"`` (the topology-aware and
Bruck algorithms: the model here sees neither hosts nor links) are picked only
from a measured table, where tuning timed them and they won; ``AUTO = "never"``
(Bruck's all_to_all, which needs pieces of one size while ``all_to_all`` allows
uneven ones) only by name.

Whatever the source, the choice is among the algorithms that need at most S/N +
4 MiB of temporary memory (each module's ``cost().extra_memory``; :func:`allowed`):
a whole-tensor algorithm may win at 16 MiB by a few percent, but not at the price
of a second copy of the tensor.

``COLLECTIVES_TUNING_TABLE=FILE`` names a table to use instead of the first
and the third (read at first use; a file that cannot be read is an error).
Which source a choice came from is logged once per group size, at debug level,
on the ``collectives.tuning`` logger.

``nbytes`` is the size of the call (``collectives.algorithms._cost.SIZE_OF_CALL``).
"""
import functools
import logging
import math

from ..algorithms import ALGORITHMS, MODULES, cost
from . import cost_model, tables
from .tables import BEYOND, SMALL_BYTES, TABLE_PATH, cache_path, table_path

log = logging.getLogger("collectives.tuning")

_said = set()


def _say(source, group_size):
    if (source, group_size) not in _said:
        _said.add((source, group_size))
        log.debug("algorithm=None on %d ranks: choosing from %s", group_size, source)


def reload():
    """Forget every table read so far (after a new one was written)."""
    tables.forget()
    choose.cache_clear()
    _said.clear()


MEMORY_SLACK = 4 << 20


def allowed(collective, nbytes, group_size):
    """The algorithms ``algorithm=None`` may pick: those needing at most S/N + ``MEMORY_SLACK``
    bytes of temporary memory (their ``cost().extra_memory``), so whole-tensor algorithms
    (recursive doubling, trees, naive_ring) serve small tensors only; if none is that frugal
    (reduce_scatter copies its input), those that need the least."""
    names = tuple(a for a in ALGORITHMS[collective] if auto(collective, a) != "never")
    if group_size < 2:
        return names
    need = {a: cost(collective, a, group_size, nbytes).extra_memory for a in names}
    fits = tuple(a for a in names if need[a] <= nbytes // group_size + MEMORY_SLACK)
    if fits:
        return fits
    # none is that frugal: those needing no more than the least a model-chosen one needs (a
    # measured-only algorithm may join them, but never be all there is to pick from)
    least = min([need[a] for a in names if auto(collective, a) == "model"] or need.values())
    return tuple(a for a in names if need[a] <= least)


def auto(collective, algorithm):
    """How ``algorithm=None`` may pick an algorithm: "model" (from a table or the cost
    model), "measured" (only where a measured table names it) or "never" (by name only)."""
    return getattr(MODULES[collective][algorithm], "AUTO", "model")


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
def choose(collective, nbytes, group_size, agreed=None):
    """Name of the default algorithm for ``collective`` with ``nbytes`` on ``group_size`` ranks.

    ``agreed``: the group's :class:`~collectives.tuning.agreed.Tables` (what every member
    reads, agreed when the group was first used); None reads this process's own.
    """
    pick, source = explain(collective, nbytes, group_size, agreed)
    _say(source, group_size)
    return pick


def explain(collective, nbytes, group_size, agreed=None):
    """(algorithm, where the choice came from): what :func:`choose` picks, and why."""
    if len(ALGORITHMS[collective]) == 1:
        return ALGORITHMS[collective][0], "the only algorithm"
    names = allowed(collective, nbytes, group_size)
    if group_size > 1:
        if agreed is None:
            mine, shipped, whose = tables.measured_here(), tables.shipped(), "this machine"
            place = cache_path()
            where = f"COLLECTIVES_TUNING_TABLE={table_path()}" if table_path() != TABLE_PATH else \
                f"the shipped table {TABLE_PATH}"
        else:
            mine, shipped, whose, place, where = agreed.mine, agreed.shipped, agreed.whose, agreed.place, \
                agreed.where
        steps = [(mine, _measured, f"the table measured on {whose} ({place})"),
                 (mine, None, f"the cost model with {whose}'s parameters ({place})"),
                 (shipped, _measured, where),
                 (shipped, None, f"the cost model with the parameters of {where}")]
        for table, measured, source in steps:
            if measured is not None:
                pick = measured(table, collective, nbytes, group_size, names)
            else:
                params = _model(table, group_size)
                modelled = [a for a in names if auto(collective, a) == "model"]
                pick = params and cost_model.best(collective, modelled, group_size, max(nbytes, 1), params)
            if pick:
                return pick, source
    pick = rule_of_thumb(collective, nbytes, group_size)
    modelled = [a for a in names if auto(collective, a) == "model"]
    return (pick if pick in modelled else (modelled or names)[0]), "rules of thumb"


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


