"""Start small worlds of processes (gloo, or NCCL with a GPU each) for tests, with a free port and a hard timeout.

Starting a world costs seconds when each process imports torch afresh, so:
processes are forked from a server that imported torch and collectives once
(the ``forkserver`` start method with those modules preloaded), and a test runs
many cases inside one world. ``run_world(fn, n)`` starts ``n`` processes, calls
``fn(rank, n, *args)`` in each after ``init_process_group``, and returns the
per-rank results. If a rank raises, the test fails with that rank's traceback;
if the world is not done within ``timeout`` seconds, every process is killed
and the test fails instead of hanging CI. Ranks listed in ``doomed`` are meant
to die (``os._exit(DEATH_EXIT_CODE)``) and get None as their result.
"""
import os
import queue
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import collectives  # noqa: F401  (preloaded into the fork server with this module)
from collectives.launch import free_port

DEFAULT_TIMEOUT = float(os.environ.get("COLLECTIVES_TEST_WORLD_TIMEOUT", 240))
DEATH_EXIT_CODE = 17


def _worker(rank, world_size, port, fn, args, env, results, backend):
    os.environ.update(env)
    torch.set_num_threads(1)
    try:
        if backend == "nccl":  # one GPU per rank, chosen before NCCL touches a device
            torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}",
                                rank=rank, world_size=world_size)
        value = fn(rank, world_size, *args)
        results.put((rank, True, value))
    except BaseException:
        results.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_world(fn, world_size, *args, timeout=DEFAULT_TIMEOUT, env=None, doomed=(), backend="gloo"):
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` ranks; return their results."""
    env = {"COLLECTIVES_TIMEOUT": "30", **(env or {})}
    doomed = set(doomed)
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, world_size, port, fn, args, env, results, backend), daemon=True)
             for r in range(world_size)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    out, errors = {}, {}
    try:
        while len(out) + len(errors) < world_size - len(doomed):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"world of {world_size} did not finish in {timeout:.0f} s; "
                                   f"ranks done: {sorted(out)}, failed: {sorted(errors)}")
            try:
                rank, ok, value = results.get(timeout=min(left, 1.0))
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)
                        and r not in doomed and r not in out and r not in errors]
                if dead and not errors:
                    raise RuntimeError(f"rank(s) {dead} died with exit codes "
                                       f"{[procs[r].exitcode for r in dead]}")
                continue
            if rank in doomed:
                errors[rank] = f"rank {rank} should have died but {'returned' if ok else 'raised'}:\n{value}"
            else:
                (out if ok else errors)[rank] = value
        if not errors:
            for r in sorted(doomed):
                procs[r].join(timeout=max(deadline - time.monotonic(), 1))
                if procs[r].exitcode != DEATH_EXIT_CODE:
                    errors[r] = f"rank {r} was meant to die but ended with exit code {procs[r].exitcode}"
    finally:
        for p in procs:
            p.join(timeout=5 if not errors else 0.5)
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    if errors:
        first = min(errors)
        raise AssertionError(f"rank {first} of {world_size} failed:\n{errors[first]}"
                             + (f"\n(and ranks {sorted(errors)[1:]} too)" if len(errors) > 1 else ""))
    return [out.get(r) for r in range(world_size)]
