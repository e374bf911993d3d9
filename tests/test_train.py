"""The training job end to end on a small MNIST subset, and the data plumbing under it.

MNIST comes from a read-only copy (``../shared/data`` beside the repository, or
``$COLLECTIVES_TEST_DATA``) and is unpacked into a per-session cache; tests
never download. Helpers here are shared with test_launch.py and test_resume.py.
"""
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import time

import pytest
import torch
from torch.utils.data import DistributedSampler

from collectives.train import checkpoint, cli, data
from collectives.tools.launch import free_port

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MNIST_SRC = os.environ.get("COLLECTIVES_TEST_DATA", os.path.join(REPO, "..", "shared", "data"))
needs_mnist = pytest.mark.skipif(not os.path.isdir(os.path.join(MNIST_SRC, "MNIST", "raw")),
                                 reason=f"no MNIST copy at {MNIST_SRC} (set COLLECTIVES_TEST_DATA)")
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
SMALL = ["--subset", "512", "--batch-size", "64", "--epochs", "1", "--max-steps", "4", "--no-progress"]


def mnist_env(tmp_path_factory, **extra):
    """Environment for a training subprocess: read-only MNIST, a session-wide unpack cache."""
    env = dict(os.environ, COLLECTIVES_DATA=MNIST_SRC, COLLECTIVES_TIMEOUT="60",
               COLLECTIVES_CACHE=str(tmp_path_factory.getbasetemp() / "mnist-cache"))
    env.pop("MASTER_PORT", None)
    env.update(extra)
    return env


def run_train(args, env, timeout=180, module="collectives.train", prefix=()):
    return subprocess.run([sys.executable, *prefix, "-m", module, *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def check_ok(proc):
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"


def test_distributed_sampler_reshuffles_only_with_set_epoch():
    dataset = list(range(40))

    def orders(set_epoch):
        samplers = [DistributedSampler(dataset, num_replicas=4, rank=r, shuffle=True, seed=7)
                    for r in range(4)]
        out = []
        for epoch in range(2):
            if set_epoch:
                for s in samplers:
                    s.set_epoch(epoch)
            out.append([list(s) for s in samplers])
        return out

    forgot, remembered = orders(False), orders(True)
    assert forgot[0] == forgot[1]              # what goes wrong: the same order every epoch
    assert remembered[0] != remembered[1]
    for epoch in remembered:                   # either way each epoch is split disjointly
        assert sorted(i for shard in epoch for i in shard) == dataset


def test_data_partitioner_splits_disjointly_and_loader_splits_the_batch():
    dataset = [(torch.tensor([float(i)]), i) for i in range(48)]
    parts = [data.DataPartitioner(dataset, [0.25] * 4, seed=3).use(r) for r in range(4)]
    seen = [label for p in parts for _, label in p]
    assert sorted(seen) == list(range(48)) and len(parts[0]) == 12
    loader = data.train_loader(dataset, global_batch_size=16, rank=1, world_size=4, how="partition")
    assert [len(y) for _, y in loader] == [4, 4, 4]
    with pytest.raises(ValueError, match="multiple of 4"):
        data.per_rank_batch(18, 4)


@needs_mnist
def test_read_only_data_dir_is_unpacked_into_a_cache(tmp_path, monkeypatch):
    src = tmp_path / "ro" / "MNIST" / "raw"
    src.mkdir(parents=True)
    for f in data.FILES:
        shutil.copy(os.path.join(MNIST_SRC, "MNIST", "raw", f + ".gz"), src)
    os.chmod(src, stat.S_IRUSR | stat.S_IXUSR)
    monkeypatch.setenv("COLLECTIVES_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("COLLECTIVES_DATA", str(tmp_path / "ro"))
    try:
        root = data.prepare_mnist()
        assert root == str(tmp_path / "cache" / "mnist")
        assert sorted(os.listdir(src)) == sorted(f + ".gz" for f in data.FILES)   # untouched
        test_set = data.load_mnist(root, train=False, subset=100)
        assert test_set.tensors[0].shape == (100, 1, 28, 28)
        assert abs(test_set.tensors[0].mean().item()) < 1   # normalised
        assert data.prepare_mnist(download=False) == root    # what the other ranks do
    finally:
        os.chmod(src, stat.S_IRWXU)


def test_missing_data_without_network_says_where_to_put_it(tmp_path, monkeypatch):
    from torchvision.datasets import MNIST
    monkeypatch.setattr(MNIST, "mirrors", [f"file://{tmp_path}/no-such-mirror/"])
    with pytest.raises(FileNotFoundError) as err:
        data.prepare_mnist(str(tmp_path / "empty"))
    msg = str(err.value)
    assert os.path.join(str(tmp_path / "empty"), "MNIST", "raw") in msg
    assert "COLLECTIVES_DATA" in msg and "train-images-idx3-ubyte.gz" in msg


def test_no_network_stops_at_once_saying_where_to_put_mnist(tmp_path, tmp_path_factory):
    # The network made unreachable the way urllib sees it: every request goes to a closed port.
    closed = f"http://127.0.0.1:{free_port()}"
    env = mnist_env(tmp_path_factory, http_proxy=closed, https_proxy=closed, HTTP_PROXY=closed,
                    HTTPS_PROXY=closed, no_proxy="", NO_PROXY="")
    env.pop("COLLECTIVES_DATA")
    empty = tmp_path / "empty"
    started = time.monotonic()
    proc = run_train(["--world-size", "2", "--data-dir", str(empty), "--out", str(tmp_path / "run"), *SMALL],
                     env, timeout=120)
    assert proc.returncode != 0
    assert time.monotonic() - started < 90
    err = proc.stderr
    assert "could not be downloaded" in err and "--data-dir" in err and "COLLECTIVES_DATA" in err, err
    assert os.path.join(str(empty), "MNIST", "raw") in err
    assert "Traceback" not in err, err


def write_lock(out, pid):
    out.mkdir(parents=True, exist_ok=True)
    (out / "train.lock").write_text(json.dumps({"pid": pid, "host": socket.gethostname(),
                                                "command": "collectives-train --out elsewhere"}))


def test_second_training_on_the_same_out_refuses_naming_the_first(tmp_path, tmp_path_factory):
    first = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        write_lock(tmp_path, first.pid)
        proc = run_train(["--world-size", "2", "--out", str(tmp_path), *SMALL], mnist_env(tmp_path_factory),
                         timeout=60)
    finally:
        first.kill()
        first.wait()
    assert proc.returncode != 0
    assert f"in use by another training (pid {first.pid}" in proc.stderr, proc.stderr
    assert (tmp_path / "train.lock").exists()           # the first one's lock is left alone


@needs_mnist
def test_stale_lock_is_taken_over(tmp_path, tmp_path_factory):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    write_lock(tmp_path, int(dead.stdout))
    proc = run_train(["--world-size", "1", "--out", str(tmp_path), *SMALL], mnist_env(tmp_path_factory))
    check_ok(proc)
    assert f"taking over a stale lock in {tmp_path} (pid {int(dead.stdout)}" in proc.stdout
    assert not (tmp_path / "train.lock").exists()       # released at the end


TRIALS = 60


def _racer(outs, barrier, held):
    """Take each trial's stale lock at the same moment as the other racer; note each success."""
    from collectives.tools.launch import SetupError
    from collectives.train.lock import acquire_lock, release_lock
    sys.stdout = open(os.devnull, "w")      # the takeover notices
    for trial, out in enumerate(outs):
        barrier.wait()
        try:
            lock = acquire_lock(out)
        except SetupError:
            lock = None
        if lock is not None:
            held.put((trial, os.getpid()))
        barrier.wait()                      # both have tried while the winner holds it
        if lock is not None:
            release_lock(lock)


def test_two_processes_restarted_together_never_both_take_a_stale_lock(tmp_path):
    import multiprocessing
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    outs = []
    for trial in range(TRIALS):
        write_lock(tmp_path / str(trial), int(dead.stdout))
        outs.append(str(tmp_path / str(trial)))
    ctx = multiprocessing.get_context("fork")
    barrier, held = ctx.Barrier(2, timeout=60), ctx.Queue()
    racers = [ctx.Process(target=_racer, args=(outs, barrier, held)) for _ in range(2)]
    for r in racers:
        r.start()
    for r in racers:
        r.join(120)
    assert [r.exitcode for r in racers] == [0, 0]
    holders = {}
    while not held.empty():
        trial, pid = held.get()
        holders.setdefault(trial, []).append(pid)
    both = sorted(t for t, pids in holders.items() if len(pids) > 1)
    assert not both, f"in {len(both)} of {TRIALS} trials both processes held the lock: {both}"
    assert sorted(holders) == list(range(TRIALS)), "a stale lock was taken by neither"


def fake_checkpoint(out, argv, epoch=1, steps=4):
    """A checkpoint as a run with ``argv`` would leave it after ``epoch`` epochs."""
    args = cli.parse_args(["--out", str(out), *argv])
    checkpoint.save_checkpoint({"model": {}, "optimizer": {}, "epoch": epoch, "step": 0, "global_step": steps,
                           "rng": [], "python_rng": None, "world_size": 2, "args": vars(args),
                           "history": [{"epoch": epoch, "steps": steps, "test_accuracy": 0.5}]},
                          str(out / "checkpoint.pt"))


def test_resume_with_other_arguments_is_refused_naming_each(tmp_path, tmp_path_factory):
    tmp_path.mkdir(exist_ok=True)
    fake_checkpoint(tmp_path, ["--epochs", "3", "--lr", "0.1", "--seed", "0"])
    proc = run_train(["--world-size", "2", "--out", str(tmp_path), "--resume", "--epochs", "3", "--lr", "0.05",
                      "--seed", "7", "--no-progress"], mnist_env(tmp_path_factory), timeout=60)
    assert proc.returncode != 0
    assert "--resume refused" in proc.stderr
    assert "--lr: 0.1 in the checkpoint, 0.05 now" in proc.stderr
    assert "--seed: 0 in the checkpoint, 7 now" in proc.stderr
    assert "--epochs" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_resume_may_raise_epochs_but_not_lower_them(tmp_path):
    fake_checkpoint(tmp_path, ["--epochs", "3"])
    saved = torch.load(tmp_path / "checkpoint.pt", weights_only=False)["args"]
    assert checkpoint.resume_differences(saved, cli.parse_args(["--out", str(tmp_path), "--epochs", "5"])) == []
    [line] = checkpoint.resume_differences(saved, cli.parse_args(["--out", str(tmp_path), "--epochs", "2"]))
    assert line.startswith("--epochs: 3 in the checkpoint, 2 now")
    # a different world size, backend or algorithm of the same sum is a new way to run, not a new run
    assert checkpoint.resume_differences(saved, cli.parse_args(["--out", str(tmp_path), "--epochs", "3",
                                                              "--world-size", "3", "--threads", "1"])) == []


def test_resume_of_a_finished_run_says_so(tmp_path, tmp_path_factory):
    fake_checkpoint(tmp_path, ["--epochs", "2"], epoch=2, steps=8)
    proc = run_train(["--world-size", "2", "--out", str(tmp_path), "--resume", "--epochs", "2",
                      "--no-progress"], mnist_env(tmp_path_factory), timeout=60)
    check_ok(proc)
    assert f"the run in {tmp_path} already finished (2 of 2 epochs, 8 steps, test accuracy 50.00%)" \
        in proc.stdout and "Raise --epochs" in proc.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has GPUs")
def test_nccl_without_gpus_explains_itself(tmp_path_factory):
    proc = run_train(["--backend", "nccl", "--world-size", "2"], mnist_env(tmp_path_factory), timeout=60)
    assert proc.returncode != 0
    assert "nccl needs one GPU per rank" in proc.stderr and "--backend gloo" in proc.stderr


@needs_mnist
def test_train_spawns_workers_and_writes_outputs(tmp_path, tmp_path_factory):
    out = tmp_path / "run"
    proc = run_train(["--world-size", "2", "--out", str(out), "--sync", "naive", "--split", "partition",
                      "--algorithm", "ring", *SMALL], mnist_env(tmp_path_factory))
    check_ok(proc)
    assert proc.stdout.count("epoch 1/1:") == 1          # rank 0 alone prints
    assert "2 ranks, backend gloo" in proc.stdout
    history = json.loads((out / "metrics.json").read_text())
    assert history[0]["steps"] == 4 and 0 <= history[0]["test_accuracy"] <= 1
    assert (out / "metrics.csv").read_text().startswith("epoch,")
    assert (out / "curves.png").read_bytes()[:4] == b"\x89PNG"
    ckpt = torch.load(out / "checkpoint.pt", weights_only=False)
    assert {"model", "optimizer", "epoch", "step", "rng"} <= set(ckpt) and len(ckpt["rng"]) == 2


@pytest.mark.gpu
@needs_gpu
@needs_mnist
def test_nccl_world_of_one_trains(tmp_path, tmp_path_factory):
    proc = run_train(["--world-size", "1", "--backend", "nccl", "--out", str(tmp_path), *SMALL],
                     mnist_env(tmp_path_factory))
    check_ok(proc)
    assert "backend nccl, device cuda" in proc.stdout


@pytest.mark.gpu
@needs_gpu
@needs_mnist
def test_gloo_ranks_share_a_gpu_with_cuda_tensors(tmp_path, tmp_path_factory):
    proc = run_train(["--world-size", "2", "--backend", "gloo", "--device", "cuda", "--out", str(tmp_path),
                      *SMALL], mnist_env(tmp_path_factory))
    check_ok(proc)
    assert "backend gloo, device cuda" in proc.stdout


def refusal(argv, monkeypatch):
    """What ``python -m collectives.train ARGV`` says when it stops before any rank starts."""
    def no_ranks(*args, **kwargs):
        raise AssertionError("a rank was started")
    monkeypatch.setattr(cli.launch, "run_job", no_ranks)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    with pytest.raises(SystemExit) as stopped:
        cli.main(argv)
    return str(stopped.value.code)


@pytest.mark.parametrize("argv, named", [
    (["--batch-size", "0"], "--batch-size must be at least 1, got 0"),
    (["--batch-size", "-4"], "--batch-size must be at least 1, got -4"),
    (["--bucket-cap-mb", "0"], "--bucket-cap-mb must be a positive number, got 0.0"),
    (["--bucket-cap-mb", "nan"], "--bucket-cap-mb must be a positive number, got nan"),
    (["--lr", "nan"], "--lr must be a finite number >= 0, got nan"),
    (["--lr", "inf"], "--lr must be a finite number >= 0, got inf"),
    (["--lr", "-0.1"], "--lr must be a finite number >= 0, got -0.1"),
    (["--momentum", "nan"], "--momentum must be a finite number >= 0, got nan"),
    (["--weight-decay", "-1"], "--weight-decay must be a finite number >= 0, got -1.0"),
    (["--subset", "0"], "--subset must be at least 1, got 0"),
    (["--epochs", "0"], "--epochs must be at least 1, got 0"),
    (["--max-steps", "0"], "--max-steps must be at least 1, got 0"),
    (["--checkpoint-every", "-1"], "--checkpoint-every must be at least 0, got -1"),
    (["--threads", "0"], "--threads must be at least 1, got 0"),
])
def test_a_bad_argument_is_one_line_naming_it_before_any_rank(argv, named, tmp_path, monkeypatch):
    said = refusal(["--world-size", "2", "--out", str(tmp_path), *argv], monkeypatch)
    assert said == f"collectives.train: {named}", said
    assert not (tmp_path / "train.lock").exists()


@pytest.mark.parametrize("damage, what", [
    (lambda p: p.write_bytes(os.urandom(4096)), "cannot be read as a checkpoint"),
    (lambda p: p.write_bytes(p.read_bytes()[:len(p.read_bytes()) // 2]), "cannot be read as a checkpoint"),
    (lambda p: torch.save({}, p), "is not a checkpoint of collectives.train: it has no model, optimizer"),
    (lambda p: torch.save([1, 2], p), "is not a checkpoint of collectives.train: it holds a list"),
])
def test_a_damaged_checkpoint_is_one_line_naming_the_file(damage, what, tmp_path, monkeypatch):
    fake_checkpoint(tmp_path, ["--epochs", "3"])
    path = tmp_path / "checkpoint.pt"
    damage(path)
    said = refusal(["--world-size", "2", "--out", str(tmp_path), "--resume", "--epochs", "3"], monkeypatch)
    assert said.startswith(f"collectives.train: --resume: {path} ") and what in said, said
    assert "delete it" in said and len(said.splitlines()) == 1, said


def test_resume_with_another_powersgd_rank_is_refused(tmp_path):
    # The checkpoint's Qs have r columns: another --powersgd-rank is another run.
    fake_checkpoint(tmp_path, ["--compression", "powersgd", "--powersgd-rank", "2"])
    saved = torch.load(tmp_path / "checkpoint.pt", weights_only=False)["args"]
    now = cli.parse_args(["--out", str(tmp_path), "--compression", "powersgd", "--powersgd-rank", "4"])
    assert checkpoint.resume_differences(saved, now) == ["--powersgd-rank: 2 in the checkpoint, 4 now"]
    same = cli.parse_args(["--out", str(tmp_path), "--compression", "powersgd", "--powersgd-rank", "2"])
    assert checkpoint.resume_differences(saved, same) == []
    del saved["powersgd_rank"]          # a checkpoint written before the flag existed: r = 4 then
    assert checkpoint.resume_differences(saved, now) == []
