"""Start a world of processes: the one launcher for training, demos, tests and benchmarks.

Every rank reads its place in the job from the environment torchrun defines
(``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT``). Under ``torchrun`` those are already set;
otherwise :func:`start_world` starts the processes and sets them. One implementation
serves every caller:

* :func:`start_world` starts ``world_size`` local processes around a store it
  hosts on a free port (or a valid ``MASTER_PORT``), as torchrun's agent does,
  calls ``fn(*args)`` in each and returns what each
  returned. When a rank raises or dies, the others are stopped (SIGTERM, then
  SIGKILL) and :class:`WorldError` names the rank that caused it, with its
  traceback, once. A hard ``timeout`` kills every process instead of hanging, and
  its error shows where each unfinished rank was: every thread's Python stack.
  Workers die with the launcher (``PR_SET_PDEATHSIG``), so none is orphaned.
* :func:`run_job`: the command-line form (training, benchmarks): under torchrun
  it calls ``fn`` in this process; otherwise :func:`start_world`, the failure report
  on stderr, and an exit code.
* :func:`run_in_group`: :func:`start_world` with each rank already in a process group,
  calling ``fn(rank, world_size, *args)``: what demos and tests use.
* :func:`init_process_group`: inside a rank, join the job and pick the backend
  and device from every rank's host and GPU count (``--backend auto``).
* ``lab=`` (every launcher's ``--lab hosts=K[,ranks-per-host=L][,rate=1gbit]``): the
  world runs in a lab of K hosts joined by rate-limited links (:mod:`collectives.tools.lab`),
  each rank inside its host, told its place as torchrun would (``LOCAL_RANK``,
  ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``) and the lab's layout (``COLLECTIVES_LAB_LAYOUT``).
  The lab is built for the world and gone after it.

Example::

    >>> run_in_group(hello, 2)   # hello(rank, world_size) returns f"rank {rank}"
    ['rank 0', 'rank 1']
"""
import contextlib
import ctypes
import faulthandler
import json
import os
import queue
import shutil
import signal
import socket
import sys
import tempfile
import time
import traceback
from collections import Counter
from multiprocessing.reduction import ForkingPickler

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from . import lab as lab_tools
from .. import engine


class SetupError(RuntimeError):
    """A job that cannot run as configured (port, GPUs, arguments): reported as its message alone."""


class WorldError(RuntimeError):
    """A rank of a started world failed.

    ``rank`` is the rank that caused it; ``errors`` maps each failed rank to its
    traceback text, or to ``("died", exit_code)`` when it left none.
    """

    def __init__(self, message, rank, errors):
        super().__init__(message)
        self.rank, self.errors = rank, errors


# --- where the job meets -------------------------------------------------------------------

def free_port(addr="127.0.0.1"):
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def master_port(value):
    """``MASTER_PORT``'s value as a port number, or :class:`SetupError` naming it.

    Port 0 would let every rank 0 listen somewhere new while the others knock
    on port 0, so it hangs instead of failing: refused like 99999.
    """
    try:
        port = int(value)
    except ValueError:
        port = -1
    if not 1 <= port <= 65535:
        raise SetupError(f"MASTER_PORT={value} is not a port the job can meet on (1-65535); "
                         f"give one, or unset MASTER_PORT to get a free one.")
    return port


def check_port(addr, port):
    """Raise :class:`SetupError` if ``port`` cannot be listened on at ``addr``."""
    with socket.socket() as s:
        try:
            s.bind((addr, port))
        except OSError as exc:
            raise SetupError(
                f"MASTER_PORT={port} on {addr} is not available ({exc.strerror}); another job may "
                f"be using it. Pick another port, or unset MASTER_PORT to get a free one.") from None


def under_torchrun():
    """True when this process was started by torchrun (or another launcher that sets RANK/WORLD_SIZE)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def place():
    """(rank, local_rank, world_size, local_world_size) of this process, from the environment."""
    env = os.environ
    world = int(env["WORLD_SIZE"])
    return (int(env["RANK"]), int(env.get("LOCAL_RANK", env["RANK"])), world,
            int(env.get("LOCAL_WORLD_SIZE", world)))


# --- backend and device: decided from every rank's host, the same on every rank ------------

def visible_gpus():
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def exchange_placement(store, rank, world_size):
    """Every rank's host and visible GPU count, through the job's store (before any collective).

    ``LOCAL_WORLD_SIZE`` alone cannot say whether ranks share a GPU: two torchrun
    "nodes" on one machine each have a local world of 1.

    Returns:
        list[dict]: ``{"host": str, "gpus": int}`` for rank 0, 1, ..., the same on every rank.
    """
    store = dist.PrefixStore("collectives/placement", store)
    store.set(str(rank), json.dumps({"host": socket.gethostname(), "gpus": visible_gpus()}))
    return [json.loads(store.get(str(r))) for r in range(world_size)]


def _short_of_gpus(placement):
    """(host, ranks there, GPUs there) for each host with fewer GPUs than ranks."""
    ranks = Counter(p["host"] for p in placement)
    gpus = {p["host"]: p["gpus"] for p in placement}
    return [(h, n, gpus[h]) for h, n in ranks.items() if gpus[h] < n]


def choose_backend(requested, device, placement):
    """The backend for the whole job, and one line saying why.

    ``auto`` is NCCL only when every rank gets a GPU of its own (NCCL refuses two
    ranks on one GPU: "Duplicate GPU detected"), else gloo. ``nccl`` without that
    raises :class:`SetupError` before any collective.

    Args:
        requested (str): "auto", "gloo" or "nccl" (``--backend``).
        device (str): "auto", "cpu" or "cuda" (``--device``).
        placement (list[dict]): What :func:`exchange_placement` returned.

    Returns:
        (str, str): the backend, and the reason ("backend gloo: ...").
    """
    short = _short_of_gpus(placement)
    if requested == "nccl":
        if device == "cpu":
            raise SetupError("--backend nccl sends CUDA tensors only; "
                             "drop --device cpu or use --backend gloo")
        if short:
            host, n, gpus = short[0]
            raise SetupError(
                f"--backend nccl needs one GPU per rank, but {n} ranks run on {host} and {gpus} GPU(s) "
                f"are visible there. Use --backend gloo (CUDA tensors are then staged through host "
                f"memory, and several ranks may share a GPU)" + (f", or --world-size {gpus}" if gpus else "")
                + ".")
        return "nccl", f"backend nccl: every rank has a GPU of its own ({len(placement)} ranks)"
    if requested == "gloo":
        return "gloo", "backend gloo: as requested"
    if device == "cpu":
        return "gloo", "backend gloo: --device cpu"
    if all(p["gpus"] == 0 for p in placement):
        return "gloo", "backend gloo: no GPU visible"
    if short:
        host, n, gpus = short[0]
        return "gloo", (f"backend gloo: {n} ranks run on {host} with {gpus} GPU(s), and NCCL needs "
                        f"a GPU per rank")
    return "nccl", f"backend nccl: every rank has a GPU of its own ({len(placement)} ranks)"


def choose_device(requested, backend, placement, rank):
    """This rank's device: its place among the ranks on its host picks the GPU.

    NCCL ranks get distinct GPUs; gloo ranks with CUDA tensors share them round robin.

    Args:
        requested (str): "auto" (a GPU if one is visible), "cpu" or "cuda".
        backend (str): What :func:`choose_backend` picked.
        placement (list[dict]): What :func:`exchange_placement` returned.
        rank (int): This rank.
    """
    host, gpus = placement[rank]["host"], placement[rank]["gpus"]
    if requested == "cpu" or (requested == "auto" and not gpus):
        return torch.device("cpu")
    if not gpus:
        raise SetupError("--device cuda, but no GPU is visible to this process")
    slot = sum(p["host"] == host for p in placement[:rank])
    return torch.device("cuda", slot % gpus)


def init_process_group(backend="auto", device="auto", timeout=None):
    """Join the job from the environment; pick backend and device; return (backend, device, reason).

    The ranks meet on the job's store first, learn where every rank runs, and
    only then create the process group, so the choice is the same on every rank.
    """
    rank, _, world, _ = place()
    master_port(os.environ.get("MASTER_PORT", ""))
    kwargs = {"timeout": timeout} if timeout else {}
    store, rank, world = next(dist.rendezvous("env://", rank, world, **kwargs))
    placement = exchange_placement(store, rank, world)
    backend, reason = choose_backend(backend, device, placement)
    dev = choose_device(device, backend, placement, rank)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    dist.init_process_group(backend, store=dist.PrefixStore("default_pg", store), rank=rank,
                            world_size=world, device_id=dev if backend == "nccl" else None, **kwargs)
    return backend, dev, reason


# --- starting processes ------------------------------------------------------------------------

def _die_with_parent():
    """Ask Linux to SIGKILL this process when the launcher dies (no orphans); elsewhere a no-op."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG


@contextlib.contextmanager
def _environment(env):
    """``env`` added to this process's environment for the duration; then it is as before."""
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


_stack_file = None     # kept open for faulthandler, which writes to its descriptor


def _child(rank, env, fn, args, results, netns=None, stacks=None):
    global _stack_file
    if netns:   # a lab host: enter it before anything opens a socket
        lab_tools.enter(netns)
    if stacks:  # the launcher's SIGUSR2 at a timeout: every thread's stack, into the rank's file
        _stack_file = open(os.path.join(stacks, f"{rank}.txt"), "w")
        faulthandler.register(signal.SIGUSR2, file=_stack_file, all_threads=True)
    os.environ.update({"LOCAL_RANK": str(rank), **env, "RANK": str(rank)})
    _die_with_parent()
    try:
        value = fn(*args)
    except SetupError as exc:
        results.put((rank, False, f"{exc}\n"))
        sys.exit(1)
    except SystemExit as exc:
        ok = exc.code in (None, 0)
        results.put((rank, ok, None if ok else f"SystemExit: {exc.code}\n"))
        raise
    except BaseException as exc:
        # an error that found the rank at fault (a collective's timeout names the rank that never
        # answered) says so, so the launcher's headline can name that rank, not this one
        culprit = getattr(exc, "culprit", None)
        tb = traceback.format_exc()
        results.put((rank, False, Failure(tb, culprit) if isinstance(culprit, int) else tb))
        sys.exit(1)
    # A forked rank ends with os._exit, which runs no exit hooks: the engine's (which finishes
    # the calls the rank never waited for) runs here, or a peer waits for a send that is lost.
    engine.finish_at_exit()
    try:
        # The queue pickles in a background thread that only prints its error: the rank then
        # exited 0 and the launcher reported None. Try here, where the failure can be named.
        ForkingPickler.dumps(value)
    except Exception as exc:
        results.put((rank, False, f"rank {rank} returned {_kind(value)}, which cannot be sent to the "
                                  f"launcher (it must be picklable): {type(exc).__name__}: {exc}\n"))
        sys.exit(1)
    results.put((rank, True, value))


def _kind(value):
    return "a function" if callable(value) and hasattr(value, "__code__") else f"a {type(value).__name__}"


class Failure(str):
    """A rank's traceback text that also names the rank its error blamed (``culprit``)."""

    def __new__(cls, text, culprit):
        self = super().__new__(cls, text)
        self.culprit = culprit
        return self

    def __reduce__(self):
        return Failure, (str(self), self.culprit)


def _how_it_ended(code):
    return f"signal {signal.Signals(-code).name}" if code and code < 0 else f"exit code {code}"


# How a rank's traceback says it failed because a peer went away, not for its own reason: our
# own CollectiveError, and gloo's words when a peer exits while the mesh is being connected.
_PEER_LOST = ("CollectiveError", "Connection closed by peer", "Connection reset by peer")


def _lost_a_peer(tb):
    return any(words in tb for words in _PEER_LOST)


def _report(errors, first, world_size):
    """Name the rank that caused the failure, with its traceback, once.

    When one rank dies, its peers fail too, with a CollectiveError (or gloo's
    own words) about the lost connection, and the launcher may hear from one
    of them first. The cause is the rank that failed for another reason, or
    died saying nothing.
    """
    secondary = {r for r, tb in errors.items() if isinstance(tb, str) and _lost_a_peer(tb)}
    in_order = sorted(errors, key=lambda r: r != first)
    # a rank that a survivor's error found silent or dead, and that said nothing itself (stopped,
    # hung): it is the cause, though the first to give up was the one that timed out waiting
    blamed = next((errors[r].culprit for r in in_order if getattr(errors[r], "culprit", None) is not None
                   and 0 <= errors[r].culprit < world_size), None)
    if blamed is not None and blamed not in errors:
        witness = next(r for r in in_order if getattr(errors[r], "culprit", None) == blamed)
        text = (f"rank {blamed} of {world_size} never answered (stopped, hung, or blocked elsewhere): "
                f"rank {witness}'s collective timed out waiting for it; the other ranks were stopped. "
                f"Rank {witness}'s traceback:\n{errors[witness]}")
        others = sorted(r for r in errors if r != witness)
        if others:
            text += f"\n(rank(s) {others} failed too, waiting on it)"
        return blamed, text
    cause = next((r for r in in_order if r not in secondary), first)
    if blamed is not None and blamed in errors and blamed in secondary:
        cause = blamed
    tb = errors[cause]
    if isinstance(tb, str):
        text = f"rank {cause} of {world_size} failed; the other ranks were stopped. Its traceback:\n{tb}"
    else:
        text = (f"rank {cause} of {world_size} died ({_how_it_ended(tb[1])}) without a Python "
                f"traceback; the other ranks were stopped.")
    others = sorted(r for r in errors if r != cause)
    if others:
        text += f"\n(rank(s) {others} failed after it, waiting on it)"
    return cause, text


def lab_spec(lab):
    """``lab`` as a :class:`~collectives.tools.lab.LabSpec` (None, a spec, or ``"hosts=4,..."``)."""
    if lab is None or isinstance(lab, lab_tools.LabSpec):
        return lab
    try:
        return lab_tools.parse_lab(lab)
    except ValueError as exc:
        raise SetupError(str(exc)) from None


def start_world(fn, world_size, *args, env=None, timeout=None, start_method="spawn", preload=(),
                lab=None):
    """Start ``world_size`` processes, run ``fn(*args)`` in each; return their results in rank order.

    Args:
        fn: A module-level function (it is sent to the processes by name). It
            reads its rank from the environment (:func:`place`).
        world_size (int): Number of processes, at least 1.
        *args: Arguments for ``fn``.
        env (dict, optional): Environment variables set in every process first.
        timeout (float, optional): Seconds before every process is killed and
            ``TimeoutError`` raised (None: no limit, for training).
        start_method (str): "spawn" (a fresh interpreter each) or "forkserver"
            (forked from a server that imported ``preload`` once: fast, for tests).
        preload (list[str]): Modules the fork server imports.
        lab (LabSpec or str, optional): Run the world in a lab of hosts
            (``"hosts=2,ranks-per-host=2,rate=1gbit"``), built now and torn down after.

    Returns:
        list: ``fn``'s return value on rank 0, 1, ..., world_size - 1. A rank whose process
        exits with status 0 without returning (``os._exit(0)``) has succeeded, as torchrun
        judges its workers; its result is None.

    Raises:
        ValueError: ``world_size`` is not a whole number of at least 1.
        SetupError: ``MASTER_PORT`` is unusable, or the lab cannot be built here or does not
            fit the world (the message says which).
        WorldError: a rank raised or died (the others were stopped), or returned a value that
            cannot be pickled to the launcher (the rank is named).
        TimeoutError: the world did not finish within ``timeout``; the message holds each
            unfinished rank's stacks (faulthandler, asked for with SIGUSR2).
    """
    _check_world_size(world_size)
    spec = lab_spec(lab)
    if spec is None:
        return _start(fn, world_size, args, env, timeout, start_method, preload, None)
    try:
        layout = spec.layout(world_size)
        lab_tools.check_available()
    except (ValueError, lab_tools.LabUnavailable) as exc:
        raise SetupError(f"--lab: {exc}") from None
    with lab_tools.Lab(spec) as built:
        return _start(fn, world_size, args, env, timeout, start_method, preload, (built, layout))


def _check_world_size(world_size):
    # 0 or -1 ranks returned [] as if a world had run; a float or bool is a caller's mistake.
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a whole number of at least 1, got {world_size!r}")


@contextlib.contextmanager
def started(fn, world_size, *args, env=None, start_method="spawn", preload=()):
    """Start ``world_size`` processes running ``fn(*args)``, as :func:`start_world` does, and
    hand them over without waiting: for a caller that watches the world itself (the course's
    grader reads each rank's reports as they come and decides when a world is stuck).

    The launcher's part is the same as for every world it starts: the job's store held here
    (ranks join with ``init_method="env://"``), the rank's environment, a fork server that
    imported ``preload`` once, and every rank stopped when the block ends.

    Args:
        fn, world_size, *args, env, start_method, preload: as :func:`start_world`.

    Yields:
        (list[multiprocessing.Process], multiprocessing.Queue): the ranks, in rank order, and the
        launcher's queue of their endings, ``(rank, ok, value)``: ``fn``'s return value, or the
        traceback of what it raised (as :class:`WorldError` would show it).

    Example::

        >>> with started(worker, 2, queue, start_method="forkserver") as (procs, endings):
        ...     first = queue.get(timeout=60)     # the ranks report on a queue of the caller's
    """
    _check_world_size(world_size)
    with _started(fn, world_size, args, env, start_method, preload, None) as (procs, endings, _stacks_dir):
        yield procs, endings


@contextlib.contextmanager
def _started(fn, world_size, args, env, start_method, preload, lab):
    """The processes of one world, started; yields (procs, results queue, stacks folder) and stops
    every rank, releases the store and removes the stacks folder when the block ends."""
    if lab:
        # The store lives on host 0, at its address; the namespace is the lab's own, so port 0
        # (any free port) cannot meet another program's.
        built, layout = lab
        addr, port, where = built.addresses[0], 0, lab_tools.inside(built.netns[0])
    else:
        addr, port, where = os.environ.get("MASTER_ADDR") or "127.0.0.1", 0, contextlib.nullcontext()
        if os.environ.get("MASTER_PORT"):
            port = master_port(os.environ["MASTER_PORT"])
            check_port(addr, port)
    # The launcher hosts the job's store, as torchrun's agent does: the port is bound here
    # once and held, so no other program can take it between choosing it and rank 0 binding
    # it (a free port picked and released raced with parallel test runs).
    with where:
        store = dist.TCPStore(addr, port, is_master=True, wait_for_workers=False)
    env = {**(env or {}), "WORLD_SIZE": str(world_size), "LOCAL_WORLD_SIZE": str(world_size),
           "GROUP_RANK": "0", "MASTER_ADDR": addr, "MASTER_PORT": str(store.port),
           "TORCHELASTIC_USE_AGENT_STORE": "True"}
    ctx = mp.get_context(start_method)
    if start_method == "forkserver":
        ctx.set_forkserver_preload(list(preload))
    results = ctx.Queue()

    stacks = tempfile.mkdtemp(prefix="collectives-stacks-")

    def child_args(r):
        if not lab:
            return (r, env, fn, args, results, None, stacks)
        return (r, {**env, **lab_tools.rank_environment(built, layout, r)}, fn, args, results,
                built.netns[layout[r]], stacks)

    procs = [ctx.Process(target=_child, args=child_args(r), daemon=False) for r in range(world_size)]
    # Spawned interpreters see the job's environment from their first import. A forked child
    # needs only what _child sets, and a fork server, started here the first time, must start
    # in this process's own environment: every later process is forked from it.
    with _environment(env) if start_method == "spawn" else contextlib.nullcontext():
        for p in procs:
            p.start()
    try:
        yield procs, results, stacks
    finally:
        _stop(procs)
        del store
        shutil.rmtree(stacks, ignore_errors=True)


def _start(fn, world_size, args, env, timeout, start_method, preload, lab):
    with _started(fn, world_size, args, env, start_method, preload, lab) as (procs, results, stacks):
        return _wait(fn, world_size, procs, results, stacks, timeout)


def _wait(fn, world_size, procs, results, stacks, timeout):
    """Every rank's result, in rank order; a rank's failure or the timeout raised as WorldError
    or TimeoutError (see :func:`start_world`)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    out, errors, silent_since = {}, {}, {}
    while len(out) < world_size and not errors:
        try:
            rank, ok, value = results.get(timeout=0.1)
        except queue.Empty:
            pass
        else:
            if ok:
                out[rank] = value
            else:
                errors[rank] = value
            continue
        now = time.monotonic()
        for r, p in enumerate(procs):
            if p.exitcode is None or r in out or r in errors:
                continue
            # A result may still be in the pipe: give it a moment before calling the rank silent.
            if now - silent_since.setdefault(r, now) > 1.0:
                if p.exitcode == 0:     # exited cleanly without a result: done, as torchrun judges it
                    out[r] = None
                else:
                    errors[r] = ("died", p.exitcode)
        if deadline is not None and now > deadline:
            name = getattr(fn, "__name__", fn)
            raise TimeoutError(f"{name} on {world_size} ranks did not finish in {timeout:g} s; "
                               f"ranks done: {sorted(out)}, failed: {sorted(errors)}"
                               f"{_stacks(procs, stacks, set(out) | set(errors))}")
    if errors:
        first = next(iter(errors))
        # The peers of a failed rank fail within moments; hear them before naming the cause.
        grace = time.monotonic() + 0.5
        while time.monotonic() < grace:
            try:
                rank, ok, value = results.get(timeout=0.1)
                if not ok:
                    errors.setdefault(rank, value)
            except queue.Empty:
                pass
        # A rank that has exited with an error status and said nothing may be the cause the
        # first report came from (its peers can report before it has been silent for long);
        # none has been stopped yet, so every such status is the rank's own.
        for r, p in enumerate(procs):
            if r not in errors and r not in out and p.exitcode:
                errors[r] = ("died", p.exitcode)
        cause, text = _report(errors, first, world_size)
        raise WorldError(text, cause, errors)
    return [out.get(r) for r in range(world_size)]


def _stacks(procs, directory, finished, lines=60):
    """Where each unfinished rank is when the time runs out: every thread's Python stack
    (faulthandler, on SIGUSR2), the last ``lines`` of each rank's, for the timeout's message.
    A hang in CI is then named by its line, not only by its duration."""
    asked = []
    for r, p in enumerate(procs):
        if r not in finished and p.is_alive():
            with contextlib.suppress(OSError):
                os.kill(p.pid, signal.SIGUSR2)
                asked.append(r)
    if not asked:
        return ""
    time.sleep(1.0)       # faulthandler writes from the signal handler at once; allow a loaded machine
    parts = []
    for r in asked:
        try:
            with open(os.path.join(directory, f"{r}.txt")) as f:
                text = f.read().strip().splitlines()
        except OSError:
            text = []
        shown = "\n".join(text[-lines:]) if text else "(no stack: the rank did not answer SIGUSR2)"
        parts.append(f"\n--- rank {r}, every thread's stack (most recent call first):\n{shown}")
    return "\n" + "".join(parts)


def _stop(procs):
    for p in procs:
        if p.is_alive():
            p.terminate()
    end = time.monotonic() + 3
    for p in procs:
        p.join(timeout=max(0.0, end - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()


def run_job(fn, world_size, args=(), lab=None):
    """Run ``fn(*args)`` on every rank of a command-line job; return the exit code.

    Under torchrun ``fn`` runs in this process and its exceptions propagate
    (traceback on stderr, non-zero exit). Otherwise ``world_size`` processes are
    started (in a lab of hosts with ``lab``, see :func:`start_world`); a failure is
    reported on stderr, once.

    Returns:
        int: 0 if every rank finished, 1 if one failed (after stopping the rest).

    Raises:
        SetupError: the lab cannot start, or ``lab`` was given under torchrun.
    """
    if under_torchrun():
        if lab is not None:
            raise SetupError("--lab starts its own processes, one set per lab host; under torchrun "
                             "leave it out, or run `python -m collectives.tools.lab torchrun --lab ...` "
                             "for a torchrun agent per lab host")
        fn(*args)
        return 0
    try:
        start_world(fn, world_size, *args, lab=lab)
    except WorldError as exc:
        print(f"collectives.tools.launch: {exc}", file=sys.stderr)
        return 1
    return 0


def _rank_in_group(fn, backend, threads, args):
    rank, _, world, _ = place()
    # Every process would otherwise start one thread per core; N processes
    # sharing the cores then mostly wait for each other.
    torch.set_num_threads(threads)
    if backend == "nccl":   # one GPU per rank, chosen before NCCL touches a device
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world)
    try:
        return fn(rank, world, *args)
    finally:
        dist.destroy_process_group()


def run_in_group(fn, world_size, *args, backend="gloo", threads=1, **options):
    """:func:`start_world` ``world_size`` ranks in a ``backend`` group; each runs ``fn(rank, world_size, *args)``.

    ``options`` are :func:`start_world`'s (env, timeout, start_method, preload, lab).

    Example::

        >>> run_in_group(hello, 2)   # hello(rank, world_size) returns f"rank {rank}"
        ['rank 0', 'rank 1']
    """
    return start_world(_rank_in_group, world_size, fn, backend, threads, args, **options)
