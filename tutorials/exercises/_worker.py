"""What runs inside each rank while an exercise is graded (the grader's parent side is grade.py).

Each rank joins a gloo world and switches the grader's watch on (:mod:`._watch`: the built-ins
forbidden, every message counted and logged) before the learner's file is even imported. Then it
runs every case of the exercise (the registry, ``_checks.CHECKS``) and puts one report per case
on the results queue.
"""
import datetime
import os
import traceback

import torch
import torch.distributed as dist

from tutorials.exercises import _checks, _routes, _watch
from tutorials.exercises._common import learner_traceback, load
from tutorials.exercises._routes import BuiltinUsed
from tutorials.exercises._watch import COUNTERS, ORIGINAL, set_status


def _where_called(exc, source):
    """'line N of FILE' for the learner's frame that made the forbidden call (else the last frame
    outside the grader's watch: a helper module of the learner's own)."""
    said = _routes.where_called(exc, source)
    if said:
        return said
    frames = traceback.extract_tb(exc.__traceback__)
    frame = ([f for f in frames if "_watch.py" not in f.filename] or frames)[-1]
    return f"line {frame.lineno} of {os.path.basename(frame.filename)}: {(frame.line or '').strip()}"


def worker(name, source, quick, status, progress, log, results):
    """One rank of a graded world (started by the launcher, which sets RANK and WORLD_SIZE and
    holds the store): run every case, report each on ``results``."""
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    _watch.attach(rank, status, progress, log)
    torch.set_num_threads(1)
    os.environ["COLLECTIVES_TIMEOUT"] = "600"   # the parent decides when a world is stuck
    set_status("starting")
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=600))
    _watch.patch(source)
    try:
        fn = load(name, source)
    except BaseException as exc:
        results.put((rank, "load_error", None, learner_traceback(exc, source)))
        return
    check = _checks.CHECKS[name]
    cases = check.cases(world_size, quick)
    results.put((rank, "ready", len(cases), None))
    for index, case in enumerate(cases):
        COUNTERS.reset()
        set_status(f"case {index + 1}: calling {name}")
        try:
            outcome = check.run(fn, case, rank, world_size)
        except BuiltinUsed as exc:
            results.put((rank, "builtin", index, (exc.name, _where_called(exc, source))))
            return
        except NotImplementedError as exc:
            last = traceback.extract_tb(exc.__traceback__)[-1]   # where it was raised: maybe a stub it calls
            results.put((rank, "not_written", index, (os.path.abspath(last.filename), last.name)))
            return
        except BaseException as exc:
            results.put((rank, "crash", index, learner_traceback(exc, source)))
            return
        if COUNTERS.unwaited() and isinstance(outcome, dict):
            outcome["unwaited"] = COUNTERS.unwaited()
        set_status(f"returned from {name} (case {index + 1}); waiting for the other ranks to finish it")
        results.put((rank, "case", index, (outcome, COUNTERS.as_tuple())))
        try:
            ORIGINAL["barrier"]()
        except RuntimeError:   # a peer failed and the parent reports it: nothing to add from here
            return
    set_status("done")
    results.put((rank, "done", None, None))
    dist.destroy_process_group()
