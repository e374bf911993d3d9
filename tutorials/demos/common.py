"""The launcher every demo after chapter 1 uses (chapter 1 spells it out by hand).

``run(fn, world_size, *args)`` starts ``world_size`` fresh processes (the spawn
start method, as ``torch.multiprocessing.spawn`` does), joins them into a gloo
process group on a free port, calls ``fn(rank, world_size, *args)`` in each and
returns what each rank returned, in rank order. ``fn`` must live in an
importable module: the spawn start method pickles it by name, which is why
notebooks import their demos. It is ``collectives.tools.launch.run_in_group``, the
launcher the training and the tests use too.
"""
import contextlib
import io

import torch.distributed as dist

from collectives.tools.launch import run_in_group


def run(fn, world_size, *args, backend="gloo", env=None, timeout=300, lab=None):
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` ranks; return their results.

    Args:
        fn: A module-level function (spawn pickles it by name).
        world_size (int): Number of processes.
        *args: Passed to ``fn`` after ``rank, world_size``.
        backend (str): "gloo" (CPU) or "nccl" (one GPU per rank).
        env (dict, optional): Environment variables set in each process first.
        timeout (float): Seconds before every process is killed and an error raised.
        lab (str, optional): Run the ranks in a lab of hosts (chapter 15), e.g.
            ``"hosts=2,rate=1gbit"``; without it, ``--lab hosts=...`` on the demo's command
            line does the same for any demo (``python -m tutorials.demos.ch04_ring --lab hosts=4``).

    Returns:
        list: ``fn``'s return value on rank 0, 1, ..., world_size - 1.

    Example::

        >>> run(hello, 2)   # hello(rank, world_size) returns f"rank {rank}"
        ['rank 0', 'rank 1']
    """
    return run_in_group(fn, world_size, *args, backend=backend, env=env, timeout=timeout,
                        lab=lab if lab is not None else _lab_flag())


def _lab_flag():
    """``--lab hosts=...`` from the demo's command line, or None (other arguments are left alone)."""
    import argparse
    import sys
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--lab", default=None)
    return p.parse_known_args(sys.argv[1:])[0].lab


def capture(rank, world_size, demos):
    """Run each ``demo(rank, world_size)`` in turn; return what each printed on this rank.

    Used by the notebooks and the tests to run many demos inside one world
    (starting processes is the slow part) and show their output.
    """
    texts = []
    for demo in demos:
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            demo(rank, world_size)
        dist.barrier()
        texts.append(buf.getvalue())
    return texts


def print_ranks(text, group=None):
    """Every rank calls this; rank 0 prints ``rank r: text`` for every rank, in rank order.

    Printing from every rank interleaves lines unpredictably; gathering the
    text to one rank first keeps the output readable and the same every run.
    """
    texts = [None] * dist.get_world_size(group) if dist.get_rank() == 0 else None
    dist.gather_object(text, texts, dst=0, group=group)
    if dist.get_rank() == 0:
        for r, t in enumerate(texts):
            print(f"  rank {r}: {t}")
