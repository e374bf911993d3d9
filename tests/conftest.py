"""Settings every test process (and every world it starts) shares.

``algorithm=None`` reads this machine's tuning table from the per-user cache
first (``python -m benchmarks.tune`` writes it). The tests must not depend on
whether someone tuned the machine they run on, so the suite gets an empty
cache of its own; tests of the cache point ``XDG_CACHE_HOME`` elsewhere again.
"""
import os
import tempfile

os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="collectives-test-cache-")
