"""Tuning tables: where they live, how they are read, and how a benchmark writes one.

A table is JSON: ``{"choices": {collective: {N: [[size, algorithm], ...]}},
"models": {N: {alpha, beta, gamma, ...}}, "model": {...}, "measured": [...]}``.
``python -m benchmarks.tune`` measures one for this machine into the per-user cache;
the package ships one measured on this project's 2-core machine.
"""
import functools
import hashlib
import json
import math
import os
import platform
import re
import socket
import warnings

from .. import settings
from ..algorithms import ALGORITHMS

SMALL_BYTES = 64 * 1024
BEYOND = 4
TABLE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tuning_table.json")


def table_path():
    """The shipped table ``algorithm=None`` falls back to: ``COLLECTIVES_TUNING_TABLE`` if set,
    else the packaged one."""
    return settings.tuning_table() or TABLE_PATH


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


def _kind(x):
    """A JSON value's kind, in JSON's words."""
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(x), "number")


def _number(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _figure_set(figures):
    """Whether ``figures`` is what ``cost_model.fit_calls`` and ``fit_algorithms`` write."""
    return isinstance(figures, dict) and all(_number(figures.get(k)) for k in ("call", "alpha", "beta", "gamma"))


def problem(table):
    """What is wrong with ``table`` (a parsed JSON value) as a tuning table, or None.

    The shape :func:`write_table` writes: an object whose ``choices`` maps each collective
    to {group size: [[size in bytes, algorithm], ...]}, and whose ``models``/``model`` hold
    finite ``alpha``, ``beta`` and ``gamma``.
    """
    if not isinstance(table, dict):
        return f"the file holds a JSON {_kind(table)}, not an object"
    choices = table.get("choices", {})
    if not isinstance(choices, dict):
        return f'"choices" is a JSON {_kind(choices)}, not an object'
    for collective, by_n in choices.items():
        if collective not in ALGORITHMS:
            return f'"choices" names an unknown collective {collective!r}'
        if not isinstance(by_n, dict):
            return f'"choices"."{collective}" is a JSON {_kind(by_n)}, not an object of group sizes'
        for n, points in by_n.items():
            where = f'"choices"."{collective}"."{n}"'
            if not n.isdigit() or int(n) < 1:
                return f'"choices"."{collective}" has a group size {n!r} that is not a positive integer'
            if not isinstance(points, list) or not points:
                return f"{where} must be a non-empty list of [size, algorithm] pairs"
            for point in points:
                if not (isinstance(point, list) and len(point) == 2 and _number(point[0]) and point[0] > 0
                        and isinstance(point[1], str)):
                    return f"{where} holds {json.dumps(point)[:60]}, not a [size in bytes, algorithm] pair"
                if point[1] not in ALGORITHMS[collective]:
                    return f"{where} names an unknown algorithm {point[1]!r} for {collective}"
    models = table.get("models", {})
    if not isinstance(models, dict):
        return f'"models" is a JSON {_kind(models)}, not an object'
    for name, params in [(f'"models"."{n}"', p) for n, p in models.items()] + \
            ([('"model"', table["model"])] if table.get("model") is not None else []):
        if name.startswith('"models"') and not name[10:-1].isdigit():
            return f"{name} is not a group size"
        if not isinstance(params, dict):
            return f"{name} is a JSON {_kind(params)}, not an object"
        for key in ("alpha", "beta", "gamma"):
            if not _number(params.get(key)):
                return f"{name} lacks a finite number {key!r}"
        calls = params.get("calls")
        if calls is not None and not _figure_set(calls):
            return f'{name}."calls" must hold finite numbers "call", "alpha", "beta" and "gamma"'
        own = params.get("algorithms", {})
        if not (isinstance(own, dict) and all(isinstance(by, dict) and all(map(_figure_set, by.values()))
                                              for by in own.values())):
            return (f'{name}."algorithms" must map a collective to algorithms, each with finite numbers '
                    f'"call", "alpha", "beta" and "gamma"')
        if "torch_call" in params and not (_number(params["torch_call"]) and params["torch_call"] >= 0):
            return f'{name}."torch_call" must be a finite number of seconds, 0 or more'
    return None


def _checked(path, table, what):
    """``table`` if it is a tuning table; else a ValueError naming the file and what is wrong."""
    wrong = problem(table)
    if wrong:
        raise ValueError(f"{what} {path} is damaged: {wrong}. Delete it, or measure a new one with "
                         f"python -m benchmarks.tune")
    return table


@functools.lru_cache(maxsize=None)
def shipped():
    """The shipped table (or ``COLLECTIVES_TUNING_TABLE``'s)."""
    path = table_path()
    try:
        table = _read(path)
    except (OSError, ValueError) as exc:
        if path != TABLE_PATH:  # a table the user named must exist: a typo would pass unnoticed
            raise ValueError(f"COLLECTIVES_TUNING_TABLE={path}: cannot read a tuning table ({exc})") from None
        return {}
    return _checked(path, table, "COLLECTIVES_TUNING_TABLE" if path != TABLE_PATH else "the shipped tuning table")


@functools.lru_cache(maxsize=None)
def measured_here():
    """This machine's measured table, or {} if ``collectives-tune`` has not run here.

    The table is a cache in the user's cache folder, disposable: a damaged one (not JSON,
    or JSON of the wrong shape) is named in one warning per process (this function's
    cache) and the shipped table is used instead; it made every ``algorithm=None`` call raise.
    """
    if settings.tuning_table():
        return {}
    path = cache_path()
    try:
        table = _read(path)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        return _unusable(f"this machine's tuning table {path} is damaged: it is not JSON ({exc})")
    wrong = problem(table)
    if wrong:
        return _unusable(f"this machine's tuning table {path} is damaged: {wrong}")
    return table


def _unusable(why):
    warnings.warn(f"{why}. Using the shipped table instead; delete the file, or measure a new one "
                  f"with python -m benchmarks.tune", RuntimeWarning, stacklevel=3)
    return {}


def forget():
    """Forget every table read so far (after a new one was written)."""
    shipped.cache_clear()
    measured_here.cache_clear()


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


UNTUNED, UNTUNED_AGAIN = "untuned", "untuned_again"
# Above this share of the machine's CPU used by other processes while tuning, a point keeps
# its untuned choice (rows' "others_cpu", benchmarks.common.OtherWork).
BUSY_SHARE = 0.25


def busy(others_cpu):
    """True where other processes used more than ``BUSY_SHARE`` of the machine's CPU while a
    measurement ran (``others_cpu``: their share, or None where it was not measured)."""
    return others_cpu is not None and others_cpu > BUSY_SHARE


def _quantile(xs, q):
    xs = sorted(xs)
    i = q * (len(xs) - 1)
    lo, hi = math.floor(i), math.ceil(i)
    return xs[lo] + (xs[hi] - xs[lo]) * (i - lo)


def decide_from_rows(rows):
    """({collective: {N: [[size, algorithm], ...]}}, evidence): tuning that noise cannot fool.

    At each point the rows hold, beside every timed algorithm, the *untuned* choice (what
    ``algorithm=None`` picks without this machine's table) twice, labelled ``untuned`` and
    ``untuned_again``; all were timed side by side, round by round (``samples_us``). The
    second copy against the first is the noise of the same code against itself. Another
    algorithm replaces the untuned choice only where it beat it round by round by more
    than that noise: its median time ratio below ``1 - noise`` and its upper quartile
    below 1, where ``noise`` is the larger of the self ratio's distance from 1 and its
    interquartile spread. Elsewhere the untuned choice stays, so a table tuned on a busy
    machine cannot make a point slower than the untuned choice by more than the noise.
    And where other processes used more than ``BUSY_SHARE`` of the machine's CPU while the
    point was measured (the rows' ``others_cpu``), the untuned choice stays whatever the
    rounds say: beside other work they measure that work's effect (an algorithm with fewer
    wake-ups wins while the cores are taken), which the self-against-self noise cannot see,
    since the load slows both copies alike.
    Points without the untuned rows (an older benchmark's) fall back to
    :func:`best_from_rows`.
    """
    points = {}
    for r in rows:
        points.setdefault((r["collective"], r["world_size"], r["size"]), {})[r["algorithm"]] = r
    out, evidence, legacy = {}, [], []
    for (collective, n, size), by_label in sorted(points.items()):
        base, again = by_label.get(UNTUNED), by_label.get(UNTUNED_AGAIN)
        if base is None or again is None or not base.get("samples_us"):
            legacy += list(by_label.values())
            continue
        b = base["samples_us"]
        self_ratio = [x / y for x, y in zip(again["samples_us"], b) if y > 0]
        noise = max(abs(1 - _quantile(self_ratio, 0.5)),
                    _quantile(self_ratio, 0.75) - _quantile(self_ratio, 0.25)) if self_ratio else 1.0
        best, best_ratio = base["untuned_algorithm"], 1.0
        others = base.get("others_cpu")
        candidates = {} if busy(others) else by_label
        for label, r in candidates.items():
            if label in (UNTUNED, UNTUNED_AGAIN) or label not in ALGORITHMS[collective] or not r.get("samples_us"):
                continue
            ratio = [x / y for x, y in zip(r["samples_us"], b) if y > 0]
            if not ratio:
                continue
            median, upper = _quantile(ratio, 0.5), _quantile(ratio, 0.75)
            if median < 1 - noise and upper < 1 and median < best_ratio:
                best, best_ratio = label, median
        evidence.append({"collective": collective, "world_size": n, "size": size,
                         "untuned": base["untuned_algorithm"], "chosen": best,
                         "ratio": round(best_ratio, 4), "noise": round(noise, 4),
                         **({"others_cpu": round(others, 3)} if others is not None else {})})
        out.setdefault(collective, {}).setdefault(str(n), []).append([size, best])
    for collective, by_n in best_from_rows(legacy).items():
        for n, pts in by_n.items():
            out.setdefault(collective, {}).setdefault(n, []).extend(pts)
    for by_n in out.values():
        for pts in by_n.values():
            pts.sort()
    return out, evidence


def write_table(path, rows, model, meta):
    """Merge the fastest algorithms measured in ``rows`` into the table at ``path``.

    ``model``: {group size: fitted parameters} (may be empty); ``meta``: what was run where.
    """
    try:
        table = _read(path)
    except (OSError, ValueError):
        table = {}
    choices = table.setdefault("choices", {})
    decided, evidence = decide_from_rows(rows)
    for collective, by_n in decided.items():
        choices.setdefault(collective, {}).update(by_n)
    if evidence:
        table["evidence"] = evidence
    # the transport the measurements went through (a table tuned over gloo's loopback says
    # little about shared memory, and the reverse)
    table["transport"] = meta.get("transport", "gloo")
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
    forget()
