"""Start the ranks of a job: N local processes, or the ones ``torchrun`` already started.

One training function serves every launcher. It reads its place in the job
from the environment torchrun defines (``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``):

* under ``torchrun`` (one node or many) those variables are already set, and
  :func:`launch` just calls the function in this process;
* otherwise :func:`launch` spawns ``world_size`` processes with
  ``torch.multiprocessing`` and sets them, picking a free port unless
  ``MASTER_PORT`` is given.

When one spawned worker raises or dies, the others are stopped (SIGTERM, then
SIGKILL), the failing rank and its traceback are printed, and the launcher
returns a non-zero exit code. Workers also get SIGINT if the launcher itself
dies, so no process is left behind.
"""
import contextlib
import os
import pickle
import signal
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port(addr="127.0.0.1"):
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def check_port(addr, port):
    """Raise a clear error if ``port`` cannot be listened on at ``addr``."""
    with socket.socket() as s:
        try:
            s.bind((addr, port))
        except OSError as exc:
            raise RuntimeError(
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


def gpus_needed(backend, local_world_size):
    """Check that ``backend`` can serve ``local_world_size`` ranks on this node; explain if not."""
    if backend != "nccl":
        return
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n < local_world_size:
        raise RuntimeError(
            f"--backend nccl needs one GPU per rank, but {local_world_size} rank(s) run on this "
            f"node and {n} GPU(s) are visible. Use --backend gloo (CUDA tensors are then staged "
            f"through host memory, and several ranks may share a GPU)"
            + (f", or --world-size {n}" if n else "") + ".")


def _entry(local_rank, fn, world_size, args):
    os.environ.update(RANK=str(local_rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(world_size),
                      LOCAL_WORLD_SIZE=str(world_size), GROUP_RANK="0")
    fn(*args)


def launch(fn, world_size, args=()):
    """Run ``fn(*args)`` on every rank; return the exit code for the launcher.

    Args:
        fn: Module-level function; it reads its rank from the environment (:func:`place`).
        world_size (int): Ranks to spawn; ignored under torchrun, which decides.
        args (tuple): Arguments for ``fn``.

    Returns:
        int: 0 if every rank finished, 1 if one failed (after stopping the rest).
    """
    if under_torchrun():
        fn(*args)
        return 0
    addr = os.environ.get("MASTER_ADDR") or "127.0.0.1"
    port = os.environ.get("MASTER_PORT")
    if port:
        check_port(addr, int(port))
    saved = dict(os.environ)
    # The children inherit the environment at spawn; the caller's is restored after.
    os.environ.update(MASTER_ADDR=addr, MASTER_PORT=port or str(free_port(addr)))
    try:
        context = mp.start_processes(_entry, args=(fn, world_size, args), nprocs=world_size,
                                     join=False, start_method="spawn")
    finally:
        os.environ.clear()
        os.environ.update(saved)
    try:
        while not context.join(grace_period=3):
            pass
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as exc:
        print(_failure_report(context, exc.error_index, world_size), file=sys.stderr)
        return 1
    finally:
        for p in context.processes:
            if p.is_alive():
                p.kill()
            p.join()
    return 0


def launch_each(fn, world_sizes, args=()):
    """:func:`launch` ``fn`` at each world size in turn; exit with status 1 at the first failure."""
    for world in world_sizes:
        if launch(fn, world, args) != 0:
            raise SystemExit(1)


@contextlib.contextmanager
def gloo_group(threads=1):
    """A benchmark worker's gloo process group, from the environment :func:`launch` set.

    Sets ``threads`` intra-op threads first (torch's default made hand-written
    rings 2-9x slower on 2 cores) and destroys the group on exit. Yields
    (rank, world_size).
    """
    rank, _, world, _ = place()
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world)
    try:
        yield rank, world
    finally:
        dist.destroy_process_group()


def _failure_report(context, first_seen, world_size):
    """Name the rank that caused the failure and show its traceback.

    When one rank dies, its peers fail too, with a CollectiveError about the
    lost connection, and on a busy machine the launcher may notice one of them
    first. The cause is the rank that failed for another reason.
    """
    failures = {}
    for i, p in enumerate(context.processes):
        tb = None
        if os.access(context.error_files[i], os.R_OK):
            with open(context.error_files[i], "rb") as f:
                tb = pickle.load(f)
        if tb:
            failures[i] = tb
        elif p.exitcode is not None and p.exitcode < 0 and (i == first_seen or p.exitcode != -signal.SIGTERM):
            failures[i] = None     # killed by a signal, no Python traceback
    secondary = [i for i, tb in failures.items() if tb and "CollectiveError" in tb]
    cause = next((i for i in failures if i not in secondary), first_seen)
    tb = failures.get(cause)
    if tb:
        text = f"rank {cause} of {world_size} failed; the other ranks were stopped. Its traceback:\n{tb}"
    else:
        code = context.processes[cause].exitcode
        how = f"signal {signal.Signals(-code).name}" if code and code < 0 else f"exit code {code}"
        text = (f"rank {cause} of {world_size} died ({how}) without a Python traceback; "
                f"the other ranks were stopped.")
    others = sorted(i for i in failures if i != cause)
    if others:
        text += f"\n(rank(s) {others} failed after it, waiting on it)"
    return "collectives.launch: " + text


def inject_fault(rank, step):
    """Test hook: ``COLLECTIVES_FAULT="RANK:STEP[:raise]"`` kills (or raises in) that rank at that step."""
    spec = os.environ.get("COLLECTIVES_FAULT")
    if not spec:
        return
    parts = spec.split(":")
    if int(parts[0]) != rank or int(parts[1]) != step:
        return
    if len(parts) > 2 and parts[2] == "raise":
        raise RuntimeError(f"COLLECTIVES_FAULT: injected failure on rank {rank} at step {step}")
    os.kill(os.getpid(), signal.SIGKILL)
