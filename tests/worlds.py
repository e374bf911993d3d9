"""Small worlds of processes for tests (gloo, or NCCL with a GPU each), through the one launcher.

Starting a world costs seconds when each process imports torch afresh, so:
processes are forked from a server that imported torch and collectives once
(``collectives.tools.launch.start_world`` with the ``forkserver`` start method and this
module preloaded), and a test runs many cases inside one world.
``run_world(fn, n)`` starts ``n`` processes on a free port, calls
``fn(rank, n, *args)`` in each after ``init_process_group``, and returns the
per-rank results. If a rank raises, the test fails with that rank's traceback
(and those of the ranks that failed with it); if the world is not done within
``timeout`` seconds, every process is killed and the test fails instead of
hanging CI. A rank meant to die mid-world (a fault test) ends its process with
``os._exit(DEATH_EXIT_CODE)``, status 0, which the launcher takes for a rank that finished
(as torchrun does): the others run on and see a peer that is gone, and its result is None.
"""
import os

import collectives  # noqa: F401  (preloaded into the fork server with this module)
from collectives.tools.launch import WorldError, free_port, run_in_group  # noqa: F401 (free_port: for tests)

DEFAULT_TIMEOUT = float(os.environ.get("COLLECTIVES_TEST_WORLD_TIMEOUT", 240))
DEATH_EXIT_CODE = 0


def run_world(fn, world_size, *args, timeout=DEFAULT_TIMEOUT, env=None, backend="gloo"):
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` ranks; return their results."""
    env = {"COLLECTIVES_TIMEOUT": "30", **(env or {})}
    try:
        return run_in_group(fn, world_size, *args, backend=backend, env=env, timeout=timeout,
                            start_method="forkserver", preload=[__name__])
    except WorldError as exc:
        others = "".join(f"\n--- rank {r}:\n{tb}" for r, tb in sorted(exc.errors.items())
                         if r != exc.rank and isinstance(tb, str))
        raise AssertionError(f"{exc}{others}") from None


def attempt(fn, *args):
    """``fn(*args)`` on this rank: (exception type name or "no error", its text, seconds taken)."""
    import time
    started = time.monotonic()
    try:
        fn(*args)
        return "no error", "", time.monotonic() - started
    except Exception as exc:        # noqa: BLE001 (whatever reached this rank is the result)
        return type(exc).__name__, str(exc), time.monotonic() - started


def assert_refused_alike(results, words, within=10.0):
    """Each case of ``words`` (case -> text): every rank's ``results[rank][case]`` (from
    :func:`attempt`) is the same ValueError, containing the text, raised within ``within`` s."""
    for case, said in words.items():
        assert len({r[case][1] for r in results}) == 1, (case, [r[case] for r in results])
        for rank, r in enumerate(results):
            error, text, took = r[case]
            assert error == "ValueError" and said in text and took < within, (case, rank, r[case])
