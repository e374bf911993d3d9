"""The library's own working code, switched off for the learner's solution while it is graded.

The exercises ask for a collective built from point-to-point messages; the course's library
holds a finished one of each. Every way into it is a free route to a right answer:

* ``collectives.all_reduce`` and its public twins (``api``, ``tensor_api``);
* ``collectives.p2p_api`` (torch's send/recv names, over the library's door);
* ``collectives.call`` and the door itself (``collectives.p2p_communications.Comm``);
* ``collectives.algorithms.*`` (e.g. ``all_reduce_ring.all_reduce(comm, tensor, op)``);
* ``collectives.parallel.*`` (e.g. ``ring_attention.ring_attention``).

:func:`switch_off` wraps every function and every class's methods defined in those modules
(and the module attributes that name them) so that a call *made from the learner's file*
raises :class:`BuiltinUsed` naming the route. Only the direct caller is looked at: the
grader's own reference code, and the library calling itself on the grader's behalf (the
simulator's door), run as before. A route this list misses still shows: its messages are
not counted, and a run on N > 1 ranks that counts less traffic than the algorithm's lower
bound fails (grade.py's ``_traffic_problem``).
"""
import importlib
import inspect
import os
import pkgutil
import sys
import traceback

# Whole sub-packages, and single modules, whose code a solution must not call.
PACKAGES = ("collectives.algorithms", "collectives.parallel")
MODULES = ("collectives", "collectives.api", "collectives.tensor_api", "collectives.p2p_api",
           "collectives.call", "collectives.p2p_communications")
# The collectives by their public names, wherever a module re-exports them.
LIBRARY = ["broadcast", "reduce", "all_reduce", "scatter", "gather", "all_gather", "reduce_scatter",
           "all_to_all", "barrier", "average_gradients"]


class BuiltinUsed(RuntimeError):
    """Raised by a built-in collective, or the library's own code, while a solution is graded."""

    def __init__(self, name):
        super().__init__(f"{name} was called")
        self.name = name


def source_file(source):
    """The absolute path of the learner's file: ``source`` is a .py path or a module name."""
    if source.endswith(".py"):
        return os.path.abspath(source)
    spec = importlib.util.find_spec(source)
    return os.path.abspath(spec.origin) if spec and spec.origin else None


def where_called(exc, source):
    """'line N of FILE: code' for the learner's last frame under ``exc`` (the call that took a
    forbidden route), or None if no frame of the learner's file is on its stack."""
    mine = source_file(source)
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if os.path.abspath(f.filename) == mine]
    if not frames:
        return None
    return f"line {frames[-1].lineno} of {os.path.basename(frames[-1].filename)}: {(frames[-1].line or '').strip()}"


def _modules():
    names = list(MODULES)
    for package in PACKAGES:
        try:
            pkg = importlib.import_module(package)
        except ImportError:
            continue
        names.append(package)
        names += [f"{package}.{m.name}" for m in pkgutil.iter_modules(pkg.__path__)]
    found = []
    for name in names:
        try:
            found.append(importlib.import_module(name))
        except ImportError:   # a module needing an extra (e.g. a plotting library): not a route here
            continue
    return found


def _guard(fn, where, learner):
    def guarded(*args, **kwargs):
        caller = sys._getframe(1)
        if os.path.abspath(caller.f_code.co_filename) == learner:
            raise BuiltinUsed(where)
        return fn(*args, **kwargs)
    guarded.__name__ = getattr(fn, "__name__", "guarded")
    guarded.__qualname__ = getattr(fn, "__qualname__", guarded.__name__)
    guarded.__doc__ = getattr(fn, "__doc__", None)
    guarded.__wrapped__ = fn
    return guarded


def switch_off(source):
    """Make every route into the library raise when called from ``source``; return an undo.

    Args:
        source (str): The learner's solution, a .py path or a module name.

    Returns:
        callable: Puts every wrapped attribute back (the simulator grades in the parent process).
    """
    learner = source_file(source)
    if learner is None:
        return lambda: None
    undo = []

    def replace(owner, attr, value):
        undo.append((owner, attr, owner.__dict__[attr] if attr in vars(owner) else getattr(owner, attr)))
        setattr(owner, attr, value)

    wrapped = {}   # id(original) -> guarded, so one function has one wrapper under all its names
    for module in _modules():
        for attr, obj in list(vars(module).items()):
            if attr.startswith("__"):
                continue
            if inspect.isfunction(obj) and (obj.__module__ or "").startswith("collectives"):
                if id(obj) not in wrapped:
                    wrapped[id(obj)] = _guard(obj, f"{obj.__module__}.{obj.__qualname__}", learner)
                replace(module, attr, wrapped[id(obj)])
            elif inspect.isclass(obj) and obj.__module__ == module.__name__:
                for name, member in list(vars(obj).items()):
                    if inspect.isfunction(member) and (not name.startswith("__") or name == "__init__"):
                        replace(obj, name, _guard(member, f"{module.__name__}.{obj.__qualname__}.{name}",
                                                  learner))

    def restore():
        for owner, attr, value in reversed(undo):
            setattr(owner, attr, value)
    return restore
