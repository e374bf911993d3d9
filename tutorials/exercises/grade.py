"""Grade an exercise: run your function in real worlds of processes and say what is wrong.

    python -m tutorials.exercises.grade all_reduce                      # grades tutorials/exercises/all_reduce.py
    python -m tutorials.exercises.grade all_reduce --solution mine.py   # or any file defining all_reduce
    python -m tutorials.exercises.grade all_reduce --quick              # fewer world sizes and cases

From Python or a notebook cell::

    from tutorials.exercises.grade import grade
    grade("all_reduce", my_all_reduce, quick=True)   # a function, a file path or a module name

What is checked, in order (the first failure is the verdict; exit status 0 only on a pass):

1. **Results**, against what the built-in returns, on worlds of 1, 2, 3, 4, 5 and 8
   ranks, tensors of 0, 1, 7 and 33600 elements, several dtypes, roots other
   than 0. The first wrong case is shown with each rank's expected and received values.
2. **No built-in collective**: while grading, ``dist.all_reduce`` and every other
   collective raise; a solution that calls one is told which and where.
3. **Traffic**: bytes and messages each rank sends, counted from its
   ``send``/``isend``/``batch_isend_irecv`` calls, against what the algorithm needs.
4. **Deadlock**: when no rank makes a call for ``hang_seconds`` (default 15), the
   world is stopped and the verdict shows the call and peer each rank was stuck in.
5. **Crash**: the traceback of the rank that raised, once.
"""
import argparse
import ctypes
import inspect
import linecache
import os
import queue
import sys
import tempfile
import textwrap
import time
import types
from pathlib import Path

import torch.multiprocessing as mp

from collectives.tools.launch import free_port
from tutorials.exercises import _checks, _worker

HERE = Path(__file__).resolve().parent
FULL_WORLDS = (1, 2, 3, 4, 5, 8)
QUICK_WORLDS = (1, 2, 3, 4)
HANG_SECONDS = float(os.environ.get("GRADER_HANG_SECONDS", 15))
START_SECONDS = 120      # a world that has not started by then is reported, not waited on
WORLD_SECONDS = float(os.environ.get("GRADER_WORLD_SECONDS", 300))   # all cases of one world, once started


class Verdict:
    """The grader's answer: ``passed`` (bool), ``text`` (what it printed), ``reason`` (one word).

    ``reason`` is one of "pass", "wrong", "builtin", "traffic", "state",
    "deadlock", "crash", "not_written", "load_error", "died", "slow".
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


def run_world(name, source, n, quick, hang_seconds):
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["tutorials.exercises._worker"])
    status = ctx.RawArray(ctypes.c_char, n * _worker.SLOT)
    progress = ctx.RawArray(ctypes.c_longlong, n)
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker.worker, daemon=True,
                         args=(r, n, port, name, source, quick, status, progress, results)) for r in range(n)]
    for p in procs:
        p.start()
    world, ready, done = World(n), set(), set()
    started = last_change = time.monotonic()
    last, stop_at = None, None
    try:
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
                    stop_at = time.monotonic() + 1.0   # collect the other ranks' reports for a moment
                else:
                    world.others[rank] = (kind, payload)
            snapshot = tuple(progress)
            if snapshot != last:
                last, last_change = snapshot, now
            if world.stop is None:
                if len(ready) == n and now - last_change > hang_seconds:
                    world.stop = ("deadlock", None, len(_complete(world)), hang_seconds)
                    world.statuses = [_status_of(status, r) for r in range(n)]
                    break
                if len(ready) == n and now - started > START_SECONDS + WORLD_SECONDS:
                    world.stop = ("slow", None, len(_complete(world)), WORLD_SECONDS)
                    world.statuses = [_status_of(status, r) for r in range(n)]
                    break
                if len(ready) < n and now - started > START_SECONDS:
                    world.stop = ("died", None, None, f"the world of {n} did not start in {START_SECONDS} s")
                    break
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in done]
                if dead:
                    r = dead[0]
                    world.stop = ("died", r, len(_complete(world)),
                                  f"rank {r} died with exit code {procs[r].exitcode} (no Python traceback)")
                    world.statuses = [_status_of(status, q) for q in range(n)]
                    stop_at = time.monotonic() + 1.0
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        for p in procs:
            p.join(timeout=5)
        results.close()
    return world


def _status_of(status, rank):
    raw = bytes(status[rank * _worker.SLOT:(rank + 1) * _worker.SLOT])
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
    if not waiting and busy:
        lines.append(f"No rank is waiting for a message: {_ranks(busy)} {'is' if len(busy) == 1 else 'are'} "
                     f"still running your code after the call shown (an endless loop?).")
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


UNCHANGED = "(unchanged:"


def _wrong_text(name, world, check, cases, index):
    reports = world.cases[index]
    lines = [f"FAIL {name}: wrong result with {_world(world.n)}, "
             f"{_case_words(check, cases[index], world.n)} (case {index + 1} of {len(cases)})."]
    shown = {r: reports[r][0]["lines"] or [""] for r in range(world.n)}
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
    return "\n".join(lines)


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
            its source and the imports it uses are written to a temporary file).
        quick (bool): Worlds of 1-4 ranks and fewer cases (seconds, for notebooks and tests).
        hang_seconds (float, optional): How long no rank may make a call before the world is
            declared deadlocked (default 15, or ``GRADER_HANG_SECONDS``).
        world_sizes (tuple, optional): Override the world sizes.
        verbose (bool): Print the verdict.

    Returns:
        Verdict: ``.passed``, ``.reason``, ``.text``.

    Example::

        >>> grade("all_reduce", "tutorials/exercises/solutions/all_reduce.py", quick=True).passed
        True
    """
    if name not in _checks.CHECKS:
        raise ValueError(f"no exercise named {name!r}; the exercises are: {', '.join(_checks.CHECKS)}")
    check = _checks.CHECKS[name]
    if getattr(check, "simulated", False):   # run in collectives.sim, not in worlds of processes
        source, shown, tmp = resolve(name, solution)
        verdict = Verdict(name, *check.grade(name, source, shown, quick, world_sizes))
        if verbose:
            print(verdict.text)
        return verdict
    sizes = world_sizes or (QUICK_WORLDS if quick else FULL_WORLDS)
    hang = HANG_SECONDS if hang_seconds is None else hang_seconds
    source, shown, tmp = resolve(name, solution)
    verdict, traffic_fail, summaries, counted = None, None, [], 0
    try:
        for n in sizes:
            cases = check.cases(n, quick)
            world = run_world(name, source, n, quick, hang)
            if world.stop is not None and world.stop[0] == "deadlock":
                verdict = Verdict(name, False, "deadlock", _deadlock_text(name, world, check, cases))
            elif world.stop is not None:
                verdict = Verdict(name, False, world.stop[0], _crash_text(name, world, check, cases, shown, source))
            for index in _complete(world):
                reports = world.cases[index]
                if not all(o["ok"] for o, _ in reports.values()):
                    verdict = Verdict(name, False, "wrong", _wrong_text(name, world, check, cases, index))
                    break
                counted += 1
                state = next((o["state"] for o, _ in reports.values() if "state" in o), None)
                if state and traffic_fail is None:
                    kept, allowed, total = state
                    traffic_fail = ("state", f"FAIL {name}: correct, but a rank keeps {kept} values of optimizer "
                                    f"state where ZeRO-1 keeps about ceil(P/N) = {allowed - n} "
                                    f"(P = {total} parameters, {n} ranks): see {check.chapter}.")
                problem, summary = _traffic_problem(name, check, cases[index], n, reports)
                if summary:
                    summaries.append(summary)
                if problem and traffic_fail is None:
                    traffic_fail = ("traffic", problem)
            if verdict is not None:
                break
            if world.stop is None and len(_complete(world)) != len(cases):
                verdict = Verdict(name, False, "died", f"FAIL {name}: the world of {n} ended early "
                                                       f"({len(_complete(world))} of {len(cases)} cases reported).")
                break
        if verdict is None and traffic_fail is not None:
            verdict = Verdict(name, False, *traffic_fail)
        if verdict is None:
            text = (f"PASS {name}: correct in all {counted} cases on worlds of "
                    f"{', '.join(map(str, sizes))} ranks.")
            if summaries:
                text += f"\nTraffic {summaries[-1]}."
            verdict = Verdict(name, True, "pass", text)
    finally:
        if tmp:
            for f in Path(tmp).iterdir():
                f.unlink()
            os.rmdir(tmp)
    if verbose:
        print(verdict.text)
    return verdict


def main(argv=None):
    parser = argparse.ArgumentParser(description="Grade an exercise of tutorials/exercises/.")
    parser.add_argument("name", choices=list(_checks.CHECKS), help="the exercise (the function's name)")
    parser.add_argument("--solution", help="file defining the function (default: tutorials/exercises/NAME.py)")
    parser.add_argument("--quick", action="store_true", help="worlds of 1-4 ranks and fewer cases")
    parser.add_argument("--hang-seconds", type=float, default=None,
                        help=f"seconds without progress before a deadlock is declared (default {HANG_SECONDS:g})")
    parser.add_argument("--worlds", type=lambda text: tuple(int(n) for n in text.split(",")), default=None,
                        help="comma-separated world sizes to run instead (e.g. 2,3)")
    args = parser.parse_args(argv)
    verdict = grade(args.name, args.solution, quick=args.quick, hang_seconds=args.hang_seconds,
                    world_sizes=args.worlds)
    return 0 if verdict.passed else 1


if __name__ == "__main__":
    sys.exit(main())
