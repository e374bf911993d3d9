"""A run killed mid-epoch and resumed ends bitwise where an uninterrupted run ends.

World of 2, 256 training examples, global batch 32: 8 steps per epoch, 2
epochs, a checkpoint every 3 steps. ``python -m tests.faults 1:11:kill``
SIGKILLs rank 1 just before step 11 (in the second epoch, two steps after the
last checkpoint); the launcher stops rank 0 and exits non-zero; ``--resume``
continues from the checkpoint.
"""
import os
import subprocess
import sys

import pytest
import torch

from collectives.train.checkpoint import load_checkpoint
from tests.test_train import REPO, check_ok, mnist_env, needs_mnist, run_train

ARGS = ["--world-size", "2", "--subset", "256", "--batch-size", "32", "--epochs", "2",
        "--checkpoint-every", "3", "--seed", "5", "--no-progress"]


@needs_mnist
@pytest.mark.slow
@pytest.mark.parametrize("compression", [[], ["--compression", "powersgd"]], ids=["plain", "powersgd"])
def test_killed_and_resumed_run_matches_uninterrupted_run(tmp_path, tmp_path_factory, compression):
    # PowerSGD keeps state between steps (each rank's error feedback, the shared Q): the
    # checkpoint must carry it, or the resumed steps differ (0.5-0.9 per tensor without it).
    env = mnist_env(tmp_path_factory)
    args = [*ARGS, *compression]
    check_ok(run_train([*args, "--out", str(tmp_path / "straight")], env))

    out = str(tmp_path / "interrupted")
    killed = run_train(["1:11:kill", *args, "--out", out], env, module="tests.faults")
    assert killed.returncode != 0 and "rank 1 of 2 died (signal SIGKILL)" in killed.stderr, killed.stderr
    at_kill = load_checkpoint(os.path.join(out, "checkpoint.pt"))
    assert (at_kill["epoch"], at_kill["step"]) == (1, 1)      # after step 9 = epoch 2, batch 1
    resumed = run_train([*args, "--out", out, "--resume"], env)
    check_ok(resumed)
    assert "resuming at epoch 2, step 1" in resumed.stdout

    a = load_checkpoint(os.path.join(tmp_path, "straight", "checkpoint.pt"))
    b = load_checkpoint(os.path.join(out, "checkpoint.pt"))
    assert (a["epoch"], a["step"]) == (b["epoch"], b["step"]) == (2, 0)
    for name, value in a["model"].items():
        assert torch.equal(value, b["model"][name]), name
    for s, t in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values()):
        assert torch.equal(s["momentum_buffer"], t["momentum_buffer"])
    assert a["history"][-1]["test_accuracy"] == b["history"][-1]["test_accuracy"]
    assert sorted(os.listdir(out)) == ["checkpoint.pt", "curves.png", "metrics.csv", "metrics.json"]


TORN_WRITE = """
import os, signal, sys, torch
from collectives.train.checkpoint import save_checkpoint
save_checkpoint({"w": torch.ones(1000)}, sys.argv[1])
def torn(obj, f):                      # half a file, then the process is killed
    with open(f, "wb") as fh:
        fh.write(b"PK\\x03\\x04 half a checkpoint")
        fh.flush()
    os.kill(os.getpid(), signal.SIGKILL)
torch.save = torn
save_checkpoint({"w": torch.zeros(1000)}, sys.argv[1])
"""


def test_kill_during_checkpoint_write_leaves_the_previous_one(tmp_path):
    path = str(tmp_path / "checkpoint.pt")
    proc = subprocess.run([sys.executable, "-c", TORN_WRITE, path], cwd=REPO, timeout=120)
    assert proc.returncode == -9
    assert torch.equal(load_checkpoint(path)["w"], torch.ones(1000))


@needs_mnist
def test_resume_after_a_kill_during_a_checkpoint_write(tmp_path, tmp_path_factory):
    # One rank, 8 steps an epoch, a checkpoint every 3 steps: the write after step 6 is torn.
    env = mnist_env(tmp_path_factory)
    args = ["--world-size", "1", "--subset", "256", "--batch-size", "32", "--epochs", "1",
            "--checkpoint-every", "3", "--no-progress", "--out", str(tmp_path)]
    killed = run_train(["0:5:torn", *args], env, module="tests.faults")
    assert killed.returncode != 0 and "rank 0 of 1 died (signal SIGKILL)" in killed.stderr, killed.stderr
    assert load_checkpoint(str(tmp_path / "checkpoint.pt"))["step"] == 3     # the last whole one
    resumed = run_train([*args, "--resume"], env)
    check_ok(resumed)
    assert "resuming at epoch 1, step 3" in resumed.stdout
    assert sorted(os.listdir(tmp_path)) == ["checkpoint.pt", "curves.png", "metrics.csv", "metrics.json"]
