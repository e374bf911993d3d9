"""Grade an exercise: run your function in real worlds of processes and say what is wrong.

    python -m tutorials.exercises.grade all_reduce                      # grades tutorials/exercises/all_reduce.py
    python -m tutorials.exercises.grade all_reduce --solution mine.py   # or any file defining all_reduce
    python -m tutorials.exercises.grade all_reduce --quick              # fewer world sizes and cases

From Python or a notebook cell::

    from tutorials.exercises.grade import grade
    grade("all_reduce", my_all_reduce, quick=True)   # a function, a file path or a module name

What is checked (exit status 0 only on a pass):

1. **Results**, against what the built-in returns, on worlds of 1, 2, 3, 4, 5 and 8
   ranks, tensors of 0, 1, 7 and 33600 elements, several dtypes, roots other
   than 0, and for the reductions a float32 case where the order of summation
   changes the result (any order within the rounding bound passes). The first wrong
   case is shown with each rank's expected and received values.
2. **Inputs left alone**: a tensor the solution was only to read (``input_list``,
   all_gather's ``tensor``, the weights) must hold what it held before the call.
3. **Same bits on every rank** for all_reduce, as the library promises.
4. **No built-in collective**: while grading, ``dist.all_reduce`` and every other
   collective raise; a solution that calls one is told which and where.
5. **Traffic**: bytes and messages each rank sends, counted from its
   ``send``/``isend``/``batch_isend_irecv`` calls, against what the algorithm needs.
6. **Receive sizes**: each send is paired with its receive (per pair of ranks, in
   posting order); a receive buffer larger than its message is reported (gloo
   accepts it, NCCL and the library's door do not).
7. **Deadlock**: when every rank that has not returned is blocked on a message for
   ``GRADER_WAIT_SECONDS`` (3), or no rank makes a call for ``hang_seconds`` (default 15:
   ranks still computing), the world is stopped and the verdict shows the call and peer
   each rank was stuck in, an isend whose request was never waited on, and names a cycle
   of waits (send-send, recv-recv, or mixed) where there is one.
8. **Crash**: the traceback of the rank that raised, once; a receive buffer shorter than
   its message (gloo aborts the receiver) is named as the cause.
9. **Memory**: what the solution keeps alive, not only what it is handed (ZeRO-1's
   state wherever it is kept, FSDP's gathered layers, 1F1B's posted receives).
10. **Requests**: an isend never waited on, even where the result came out right.
11. **Work**: for zig-zag ring attention, the multiply-adds of every matrix product the
    solution calls, against the 2N + 1 blocks per rank the algorithm computes (a fully masked
    block computed and masked gives the right numbers for twice the work).

Worlds of 2 ranks and more run first, the world of 1 last (a deadlock shows in the first
world run). Every world size is graded, also after one fails (except for mistakes that are the
same on every world: a built-in called, a stub not written, a file that does not
load; and a deadlock, which costs ``hang_seconds`` a world: grading stops at the first). The verdict is the first failure of results, bits, inputs, deadlock or crash
over all worlds, else the first of traffic, state or receive sizes (the results were
right), and ends with the world sizes that passed and those that failed: "passed on
2, 4; failed on 3 (deadlock)" is the clue to a mistake that depends on N.
"""
import argparse
import ctypes
import inspect
import linecache
import os
import queue
import re
import shutil
import sys
import tempfile
import textwrap
import time
import types
from pathlib import Path

import torch.distributed
import torch.multiprocessing as mp

from collectives.tools import launch
from tutorials.exercises import _checks, _numeric, _watch, _worker
from tutorials.exercises._checks_ladder import LADDERS

HERE = Path(__file__).resolve().parent
FULL_WORLDS = (1, 2, 3, 4, 5, 8)
QUICK_WORLDS = (1, 2, 3, 4)
HANG_SECONDS = float(os.environ.get("GRADER_HANG_SECONDS", 15))
# When every rank that has not returned is blocked on a message, nothing but a message can move
# the world: a message on one machine lands in milliseconds, so a few seconds of that is a deadlock
# (the long wait above is for ranks still computing, which a loaded machine slows).
WAIT_SECONDS = float(os.environ.get("GRADER_WAIT_SECONDS", 3))
BLOCKED = ("in dist.send", "in dist.recv", "waiting in req.wait()", "in dist.batch_isend_irecv")
RETURNED = ("returned from ", "done")
START_SECONDS = 120      # a world that has not started by then is reported, not waited on
WORLD_SECONDS = float(os.environ.get("GRADER_WORLD_SECONDS", 300))   # all cases of one world, once started


class Verdict:
    """The grader's answer: ``passed`` (bool), ``text`` (what it printed), ``reason`` (one word).

    ``reason`` is one of "pass", "wrong", "changed_input", "builtin", "traffic", "state",
    "schedule", "work", "buffer", "unwaited", "deadlock", "crash", "not_written", "load_error", "died",
    "slow".
    """

    def __init__(self, name, passed, reason, text):
        self.name, self.passed, self.reason, self.text = name, passed, reason, text

    def __bool__(self):
        return self.passed

    def __repr__(self):
        return f"Verdict({self.name!r}, passed={self.passed}, reason={self.reason!r})"


# --- where the solution's code is -------------------------------------------------------------

def _globals_used(fn):
    names, stack = set(), [fn.__code__]
    while stack:
        code = stack.pop()
        names.update(code.co_names)
        stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    return names


def _cell_imports(fn):
    """The top-level import lines of the cell (or file) that defined ``fn``."""
    filename = fn.__code__.co_filename
    return [line.rstrip() for line in linecache.getlines(filename)
            if line.startswith(("import ", "from ")) and "__future__" not in line]


def _source_of(fn, seen):
    """Source for ``fn`` and whatever it uses from its notebook (or script) namespace."""
    seen.add(fn.__name__)
    header, body = _cell_imports(fn), []
    for name in sorted(_globals_used(fn)):
        if name in seen or name not in fn.__globals__:
            continue
        obj = fn.__globals__[name]
        if isinstance(obj, types.ModuleType):
            header.append(f"import {obj.__name__} as {name}" if obj.__name__ != name else f"import {name}")
        elif isinstance(obj, (types.FunctionType, type)) and obj.__module__ == fn.__module__:
            if isinstance(obj, types.FunctionType):
                more_header, more_body = _source_of(obj, seen)
                header += more_header
                body += more_body
            else:
                seen.add(name)
                body.append(textwrap.dedent(inspect.getsource(obj)))
        elif getattr(sys.modules.get(getattr(obj, "__module__", None) or ""), getattr(obj, "__qualname__", ""),
                     None) is obj:
            alias = "" if obj.__qualname__ == name else f" as {name}"
            header.append(f"from {obj.__module__} import {obj.__qualname__}{alias}")
        elif isinstance(obj, (int, float, str, bool, tuple, type(None))):
            header.append(f"{name} = {obj!r}")
    body.append(textwrap.dedent(inspect.getsource(fn)))
    return header, body


def resolve(name, solution):
    """(source for the workers: a .py path or a module name, path to show, temp dir or None)."""
    if solution is None:
        path = HERE / f"{name}.py"
        return str(path), _shown(path), None
    if isinstance(solution, (str, os.PathLike)):
        text = str(solution)
        if text.endswith(".py"):
            path = Path(text).resolve()
            if not path.exists():
                raise FileNotFoundError(f"no solution file {text}")
            return str(path), _shown(path), None
        return text, text, None     # a module name, e.g. tutorials.exercises.solutions.all_reduce
    if not callable(solution):
        raise TypeError(f"solution must be a path, a module name or a function, not {type(solution).__name__}")
    module = sys.modules.get(solution.__module__)
    file = getattr(module, "__file__", None)
    if solution.__module__ not in ("__main__", "__mp_main__") and file and solution.__name__ == name:
        return str(Path(file).resolve()), _shown(Path(file)), None
    # Defined in a notebook cell or a script: the workers cannot import it, so write it down.
    header, body = _source_of(solution, set())
    tmp = tempfile.mkdtemp(prefix="grade_")
    path = Path(tmp) / f"{name}_solution.py"
    lines = list(dict.fromkeys(["import torch", "import torch.distributed as dist", *header]))
    text = "\n".join(lines) + "\n\n\n" + "\n\n".join(body)
    if solution.__name__ != name:
        text += f"\n\n{name} = {solution.__name__}\n"
    path.write_text(text)
    return str(path), f"{solution.__name__} (defined in {solution.__module__})", tmp


def _shown(path):
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


# --- one world --------------------------------------------------------------------------------

class World:
    """What came back from one world: the per-case reports, or how it stopped."""

    def __init__(self, n):
        self.n = n
        self.cases = {}          # index -> {rank: (outcome, counters)}
        self.total = None        # number of cases
        self.stop = None         # None (finished), or (kind, rank, index, payload)
        self.others = {}         # rank -> (kind, payload) of ranks that failed after the first
        self.statuses = None     # where each rank was, for a deadlock
        self.logs = None         # each rank's latest messages (_watch.log_message), where a rank failed


def run_world(name, source, n, quick, hang_seconds):
    """One world of ``n`` ranks grading ``source``: started by the launcher (its store, its fork
    server, which imports the worker once), watched here until it finishes or stops moving."""
    ctx = mp.get_context("forkserver")
    status = ctx.RawArray(ctypes.c_char, n * _watch.SLOT)
    progress = ctx.RawArray(ctypes.c_longlong, n)
    log = ctx.RawArray(ctypes.c_char, n * _watch.LOG_SLOT)
    results = ctx.Queue()
    try:
        with launch.started(_worker.worker, n, name, source, quick, status, progress, log, results,
                            start_method="forkserver", preload=["tutorials.exercises._worker"]) as (procs, endings):
            return _watch_world(name, n, procs, endings, results, status, progress, log, hang_seconds)
    finally:
        results.close()


def _watch_world(name, n, procs, endings, results, status, progress, log, hang_seconds):
    world, ready, done = World(n), set(), set()
    started = last_change = time.monotonic()
    last, stop_at = None, None
    while True:
        now = time.monotonic()
        if stop_at is not None and now > stop_at:
            break
        try:
            rank, kind, index, payload = results.get(timeout=0.1)
        except queue.Empty:
            pass
        else:
            if kind == "ready":
                ready.add(rank)
                world.total = index
            elif kind == "case":
                reports = world.cases.setdefault(index, {})
                reports[rank] = payload
                if len(reports) == n and not all(o["ok"] for o, _ in reports.values()):
                    break            # a wrong case: no need to run the rest
            elif kind == "done":
                done.add(rank)
                if len(done) == n:
                    break
            elif world.stop is None:
                world.stop = (kind, rank, index, payload)
                world.statuses, world.logs = _where(status, log, n)   # a short receive shows here
                stop_at = time.monotonic() + 1.0   # collect the other ranks' reports for a moment
            else:
                world.others[rank] = (kind, payload)
        snapshot = tuple(progress)
        if snapshot != last:
            last, last_change = snapshot, now
        if world.stop is None:
            quiet = now - last_change
            if len(ready) == n and min(hang_seconds, WAIT_SECONDS) < quiet <= hang_seconds:
                statuses = _statuses(status, n)
                if _all_blocked(statuses, name):
                    world.stop = ("deadlock", None, len(_complete(world)), min(hang_seconds, WAIT_SECONDS))
                    world.statuses = statuses
                    break
            if len(ready) == n and quiet > hang_seconds:
                world.stop = ("deadlock", None, len(_complete(world)), hang_seconds)
                world.statuses = _statuses(status, n)
                break
            if len(ready) == n and now - started > START_SECONDS + WORLD_SECONDS:
                world.stop = ("slow", None, len(_complete(world)), WORLD_SECONDS)
                world.statuses = _statuses(status, n)
                break
            if len(ready) < n and now - started > START_SECONDS:
                world.stop = ("died", None, None, f"the world of {n} did not start in {START_SECONDS} s")
                break
            dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in done]
            if dead:
                r = dead[0]
                said = _ending(endings, r)   # what escaped the worker itself (its setup), if anything
                world.stop = ("died", r, len(_complete(world)),
                              f"rank {r} died with exit code {procs[r].exitcode} "
                              + (f"after this error:\n{said.rstrip()}\n" if said else "(no Python traceback)"))
                world.statuses, world.logs = _where(status, log, n)
                stop_at = time.monotonic() + 1.0
    return world


def _ending(endings, rank):
    """The traceback the launcher heard from ``rank`` (an error outside the learner's cases), or None."""
    while True:
        try:
            r, ok, value = endings.get(timeout=0.2)
        except queue.Empty:
            return None
        if r == rank and not ok:
            return str(value)


NEVER_WAITED = "; never waited on: "


def _all_blocked(statuses, name):
    """True if every rank is blocked on a message or has returned, and at least one is blocked."""
    blocked = [s.startswith(BLOCKED) for s in statuses]
    returned = [s.startswith(f"returned from {name}") or s == "done" for s in statuses]
    return any(blocked) and all(b or r for b, r in zip(blocked, returned))


def _statuses(status, n):
    """Where each rank is."""
    return [_status_of(status, r) for r in range(n)]


def _where(status, log, n):
    """Where each rank is, and each rank's log of its latest messages (for a short receive)."""
    return _statuses(status, n), [_log_of(log, r) for r in range(n)]


def _log_of(log, rank):
    """{(kind, peer): [(first, last, dtype, dims)]} from a rank's message log (_watch.log_message)."""
    raw = bytes(log[rank * _watch.LOG_SLOT:(rank + 1) * _watch.LOG_SLOT]).split(b"\0", 1)[0]
    runs = {}
    for entry in raw.decode("utf-8", "replace").split(";"):
        got = _LOGGED.fullmatch(entry)
        if got:     # an entry cut short by the slot's end is left out
            runs.setdefault((got[1], int(got[2])), []).append((int(got[3]), int(got[4]), got[5], got[6]))
    return runs


def _status_of(status, rank):
    raw = bytes(status[rank * _watch.SLOT:(rank + 1) * _watch.SLOT])
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def _world(n):
    return f"{n} rank{'s' if n > 1 else ''}"


def _ranks(ranks):
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"


def _complete(world):
    return [i for i, r in sorted(world.cases.items()) if len(r) == world.n]


# --- verdicts ---------------------------------------------------------------------------------

def _case_words(check, case, n):
    return check.label(case).replace("{n}", str(n))


def _deadlock_text(name, world, check, cases):
    index = world.stop[2]
    case = cases[index] if index < len(cases) else None
    statuses = world.statuses
    finished = [r for r, s in enumerate(statuses) if s.startswith(f"returned from {name}")]
    waiting = [s for s in statuses if s.startswith(("in dist.", "waiting in req.wait()"))]
    busy = [r for r, s in enumerate(statuses) if r not in finished and not s.startswith(("in dist.", "waiting in"))]
    lines = [f"FAIL {name}: {'deadlock' if waiting else 'stuck'}. With {_world(world.n)}"
             + (f" ({_case_words(check, case, world.n)})" if case else "")
             + f", no rank made any progress for {world.stop[3]:g} s, so the grader stopped them.",
             "Where each rank was waiting:" if waiting else "Where each rank was:"]
    lines += [f"  rank {r}: {text}" for r, text in enumerate(statuses)]
    dropped = [(r, s.split(NEVER_WAITED, 1)[1]) for r, s in enumerate(statuses) if NEVER_WAITED in s]
    if dropped:
        r, what = dropped[0]
        lines.append(f"{_ranks([d for d, _ in dropped]).capitalize()} posted an isend and never waited on its "
                     f"request (rank {r}: {what}). A send is done only when its request's wait() returns; "
                     f"a request dropped unwaited may never be sent at all, and its peer waits for it "
                     f"forever. Keep every request dist.isend returns and call .wait() on each before "
                     f"returning (or before reusing its buffer): see chapter 2 (tutorials/02_point_to_point.md).")
        return "\n".join(lines)
    cycle_lines = _cycle_lines(statuses, finished, world.n)
    if not waiting and busy:
        lines.append(f"No rank is waiting for a message: {_ranks(busy)} {'is' if len(busy) == 1 else 'are'} "
                     f"still running your code after the call shown (an endless loop?).")
    elif cycle_lines:
        lines += cycle_lines
    elif waiting and all(s.startswith("in dist.send") for s in waiting):
        lines.append("Every waiting rank is in a blocking send and none is receiving: a send waits for "
                     "its receive. Post each send together with its receive (dist.isend + dist.irecv, "
                     "or dist.batch_isend_irecv), or let even ranks send first and odd ranks receive "
                     "first: see chapter 2 (tutorials/02_point_to_point.md), \"Deadlock\".")
    elif finished:
        lines.append(f"{_ranks(finished).capitalize()} already returned from {name} while others still "
                     f"wait for messages: the ranks disagree on how many messages to exchange (count the sends "
                     f"each rank makes and the receives its peers post).")
    else:
        lines.append("Each waiting rank expects a message that no rank is sending: check that every "
                     "receive has a matching send (same peers, same order).")
    return "\n".join(lines)


_WAITS = [(re.compile(r"^in dist\.send\(dst=(\d+)\)"), "send"),
          (re.compile(r"^in dist\.recv\(src=(\d+)\)"), "recv"),
          (re.compile(r"^waiting in req\.wait\(\) for dist\.isend\(dst=(\d+)\)"), "send"),
          (re.compile(r"^waiting in req\.wait\(\) for dist\.irecv\(src=(\d+)\)"), "recv")]


def _waits(statuses):
    """{rank: ("send" or "recv", peer)} for each rank blocked on one message."""
    waits = {}
    for r, text in enumerate(statuses):
        for pattern, kind in _WAITS:
            m = pattern.match(text)
            if m:
                waits[r] = (kind, int(m[1]))
                break
    return waits


def _wait_words(rank, kind, peer):
    return f"rank {rank} waits to {'send to' if kind == 'send' else 'receive from'} rank {peer}"


def _cycle_lines(statuses, finished, n):
    """Describe a cycle of waits (who waits to send to whom), and the ranks waiting on it; [] if none."""
    waits = _waits(statuses)
    cycle = None
    for start in sorted(waits):
        path, r = [], start
        while r in waits and r not in path:
            path.append(r)
            r = waits[r][1]
        if r in path:
            cycle = path[path.index(r):]
            break
    if cycle is None:
        return []
    if len(cycle) == 1:
        r = cycle[0]
        return [f"{_wait_words(r, *waits[r]).capitalize()}, itself: a rank cannot be both ends of a blocking "
                f"message. Copy locally instead of sending to yourself."]
    kinds = {waits[r][0] for r in cycle}
    lowest = cycle.index(min(cycle))
    cycle = cycle[lowest:] + cycle[:lowest]
    arrow = " -> ".join(map(str, cycle + cycle[:1]))
    who = (f"ranks {cycle[0]} and {cycle[1]}" if len(cycle) == 2 else
           f"ranks {', '.join(map(str, cycle))}")
    other = "the other" if len(cycle) == 2 else "the next"
    none = "neither" if len(cycle) == 2 else "none"
    if kinds == {"send"}:
        text = (f"A send-send cycle: {who} each wait to send to {other} ({arrow}), and {none} is "
                f"receiving. A blocking send returns only once its receive is posted, so none of these "
                f"sends can finish. Post each send together with its receive (dist.isend + dist.irecv, or "
                f"dist.batch_isend_irecv), or order the calls so that every send faces a receive: see chapter 2 "
                f"(tutorials/02_point_to_point.md), \"Deadlock\".")
        if n % 2 == 1 and set(cycle) == {0, n - 1}:
            text += (f" Both are even: ordering by parity (even ranks send first) pairs every sender with a "
                     f"receiver only when N is even; with N = {n}, ranks {n - 1} and 0 are both even and "
                     f"neighbours on the ring.")
    elif kinds == {"recv"}:
        chain = ", ".join(f"rank {r} from rank {waits[r][1]}" for r in cycle)
        text = (f"A recv-recv cycle: each of {who} waits to receive ({chain}), and {none} is sending: "
                f"each sends only after it has received. Let one of them send first, or post the sends "
                f"(dist.isend) before waiting on the receives.")
    else:
        chain = ", ".join(_wait_words(r, *waits[r]) for r in cycle)
        text = (f"A cycle of waits ({arrow}): {chain}. Each waits on a call its peer has not reached: the ranks "
                f"disagree on the order of their messages. Check that every receive has a matching send "
                f"(same peers, same order).")
    lines = [text]
    into = [r for r in sorted(waits) if r not in cycle]
    for r in into:
        kind, peer = waits[r]
        if peer in cycle:
            lines.append(f"{_wait_words(r, kind, peer).capitalize()}, which is in that cycle.")
        elif peer in finished:
            lines.append(f"{_wait_words(r, kind, peer).capitalize()}, which already returned.")
    return lines


def _crash_text(name, world, check, cases, shown_path, source):
    kind, rank, index, payload = world.stop
    case = cases[index] if index is not None and index < len(cases) else None
    where = f"with {_world(world.n)}" + (f" ({_case_words(check, case, world.n)})" if case else "")
    if kind == "not_written":
        raised_in, function = payload
        elsewhere = raised_in != os.path.abspath(source) if source.endswith(".py") else function != name
        if elsewhere:
            return (f"NOT WRITTEN {name}: it calls {function} in {_shown(raised_in)}, which still raises "
                    f"NotImplementedError. Write and grade that one first "
                    f"(python -m tutorials.exercises.grade {function}).")
        return (f"NOT WRITTEN {name}: {shown_path} still raises NotImplementedError. "
                f"Write its body (the docstring says what to build), then grade it again.")
    if kind == "builtin":
        builtin, line = payload
        return (f"FAIL {name}: it calls {builtin} ({line}). Built-in collectives are switched off "
                f"while grading: build {name} from point-to-point messages only (dist.send, dist.recv, "
                f"dist.isend, dist.irecv, dist.batch_isend_irecv). See {check.chapter}.")
    if kind == "slow":
        return (f"FAIL {name}: too slow. With {_world(world.n)} the cases were still running after "
                f"{payload:g} s (case {index + 1} of {len(cases)}), though the ranks were not stuck. "
                f"Send few large messages (whole chunks), not many small ones: every message pays a "
                f"latency (chapter 5, the alpha-beta model).\n"
                + "\n".join(f"  rank {r}: {s}" for r, s in enumerate(world.statuses)))
    if kind == "load_error":
        return f"FAIL {name}: the solution could not be loaded:\n{payload}"
    short = _short_receive(world.statuses or [], world.logs) if kind in ("died", "crash") else None
    if short:
        return (f"FAIL {name}: a receive buffer too short {where}: {short} A receive must name a buffer of at least the "
                    f"message's size, exactly its size for NCCL and collectives' door; gloo aborts the "
                    f"receiving process (\"Received data size doesn't match expected size\", in the error "
                f"output above; its peer then sees \"Connection reset by peer\"). Receive into a tensor of "
                f"the sender's shape and dtype.\n"
                + "\n".join(f"  rank {r}: {s}" for r, s in enumerate(world.statuses)))
    if kind == "died":
        text = f"FAIL {name}: {payload} {where} (its error output, above, may say why)."
        if world.statuses and any(world.statuses):
            text += "\n" + "\n".join(f"  rank {r}: {s}" for r, s in enumerate(world.statuses))
        return text
    text = f"FAIL {name}: rank {rank} raised an error {where}. Its traceback:\n{payload.rstrip()}"
    last_line = payload.strip().splitlines()[-1]
    same = sorted(r for r, (k, p) in world.others.items() if p and str(p).strip().splitlines()[-1] == last_line)
    other = sorted(r for r in range(world.n) if r != rank and r not in same)
    if same:
        text += f"\n({_ranks(same)} raised the same error)"
    if other and world.n > 1:
        text += f"\n({_ranks(other)} {'was' if len(other) == 1 else 'were'} stopped)"
    return text


_SHAPE = r"(\w+)\[([\d, ]*)\]"
_RECEIVING = re.compile(r"^(?:in dist\.recv|waiting in req\.wait\(\) for dist\.irecv)\(src=(\d+)\) into " + _SHAPE)
_SENDING = re.compile(r"^(?:in dist\.send|returned from dist\.send|waiting in req\.wait\(\) for dist\.isend|"
                      r"done waiting for dist\.isend|posted dist\.isend)"
                      r"\(dst=(\d+)\) of " + _SHAPE)
_LOGGED = re.compile(r"([sr])(\d+):(\d+)-(\d+)=" + _SHAPE)
_SIZES = {"float64": 8, "int64": 8, "float32": 4, "int32": 4, "bfloat16": 2, "float16": 2, "uint8": 1, "int8": 1}


def _nbytes(dtype, dims):
    numel = 1
    for d in dims.replace(" ", "").split(",") if dims.strip() else []:
        numel *= int(d)
    return numel * _SIZES.get(dtype, 4)


def _short_receive(statuses, logs=None):
    """Where a rank receives into a buffer smaller than the message its peer sends, else None. Each
    rank's k-th receive from a peer is that peer's k-th send to it (gloo keeps a pair's messages in
    order), so the message logs say it even after the sender has moved on; where a log lacks the
    pair, where the ranks are now (one receiving, its peer sending to it) may still say it."""
    for r, log in enumerate(logs or []):
        for (kind, src), received in sorted(log.items()):
            if kind != "r" or not 0 <= src < len(logs):
                continue
            sent = logs[src].get(("s", r), [])
            for first, last, dtype, dims in received:
                for first_s, last_s, dtype_s, dims_s in sent:
                    have, need = _nbytes(dtype, dims), _nbytes(dtype_s, dims_s)
                    if max(first, first_s) <= min(last, last_s) and have < need:
                        return _short_text(r, src, f"{dtype}[{dims}]", have, f"{dtype_s}[{dims_s}]", need)
    for r, text in enumerate(statuses):
        got = _RECEIVING.match(text)
        if not got or int(got[1]) >= len(statuses):
            continue
        src = int(got[1])
        sent = _SENDING.match(statuses[src])
        if sent and int(sent[1]) == r:
            have, need = _nbytes(got[2], got[3]), _nbytes(sent[2], sent[3])
            if have < need:
                return _short_text(r, src, f"{got[2]}[{got[3]}]", have, f"{sent[2]}[{sent[3]}]", need)
    return None


def _short_text(r, src, into, have, message, need):
    return (f"rank {r} receives from rank {src} into {into} ({have} bytes), but rank {src} sent that "
            f"message as {message} ({need} bytes): the receive buffer is shorter than the message.")


UNCHANGED = "(unchanged:"


def _only_inputs_changed(reports):
    """True if every failing rank got the right output but changed an input it was only to read."""
    failing = [o for o, _ in reports.values() if not o["ok"]]
    return bool(failing) and all(o.get("changed") and o.get("output_ok") for o in failing)


def _wrong_text(name, world, check, cases, index):
    reports = world.cases[index]
    where = f"{_case_words(check, cases[index], world.n)} (case {index + 1} of {len(cases)})"
    if _only_inputs_changed(reports):
        lines = [f"FAIL {name}: correct output, but it changes its input with {_world(world.n)}, {where}:"]
        groups = {}
        for r in range(world.n):
            for line in reports[r][0].get("changed", []):
                groups.setdefault(line, []).append(r)
        lines += [f"  {_ranks(ranks)}: {line}" for line, ranks in groups.items()]
        # torch's own collectives promise it; the parallelism exercises and the ladders' steps are
        # not torch functions, and their callers rely on the same
        who = f"torch's {name} leaves them unchanged" if hasattr(torch.distributed, name) else \
            f"{name} is only to read them"
        lines.append(f"The caller's tensors must stay as they were: {who}, and "
                     f"callers rely on it (they reuse them, or they are gradients). Work on copies where you "
                     f"keep running values, e.g. partial = [t.clone() for t in input_list]. See {check.chapter}.")
        return "\n".join(lines)
    lines = [f"FAIL {name}: wrong result with {_world(world.n)}, {where}."]
    shown = {r: (reports[r][0]["lines"] or [""]) + reports[r][0].get("changed", []) for r in range(world.n)}
    wrong = [r for r in shown if not reports[r][0]["ok"]]
    if not all(any(line.startswith(UNCHANGED) for line in shown[r]) for r in wrong):
        # Only some ranks kept their input: likely a coincidence, not a result that was never written.
        shown = {r: [line for line in lines if not line.startswith(UNCHANGED)] for r, lines in shown.items()}
    groups = {}   # ranks that show exactly the same lines are shown once
    for r in range(world.n):
        groups.setdefault(tuple(shown[r]), []).append(r)
    for text, ranks in sorted(groups.items(), key=lambda item: item[1][0]):
        head = f"  {_ranks(ranks)}: "
        lines.append(head + text[0])
        lines += [" " * len(head) + line for line in text[1:]]
    values = getattr(check, "values", None)     # what the inputs encode, so a wrong value can be read
    if values is not None:
        lines.append(f"The test values: {values(cases[index])}.")
    return "\n".join(lines)


def _bits_text(name, world, check, cases, index):
    """None if every rank that reported a digest of its result reported the same one, else the verdict."""
    reports = world.cases[index]
    digests = [reports[r][0].get("bits") for r in range(world.n)]
    if any(d is None for d in digests) or len({d[0] for d in digests}) == 1:
        return None
    groups = {}
    for r, (digest, values) in enumerate(digests):
        groups.setdefault(digest, (values, []))[1].append(r)
    lines = [f"FAIL {name}: ranks end with different bits with {_world(world.n)}, "
             f"{_case_words(check, cases[index], world.n)} (case {index + 1} of {len(cases)}):"]
    lines += [f"  {_ranks(ranks)}: [{', '.join(values)}, ...]" for values, ranks in groups.values()]
    lines.append("Each is the sum within rounding, but every rank must end with the same bits: the replicas "
                 "of a data-parallel model would otherwise drift apart, step after step. In floating point "
                 "(a + b) + c is not always a + (b + c): add each element up once, in one order, on one rank, "
                 "and send that sum to the others (the ring's all-gather phase) rather than letting every "
                 f"rank add the same numbers in its own order. See {check.chapter}.")
    return "\n".join(lines)


def _work_text(name, check, reports):
    """None unless a rank reported more work than the algorithm does (``"work"``, with its
    ``"blocks"``): the busiest such rank's words, and every rank's work beside them."""
    over = [(o["blocks"], r, o["work"]) for r, (o, _) in reports.items() if "work" in o]
    if not over:
        return None
    _, rank, text = max(over, key=lambda item: (item[0], -item[1]))
    counts = ", ".join(f"rank {r}: {reports[r][0]['blocks']:g}" for r in sorted(reports)
                       if "blocks" in reports[r][0])
    return f"FAIL {name}: correct, but {text} Blocks per rank: {counts}. See {check.chapter}."


def _buffer_problem(name, check, case, n, reports):
    """None if every receive was exactly the size of the message it got, else the verdict text.

    Sends from rank a to rank b and rank b's receives from rank a are paired in posting order
    (gloo, NCCL and MPI keep that order between two ranks)."""
    messages = {r: reports[r][1][4:6] for r in range(n) if len(reports[r][1]) >= 6}
    if len(messages) != n:
        return None
    for b in range(n):
        for a in range(n):
            sent = [nbytes for peer, nbytes in messages[a][0] if peer == b]
            got = [nbytes for peer, nbytes in messages[b][1] if peer == a]
            for k, (s, g) in enumerate(zip(sent, got)):
                if g > s:
                    return (f"FAIL {name}: correct on gloo, but rank {b} receives a message of {s} bytes from "
                            f"rank {a} into a buffer of {g} bytes ({_case_words(check, case, n)}, {n} ranks; "
                            f"message {k + 1} from rank {a} to rank {b}). Gloo fills the front of a larger "
                            f"buffer without a word; NCCL requires a receive of exactly the count sent, and "
                            f"collectives' own door never pairs them (the size is part of its tag), so there "
                            f"the program fails or hangs. Receive into a tensor (or a view, inbox[:k]) of "
                            f"exactly the message's size.")
    return None


def _worlds_line(outcomes):
    """'Passed on worlds of 2, 4 ranks; failed on 3 (deadlock).': the clue that a mistake depends on N."""
    passed = [str(n) for n, o in sorted(outcomes.items()) if o == "pass"]
    failed = [f"{n} ({o})" for n, o in sorted(outcomes.items()) if o != "pass"]
    head = f"Passed on worlds of {', '.join(passed)} rank{'s' if passed != ['1'] else ''}" if passed \
        else "Passed on no world"
    return f"{head}; failed on {', '.join(failed)}."


def _power_of_two_text(outcomes):
    """A sentence if the worlds that went wrong are exactly those whose size is not a power of two
    (``outcomes`` must hold every world graded: one not run may have broken the pattern)."""
    def power(n):
        return n & (n - 1) == 0
    broken = sorted(n for n, o in outcomes.items() if o != "pass")
    fine = [n for n, o in outcomes.items() if n > 1 and o == "pass"]
    if not broken or not fine or any(power(n) for n in broken) or not all(power(n) for n in fine):
        return ""
    text = (f" It fails only where N is not a power of two ({', '.join(map(str, broken))}): a schedule that "
            f"pairs rank r with r XOR 2^k has no partner for some ranks there. Fold the ranks beyond the "
            f"largest power of two in first, as chapter 5 (tutorials/05_algorithms.md) shows.")
    if all(n % 2 for n in broken) and not any(n % 2 == 0 and not power(n) for n in outcomes):
        text += (" (Those worlds are also the odd ones graded: a schedule that pairs ranks by parity "
                 "fails on the same worlds.)")
    return text


# Mistakes the same on every world: grading more worlds would only repeat them.
SAME_ON_EVERY_WORLD = ("not_written", "load_error", "builtin")


def _traffic_problem(name, check, case, n, reports):
    """None if the counted traffic is within what the algorithm needs, else the verdict text."""
    need = check.need(case, n)
    if need is None:
        return None, None
    counts = {r: reports[r][1] for r in range(n)}   # sent_bytes, sent_messages, recv_bytes, recv_messages
    worst_bytes = max(c[0] for c in counts.values())
    worst_msgs = max(c[1] for c in counts.values())
    worst_recv = max(c[3] for c in counts.values())
    summary = (f"with {n} ranks and {_case_words(check, case, n)}: each rank sent at most {worst_bytes} "
               f"bytes in {worst_msgs} message{'s' if worst_msgs != 1 else ''}; {need.algorithm} needs {need.ideal}")
    floor = need.min_bytes if need.min_bytes is not None else (1 if need.sent_bytes else 0)
    if n > 1 and sum(c[0] for c in counts.values()) < floor:
        # Data had to cross between ranks, yet (almost) none went through the counted calls: the
        # result came by a route the grader neither switched off nor counted (a process group's
        # own methods, a library it does not know). Such a run can never pass.
        return (f"FAIL {name}: correct, but with {n} ranks and {_case_words(check, case, n)} each rank sent "
                f"{worst_bytes} bytes: no message was counted where {need.algorithm} sends {need.ideal}. "
                f"The data crossed by a route the grader cannot see; build {name} from dist.send, "
                f"dist.recv, dist.isend, dist.irecv or dist.batch_isend_irecv: see {need.chapter}."), summary
    if need.sent_bytes is not None and worst_bytes > need.sent_bytes:
        r = max(counts, key=lambda q: counts[q][0])
        return (f"FAIL {name}: correct, but sends {worst_bytes} bytes (rank {r}) where {need.algorithm} "
                f"sends {need.ideal}, {_case_words(check, case, n)}, {n} ranks: see {need.chapter}."), summary
    if need.sent_messages is not None and worst_msgs > need.sent_messages:
        r = max(counts, key=lambda q: counts[q][1])
        return (f"FAIL {name}: correct, but rank {r} sends {worst_msgs} messages where {need.algorithm} "
                f"needs {need.ideal} ({_case_words(check, case, n)}, {n} ranks): see {need.chapter}."), summary
    if need.recv_messages is not None and worst_recv > need.recv_messages:
        r = max(counts, key=lambda q: counts[q][3])
        return (f"FAIL {name}: correct, but rank {r} receives {worst_recv} messages where "
                f"{need.algorithm} needs {need.ideal} ({_case_words(check, case, n)}, {n} ranks): "
                f"see {need.chapter}."), summary
    return None, summary


def grade(name, solution=None, quick=False, hang_seconds=None, world_sizes=None, verbose=True):
    """Grade ``solution`` for exercise ``name``; print the verdict and return it.

    Args:
        name (str): The exercise, which is also the function's name, e.g. "all_reduce".
        solution: None (the exercise file ``tutorials/exercises/NAME.py``), a path to a
            ``.py`` file, a module name, or a function (one defined in a notebook works:
            its source and the imports it uses are written to a temporary file). For a
            numeric exercise of chapter 13 (``_numeric.NUMERIC``), the number.
        quick (bool): Worlds of 1-4 ranks and fewer cases (seconds, for notebooks and tests).
        hang_seconds (float, optional): How long no rank may make a call before the world is
            declared deadlocked (default 15, or ``GRADER_HANG_SECONDS``).
        world_sizes (tuple, optional): Override the world sizes.
        verbose (bool): Print the verdict.

    Returns:
        Verdict: ``.passed``, ``.reason``, ``.text``. A verdict on the learner's own file (no
        ``solution``) or a numeric answer is remembered for ``--list`` (:func:`remember`).

    Example::

        >>> grade("all_reduce", "tutorials/exercises/solutions/all_reduce.py", quick=True).passed
        True
    """
    verdict = _grade(name, solution, quick, hang_seconds, world_sizes, verbose)
    if (solution is None or name in _numeric.NUMERIC) and verdict.reason != "not_written":
        remember(name, verdict, quick)
    return verdict


def _grade(name, solution, quick, hang_seconds, world_sizes, verbose):
    if name in _numeric.NUMERIC:    # a number to work out by hand (chapter 13): no world to run
        passed, text = _numeric.grade_number(name, solution)
        verdict = Verdict(name, bool(passed), "not_written" if passed is None else "pass" if passed else "wrong",
                          text)
        if verbose:
            print(verdict.text)
        return verdict
    if name not in _checks.CHECKS:
        raise ValueError(f"no exercise named {name!r}; the exercises are: "
                         f"{', '.join([*_checks.CHECKS, *_numeric.NUMERIC])}")
    check = _checks.CHECKS[name]
    # run in collectives.sim, or (a pure function) in this process: not in worlds of processes
    if getattr(check, "simulated", False) or getattr(check, "local", False):
        source, shown, tmp = resolve(name, solution)
        verdict = Verdict(name, *check.grade(name, source, shown, quick, world_sizes))
        _next_step(verdict)
        if verbose:
            print(verdict.text)
        return verdict
    sizes = world_sizes or (QUICK_WORLDS if quick else FULL_WORLDS)
    hang = HANG_SECONDS if hang_seconds is None else hang_seconds
    source, shown, tmp = resolve(name, solution)
    # The first hard failure (wrong, deadlock, crash, ...) over all worlds is the verdict; only
    # without one does the first soft failure (traffic, state, buffer: the results were right) count.
    hard, soft, summaries, counted, outcomes = None, None, [], 0, {}
    # The worlds where messages can cycle first: a deadlock (the likeliest mistake to cost time) is
    # found in the first world run, not after a world of 1 has run every case.
    order = sorted(sizes, key=lambda n: (n == 1, n))
    try:
        for n in order:
            cases = check.cases(n, quick)
            world = run_world(name, source, n, quick, hang)
            failed, late = None, None
            if world.stop is not None and world.stop[0] == "deadlock":
                failed = Verdict(name, False, "deadlock", _deadlock_text(name, world, check, cases))
            elif world.stop is not None:
                reason = world.stop[0]
                if reason in ("died", "crash") and _short_receive(world.statuses or [], world.logs):
                    reason = "buffer"
                failed = Verdict(name, False, reason, _crash_text(name, world, check, cases, shown, source))
            for index in _complete(world):
                reports = world.cases[index]
                if not all(o["ok"] for o, _ in reports.values()):
                    reason = "changed_input" if _only_inputs_changed(reports) else "wrong"
                    failed = Verdict(name, False, reason, _wrong_text(name, world, check, cases, index))
                    break
                disagree = _bits_text(name, world, check, cases, index)
                if disagree:
                    failed = Verdict(name, False, "wrong", disagree)
                    break
                counted += 1
                state = next((o["state"] for o, _ in reports.values() if "state" in o), None)
                shape = next((o["schedule"] for _, (o, _) in sorted(reports.items()) if "schedule" in o), None)
                if shape and late is None:    # right result, wrong order of work or memory held
                    late = ("schedule", f"FAIL {name}: correct, but {shape} See {check.chapter}.")
                work = _work_text(name, check, reports)
                if work and late is None:     # right result, more work than the algorithm does
                    late = ("work", work)
                if state and late is None:
                    kept, allowed, total, in_state, where = state
                    outside = ""
                    if kept > in_state:
                        outside = (f" The state dict holds {in_state} of them; the rest "
                                   f"{'are in ' + ', '.join(where[:3]) if where else 'are tensors your step made and keeps'}: "
                                   f"every tensor a step keeps alive is optimizer state, wherever it is kept.")
                    late = ("state", f"FAIL {name}: correct, but a rank keeps {kept} values of optimizer "
                            f"state where ZeRO-1 keeps about ceil(P/N) = {allowed - n} "
                            f"(P = {total} parameters, {n} ranks): see {check.chapter}.{outside}")
                unwaited = next(((r, o["unwaited"]) for r, (o, _) in sorted(reports.items())
                                 if o.get("unwaited")), None)
                if unwaited and late is None:
                    r, texts = unwaited
                    late = ("unwaited", f"FAIL {name}: correct, but rank {r} returned without waiting on "
                            f"{len(texts)} isend request{'s' if len(texts) > 1 else ''} ({texts[0]}), "
                            f"{_case_words(check, cases[index], n)}, {n} ranks. Until its wait() returns, a "
                            f"send may still be reading its buffer: the caller may change or free it, and "
                            f"the message then holds whatever was there. Call .wait() on every request "
                            f"before returning: see chapter 2 (tutorials/02_point_to_point.md).")
                buffer = _buffer_problem(name, check, cases[index], n, reports)
                if buffer and late is None:
                    late = ("buffer", buffer)
                problem, summary = _traffic_problem(name, check, cases[index], n, reports)
                if summary:
                    summaries.append(summary)
                if problem and late is None:
                    late = ("traffic", problem)
            if failed is None and world.stop is None and len(_complete(world)) != len(cases):
                failed = Verdict(name, False, "died", f"FAIL {name}: the world of {n} ended early "
                                                      f"({len(_complete(world))} of {len(cases)} cases reported).")
            if failed is not None:
                hard = failed if hard is None else hard
                outcomes[n] = failed.reason
                if failed.reason in SAME_ON_EVERY_WORLD or failed.reason == "deadlock":
                    # a deadlock costs hang_seconds a world: the first one is the verdict (within 20 s)
                    break
            elif late is not None:
                soft = Verdict(name, False, *late) if soft is None else soft
                outcomes[n] = late[0]
            else:
                outcomes[n] = "pass"
        verdict = hard if hard is not None else soft   # a Verdict that failed is falsy
        if verdict is not None:
            verdict.text += "\n" + _worlds_line(outcomes)
            skipped = [str(n) for n in sorted(sizes) if n not in outcomes]
            if skipped:
                why = ("stopped at the first deadlock: fix it, then grade again" if verdict.reason == "deadlock"
                       else "this mistake is the same on every world")
                verdict.text += f" Not run: {', '.join(skipped)} ({why})."
            else:
                verdict.text += _power_of_two_text(outcomes)
        if verdict is None:
            text = (f"PASS {name}: correct in all {counted} cases on worlds of "
                    f"{', '.join(map(str, sorted(sizes)))} ranks.")
            if summaries:
                text += f"\nTraffic {summaries[-1]}."
            verdict = Verdict(name, True, "pass", text)
        _next_step(verdict)
    finally:
        if tmp:
            for f in Path(tmp).iterdir():
                f.unlink()
            os.rmdir(tmp)
    if verbose:
        print(verdict.text)
    return verdict


def step_of(name):
    """(exercise, k, steps) if ``name`` is step k of a ladder (``_checks_ladder.LADDERS``), else None."""
    for exercise, steps in LADDERS.items():
        if name in steps:
            return exercise, steps.index(name) + 1, steps
    return None


def _next_step(verdict):
    """A passed step of a ladder says which command grades the next one."""
    where = step_of(verdict.name)
    if verdict.passed and where and where[1] < len(where[2]):
        exercise, k, steps = where
        verdict.text += (f"\nStep {k} of {len(steps)} of {exercise} done. Next: python -m tutorials.exercises.grade "
                         f"{exercise} --step {k + 1} ({steps[k]}).")


# How hard each exercise is (1-3) and about how long it takes, the first time, with its chapter read.
DIFFICULTY = {
    "send_recv_ring": (1, 15), "broadcast": (2, 30), "reduce": (2, 30), "all_gather": (1, 30),
    "reduce_scatter": (2, 30), "all_reduce": (2, 45), "all_to_all": (1, 20), "average_gradients": (1, 15),
    "zero1_step": (2, 45), "sim_all_reduce": (2, 30), "pipeline_1f1b": (3, 60), "tensor_parallel_mlp": (3, 60),
    "fsdp_step": (3, 60), "moe_dispatch": (3, 60), "ring_attention": (3, 60), "ring_attention_zigzag": (3, 90),
    "pipeline_1f1b_order": (1, 15), "pipeline_1f1b_forward": (2, 20),    # pipeline_1f1b's steps 1 and 2
    "fsdp_step_gather": (1, 15), "fsdp_step_reduce_scatter": (2, 20),     # fsdp_step's steps 1 and 2
    "moe_dispatch_counts": (1, 15), "moe_dispatch_tokens": (2, 25),       # moe_dispatch's steps 1 and 2
    "ring_attention_rotate": (1, 15), "ring_attention_merge": (2, 20),    # ring_attention's steps 1 and 2
}
NUMERIC_DIFFICULTY = (1, 10)
# How much each idea matters for understanding distributed training, 1-5 (ARENA's "importance"):
# 5 for what every data-parallel step does (all_reduce, its reduce-scatter half, averaging
# gradients, FSDP's gather and reduce-scatter), less for the specialised.
IMPORTANCE = {
    "send_recv_ring": 3, "broadcast": 3, "reduce": 3, "all_gather": 4, "reduce_scatter": 5,
    "all_reduce": 5, "all_to_all": 4, "average_gradients": 5, "zero1_step": 4, "sim_all_reduce": 3,
    "pipeline_1f1b": 4, "tensor_parallel_mlp": 4, "fsdp_step": 5, "moe_dispatch": 3, "ring_attention": 4,
    "ring_attention_zigzag": 2, "pipeline_1f1b_order": 4, "pipeline_1f1b_forward": 3,
    "fsdp_step_gather": 5, "fsdp_step_reduce_scatter": 5, "moe_dispatch_counts": 3, "moe_dispatch_tokens": 3,
    "ring_attention_rotate": 3, "ring_attention_merge": 4,
    "busbw": 4, "busbw_all_gather": 3, "alpha_beta_ring": 5, "alpha_beta_small": 4, "adam_memory": 4,
    "zero2_memory": 4, "overlap_tokens": 3, "tensor_parallel_ib": 3, "activation_memory": 4,
    "activation_memory_sp": 3, "plan_state_memory": 3,
}


def grades_path():
    """Where the verdicts on this machine are kept: ``$XDG_CACHE_HOME/collectives/grades.json``
    (``~/.cache`` without it), beside the tuning tables (``tables.cache_dir``)."""
    from collectives.tuning.tables import cache_dir
    return Path(cache_dir()) / "grades.json"


def _fingerprint(name):
    """The learner's file as it is now (its sha1), so a verdict on an older version is not shown as current."""
    import hashlib
    path = HERE / f"{name}.py"
    return hashlib.sha1(path.read_bytes()).hexdigest() if path.exists() else None


def remember(name, verdict, quick):
    """Keep ``verdict`` on ``name`` (the learner's own file) for ``--list``; a machine where the
    cache cannot be written loses only the list's column."""
    import json
    path, data = grades_path(), _load_grades()
    data[name] = {"passed": verdict.passed, "reason": verdict.reason, "quick": bool(quick),
                  "file": None if name in _numeric.NUMERIC else _fingerprint(name),
                  "when": time.strftime("%Y-%m-%d %H:%M")}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except OSError:
        pass


def _load_grades():
    import json
    try:
        return json.loads(grades_path().read_text())
    except (OSError, ValueError):
        return {}


def status(name, grades):
    """What ``--list`` says of ``name``: passed (quick: on the small worlds only), failed and why,
    changed since (the file differs from the one graded) or not graded."""
    g = grades.get(name)
    if g is None:
        return "-"
    if g.get("file") is not None and g["file"] != _fingerprint(name):
        return "changed"
    if g["passed"]:
        return "passed:quick" if g["quick"] else "passed"
    return f"failed:{g['reason']}"


def _first_sentence(text, limit=110):
    text = " ".join(text.split()).replace("``", "")
    cut = re.search(r"(?<=[a-z0-9)\]])\.\s", text)
    text = text[:cut.start() + 1] if cut else text
    text = text[:1].upper() + text[1:]
    return text if len(text) <= limit else text[:limit - 3].rsplit(" ", 1)[0] + "..."


def listing():
    """The exercises, one a line: name, chapter, difficulty, time, importance, the last verdict on
    this machine and the hint's first sentence (read from each exercise's docstring, so it is the
    hint the learner will see)."""
    from tutorials.exercises import EXERCISES
    rows = []
    for name in EXERCISES:
        doc = (HERE / f"{name}.py").read_text().split('"""')[1]
        chapter = re.search(r"Read: chapter (\d+)", doc)[1]
        hint = doc.split("Hint:", 1)[1].split("\n\n", 1)[0]
        rows.append((int(chapter), name, *DIFFICULTY[name], _first_sentence(hint)))
    for name, exercise in _numeric.NUMERIC.items():
        chapter = re.search(r"chapter (\d+)", exercise.chapter)[1]
        rows.append((int(chapter), name, *NUMERIC_DIFFICULTY, _first_sentence(exercise.question) + " (--answer)"))
    grades = _load_grades()
    width = max(len(r[1]) for r in rows)

    def cells(name, level, minutes):
        return (f"{'*' * level + '.' * (3 - level):<9}  {minutes:>3} min  "
                f"{'+' * IMPORTANCE[name] + '.' * (5 - IMPORTANCE[name])}  {status(name, grades):<14}")

    lines = [f"{'exercise':<{width}}  ch  level      time    matters  here{' ' * 10}  hint"]
    for chapter, name, level, minutes, hint in sorted(rows, key=lambda r: r[0]):
        lines.append(f"{name:<{width}}  {chapter:>2}  {cells(name, level, minutes)}  {hint}")
        for k, step in enumerate(LADDERS.get(name, [])[:-1], 1):   # the last step is the exercise itself
            doc = (HERE / f"{step}.py").read_text().split('"""')[1]
            lines.append(f"{'  --step ' + str(k):<{width}}  {chapter:>2}  {cells(step, *DIFFICULTY[step])}  "
                         f"{step}: {_first_sentence(doc.split('Hint:', 1)[1].split(chr(10) * 2, 1)[0], 80)}")
    lines.append("matters: how much the idea matters for distributed training (+++++ most); here: the last "
                 "verdict on this machine on your file (passed:quick = on --quick's worlds only).")
    lines.append("Grade one: python -m tutorials.exercises.grade NAME (--quick for worlds of 1-4 ranks; "
                 "--step K for step K of an exercise that lists steps).")
    return "\n".join(lines)


# exercises whose function has the algorithm modules' signature (comm, tensor, op): their run can be drawn
HTML_COLLECTIVE = {"sim_all_reduce": "all_reduce"}
# exercises written against torch's API with a collective's arguments (all_reduce(tensor, group=None),
# ...): drawn from real processes, their torch.distributed messages going through our door
HTML_TORCH = {name: name for name in ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter",
                                      "all_to_all")}


def draw(name, solution, path, world_size=4, real=False, hang_seconds=None):
    """Draw the learner's run beside the reference's (``collectives.viz.side_by_side``) in ``path``;
    return what to print: where the page is, and what it shows went wrong.

    ``real``: both runs in real processes (gloo, one host) instead of the simulator; a rank that
    waits ``hang_seconds`` for a message is drawn as a deadlock. A real world that fails
    otherwise writes nothing, and what is returned says why (the launcher's verdict).

    An exercise written against torch's API (:data:`HTML_TORCH`: ``all_reduce``, ``broadcast``,
    ...) always runs in real processes, beside the exercise's reference solution, its
    ``torch.distributed`` point-to-point calls going through this library's door, where every
    message is seen (``collectives.viz.record_real(..., calls="torch")``)."""
    import importlib

    from collectives import viz
    from collectives.tools.launch import WorldError
    from tutorials.exercises._common import load

    source, shown, tmp = resolve(name, solution)
    hang = viz.record.REAL_HANG if hang_seconds is None else hang_seconds
    torch_api = name in HTML_TORCH
    try:
        fn = load(name, source)
        if torch_api:
            reference = getattr(importlib.import_module(f"tutorials.exercises.solutions.{name}"), name)
            written, data = viz.side_by_side(HTML_TORCH[name], fn, world_size, path, reference=reference,
                                             hang=hang, calls="torch")
        else:
            written, data = viz.side_by_side(HTML_COLLECTIVE[name], fn, world_size, path, real=real, hang=hang)
    except (WorldError, TimeoutError) as exc:
        return f"Not drawn: the real run of {shown} on {world_size} ranks failed, nothing written:\n{exc}"
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    how = ("real processes (its torch.distributed messages through our door)" if torch_api else
           "real processes (gloo)" if real else "the simulator")
    lines = [f"Drawn: {written} ({shown} on {world_size} ranks in {how}, beside the reference)."]
    if data.get("failure"):
        report = data["failure"]["report"].replace("\n", "\n    ")
        lines.append(f"  The page shows the deadlock:\n    {report}")
    if data.get("wrong"):
        lines.append(f"  The page marks the first wrong chunk: {data['wrong']['text']}")
    for u in data.get("unwaited") or ():
        lines.append(f"  Never waited on: rank {u['rank']}'s {'isend to' if u['kind'] == 'send' else 'irecv from'} "
                     f"rank {u['peer']} (step {u['step']}, {u['nbytes']} B)")
    return "\n".join(lines)


def main(argv=None):
    if argv is None:
        argv = sys.argv[1:]
    if "--list" in argv:
        print(listing())
        return 0
    parser = argparse.ArgumentParser(description="Grade an exercise of tutorials/exercises/ "
                                                 "(--list: every exercise, its chapter, difficulty and a hint).")
    parser.add_argument("name", choices=[*_checks.CHECKS, *_numeric.NUMERIC],
                        help="the exercise (the function's name, or a numeric exercise of chapter 13)")
    parser.add_argument("--answer", help="your number, for a numeric exercise (chapter 13)")
    parser.add_argument("--solution", help="file defining the function (default: tutorials/exercises/NAME.py)")
    parser.add_argument("--step", type=int, default=None,
                        help="grade step K of the exercise's ladder instead (" + ", ".join(
                            f"{name}: 1-{len(steps)}" for name, steps in LADDERS.items()) + ")")
    parser.add_argument("--quick", action="store_true", help="worlds of 1-4 ranks and fewer cases")
    parser.add_argument("--hang-seconds", type=float, default=None,
                        help=f"seconds without progress before a deadlock is declared (default {HANG_SECONDS:g})")
    parser.add_argument("--worlds", type=lambda text: tuple(int(n) for n in text.split(",")), default=None,
                        help="comma-separated world sizes to run instead (e.g. 2,3)")
    parser.add_argument("--html", metavar="FILE", default=None,
                        help="also draw your run beside the reference's in FILE (collectives.viz.side_by_side): "
                             "for the collectives written against torch's API (" + ", ".join(HTML_TORCH) + "), "
                             "from real processes; for those written against the door (" + ", ".join(HTML_COLLECTIVE)
                             + "), from the simulator, or real processes with --real")
    parser.add_argument("--html-ranks", type=int, default=4, help="ranks in the drawing")
    from collectives.viz.record import REAL_HANG
    parser.add_argument("--real", action="store_true",
                        help="with --html, for an exercise written against the door: draw both runs from real processes (gloo, one host) instead of the "
                             f"simulator; a rank that waits --hang-seconds for a message (default {REAL_HANG:g}) "
                             "draws a deadlock")
    args = parser.parse_args(argv)
    if args.step is not None:
        steps = LADDERS.get(args.name)
        if steps is None:
            parser.error(f"{args.name} has no steps; the exercises with steps: {', '.join(LADDERS)}")
        if not 1 <= args.step <= len(steps):
            parser.error(f"{args.name} has steps 1 to {len(steps)}")
        args.name = steps[args.step - 1]
    if args.real and not args.html:
        parser.error("--real says how --html draws (real processes); give --html FILE too")
    if args.html and args.name not in HTML_COLLECTIVE and args.name not in HTML_TORCH:
        parser.error(f"--html draws the collectives' exercises ({', '.join([*HTML_TORCH, *HTML_COLLECTIVE])}); "
                     f"{args.name} is not one of them")
    if args.name in _numeric.NUMERIC:
        if args.answer is None:
            print(f"{args.name}: {_numeric.NUMERIC[args.name].question}\nAnswer with --answer NUMBER.")
            return 1
        return 0 if grade(args.name, args.answer).passed else 1
    verdict = grade(args.name, args.solution, quick=args.quick, hang_seconds=args.hang_seconds,
                    world_sizes=args.worlds)
    if args.html:
        print(draw(args.name, args.solution, args.html, args.html_ranks, real=args.real,
                   hang_seconds=args.hang_seconds))
    return 0 if verdict.passed else 1


if __name__ == "__main__":
    sys.exit(main())
