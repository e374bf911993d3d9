"""The same training command under every launcher, and what happens when a rank fails.

Each run trains a few steps on a small MNIST subset. Spawned workers carry a
marker in their environment, so the test can prove that none outlives the
launcher, however the run ended.
"""
import os
import socket
import subprocess
import sys
import uuid

import pytest

from tests.test_train import REPO, SMALL, check_ok, mnist_env, needs_mnist, run_train
from tests.worlds import free_port

pytestmark = needs_mnist
TORCHRUN = ("-m", "torch.distributed.run")


def _processes_with(marker):
    """PIDs of live processes whose environment contains ``marker``."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


@pytest.mark.slow
def test_torchrun_one_node(tmp_path, tmp_path_factory):
    env = mnist_env(tmp_path_factory)
    proc = subprocess.run([sys.executable, *TORCHRUN, "--standalone", "--nproc_per_node", "2",
                           "-m", "collectives.train", "--out", str(tmp_path), *SMALL],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=180)
    check_ok(proc)
    assert "2 ranks, backend gloo" in proc.stdout and "done: test accuracy" in proc.stdout


@pytest.mark.slow
def test_torchrun_two_simulated_nodes(tmp_path, tmp_path_factory):
    env = mnist_env(tmp_path_factory)
    port = str(free_port())
    nodes = [subprocess.Popen([sys.executable, *TORCHRUN, "--nnodes", "2", "--node_rank", str(node),
                               "--nproc_per_node", "1", "--master_addr", "127.0.0.1",
                               "--master_port", port, "-m", "collectives.train",
                               "--out", str(tmp_path), *SMALL],
                              env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for node in (0, 1)]
    outputs = []
    try:
        for p in nodes:
            outputs.append(p.communicate(timeout=180))
    finally:
        for p in nodes:
            p.kill()
    for p, (out, err) in zip(nodes, outputs):
        assert p.returncode == 0, f"stdout:\n{out}\nstderr:\n{err}"
    assert "2 ranks, backend gloo" in outputs[0][0] and "done: test accuracy" in outputs[0][0]
    assert "epoch" not in outputs[1][0]          # node 1 holds rank 1, which prints nothing


@pytest.mark.parametrize("fault, expected", [
    ("1:2:raise", ["rank 1 of 2 failed", "injected failure on rank 1 at step 2"]),
    ("1:2", ["rank 1 of 2 died (signal SIGKILL)"]),
])
def test_failing_rank_stops_the_others_and_is_reported(tmp_path, tmp_path_factory, fault, expected):
    marker = f"collectives-test-{uuid.uuid4().hex}"
    env = mnist_env(tmp_path_factory, COLLECTIVES_FAULT=fault, COLLECTIVES_TEST_MARKER=marker)
    proc = run_train(["--world-size", "2", "--out", str(tmp_path), *SMALL], env)
    assert proc.returncode != 0
    for text in expected:
        assert text in proc.stderr, proc.stderr
    assert _processes_with(marker) == []


def test_taken_master_port_is_explained(tmp_path, tmp_path_factory):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        env = mnist_env(tmp_path_factory, MASTER_PORT=str(port))
        proc = run_train(["--world-size", "2", "--out", str(tmp_path), *SMALL], env, timeout=60)
    assert proc.returncode != 0
    assert f"MASTER_PORT={port} on 127.0.0.1 is not available" in proc.stderr
    assert "unset MASTER_PORT" in proc.stderr
