"""The training command with a fault injected from outside the training loop, for the tests.

    python -m tests.faults RANK:STEP:HOW [collectives.train arguments]
    torchrun ... -m tests.faults RANK:STEP:HOW [collectives.train arguments]

HOW is ``kill`` (SIGKILL just before global step STEP), ``raise`` (a
RuntimeError there) or ``torn`` (the next checkpoint write stops half way and
the process is SIGKILLed). The training loop knows nothing of this: the hook
wraps ``collectives.train.loop.learning_rate``, which the loop calls once per step
with the global step. Spawned ranks are fresh interpreters, so the launcher is
given :func:`faulty_worker`, which installs the hook in each rank first.
"""
import os
import signal
import sys

import torch

from collectives.tools import launch
from collectives.train import cli, loop

SPEC = "COLLECTIVES_TEST_FAULT"
_original_worker = loop.worker


def _kill_self():
    os.kill(os.getpid(), signal.SIGKILL)


def _torn_save(obj, path):
    with open(path, "wb") as f:           # half a file, then the process is gone
        f.write(b"PK\x03\x04 half a checkpoint")
        f.flush()
    _kill_self()


def install():
    rank_s, step_s, how = os.environ[SPEC].split(":")
    rank, at = int(rank_s), int(step_s)
    if launch.place()[0] != rank:
        return
    plain = loop.learning_rate

    def faulty_learning_rate(args, step, total_steps):
        if step == at:
            if how == "raise":
                raise RuntimeError(f"injected failure on rank {rank} at step {step}")
            if how == "kill":
                _kill_self()
            if how == "torn":
                torch.save = _torn_save
        return plain(args, step, total_steps)

    loop.learning_rate = faulty_learning_rate


def faulty_worker(*args):
    install()
    _original_worker(*args)


if __name__ == "__main__":
    os.environ[SPEC] = sys.argv[1]
    cli.worker = faulty_worker
    cli.main(sys.argv[2:])
