"""Choosing an algorithm: what ``algorithm=None`` runs.

* :mod:`.tables`: tuning tables (this machine's, measured by ``python -m benchmarks.tune``,
  and the shipped one), where they live and how they are read and written;
* :mod:`.cost_model`: the alpha-beta-gamma model, which turns each algorithm's stated
  ``cost()`` into a predicted time;
* :mod:`.choice`: the choice itself, from a table, else the model, else rules of thumb.
"""
from . import tables as _tables
from .choice import MEMORY_SLACK, allowed, choose, explain, reload, rule_of_thumb
from .tables import TABLE_PATH, best_from_rows, cache_path, machine, machine_key, table_path


def write_table(path, rows, model, meta):
    """Merge the fastest algorithms measured in ``rows`` into the table at ``path``, and have
    the next ``algorithm=None`` read it (see :func:`.tables.write_table`)."""
    _tables.write_table(path, rows, model, meta)
    reload()


__all__ = ["MEMORY_SLACK", "TABLE_PATH", "allowed", "best_from_rows", "cache_path", "choose", "explain",
           "machine", "machine_key", "reload", "rule_of_thumb", "table_path", "write_table"]
