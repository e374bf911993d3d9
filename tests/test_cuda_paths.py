"""The CUDA-present paths, tested without a GPU: backend choice, device placement, resume.

``torch.cuda.is_available`` and ``torch.cuda.device_count`` are monkeypatched,
so these run in CI on any machine. What they pin down went wrong on a one-GPU
machine (issue 15): two ranks on one GPU picked NCCL ("Duplicate GPU
detected"), and ``--resume`` failed with "RNG state must be a torch.ByteTensor"
because the checkpoint was loaded onto the GPU. The multi-GPU NCCL test at the
end runs only where at least two GPUs are visible.
"""
import random
import socket
import threading

import pytest
import torch
import torch.distributed as dist

from collectives.tools import launch
from collectives.train import checkpoint, cli


def fake_gpus(monkeypatch, n):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)


def layout(ranks_per_host, gpus_per_host):
    """The placement every rank sees: host and visible GPUs of rank 0, 1, ... (hosts fill in order)."""
    return [{"host": f"node{h}", "gpus": gpus}
            for h, (n, gpus) in enumerate(zip(ranks_per_host, gpus_per_host)) for _ in range(n)]


def exchange(world_size):
    """Run the real placement exchange on ``world_size`` threads sharing one store; every rank's view."""
    store = dist.HashStore()
    views, errors = [None] * world_size, []

    def rank(r):
        try:
            views[r] = launch.exchange_placement(store, r, world_size)
        except BaseException as exc:   # noqa: BLE001 (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors, errors
    return views


# --- backend choice -------------------------------------------------------------------------

@pytest.mark.parametrize("hosts", [1, 2])
@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
@pytest.mark.parametrize("gpus", [0, 1, 2, 4])
def test_auto_picks_nccl_only_when_every_rank_has_its_own_gpu(hosts, ranks, gpus):
    placement = layout([ranks] * hosts, [gpus] * hosts)
    backend, reason = launch.choose_backend("auto", "auto", placement)
    own_gpu = 0 < gpus and ranks <= gpus
    assert backend == ("nccl" if own_gpu else "gloo"), reason
    assert "\n" not in reason and reason.startswith(f"backend {backend}")
    if not own_gpu:
        assert (f"{ranks} rank" in reason and f"{gpus} GPU" in reason) if gpus else "no GPU" in reason


def test_auto_decides_for_the_whole_job_not_per_node():
    # Node 0 could give each of its ranks a GPU, node 1 could not: every rank must pick gloo,
    # or node 0 waits in NCCL for ranks that joined gloo.
    placement = layout([2, 4], [4, 2])
    assert launch.choose_backend("auto", "auto", placement)[0] == "gloo"
    assert "node1" in launch.choose_backend("auto", "auto", placement)[1]


def test_auto_with_device_cpu_is_gloo_even_with_gpus():
    backend, reason = launch.choose_backend("auto", "cpu", layout([2], [2]))
    assert backend == "gloo" and "--device cpu" in reason


@pytest.mark.parametrize("ranks,gpus", [(2, 1), (4, 2), (3, 0)])
def test_nccl_with_too_few_gpus_stops_with_a_clear_message(ranks, gpus):
    with pytest.raises(launch.SetupError) as err:
        launch.choose_backend("nccl", "auto", layout([ranks], [gpus]))
    msg = str(err.value)
    assert "--backend nccl needs one GPU per rank" in msg
    assert f"{ranks} ranks run on node0" in msg and f"{gpus} GPU" in msg and "--backend gloo" in msg


def test_nccl_with_device_cpu_is_refused():
    with pytest.raises(launch.SetupError, match="--device cpu"):
        launch.choose_backend("nccl", "cpu", layout([1], [1]))


def test_two_torchrun_nodes_on_one_host_with_one_gpu_pick_gloo(monkeypatch):
    # The GPU machine's failure: torchrun --nnodes 2 --nproc_per_node 1 on one host. Each rank
    # alone sees LOCAL_WORLD_SIZE=1 and one GPU; only the exchange shows both share it.
    fake_gpus(monkeypatch, 1)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    views = exchange(2)
    assert views[0] == views[1] == [{"host": socket.gethostname(), "gpus": 1}] * 2
    assert {launch.choose_backend("auto", "auto", v)[0] for v in views} == {"gloo"}
    with pytest.raises(launch.SetupError, match="2 ranks run on"):
        launch.choose_backend("nccl", "auto", views[0])


def test_every_rank_with_its_own_gpu_picks_nccl(monkeypatch):
    fake_gpus(monkeypatch, 4)
    views = exchange(4)
    assert [launch.choose_backend("auto", "auto", v)[0] for v in views] == ["nccl"] * 4


# --- device placement -----------------------------------------------------------------------

def devices(requested, backend, placement):
    return [launch.choose_device(requested, backend, placement, r) for r in range(len(placement))]


def test_nccl_ranks_get_distinct_gpus(monkeypatch):
    fake_gpus(monkeypatch, 4)
    assert devices("auto", "nccl", layout([4], [4])) == [torch.device("cuda", i) for i in range(4)]
    # two nodes: each node numbers its own GPUs from 0
    assert devices("auto", "nccl", layout([2, 2], [2, 2])) == [torch.device("cuda", i) for i in (0, 1, 0, 1)]


def test_two_simulated_nodes_on_one_host_get_distinct_gpus(monkeypatch):
    # LOCAL_RANK is 0 in both processes; the device must come from the rank's place on its host.
    fake_gpus(monkeypatch, 2)
    monkeypatch.setenv("LOCAL_RANK", "0")
    views = exchange(2)
    assert launch.choose_backend("auto", "auto", views[0])[0] == "nccl"
    assert [launch.choose_device("auto", "nccl", views[r], r) for r in range(2)] == \
        [torch.device("cuda", 0), torch.device("cuda", 1)]


def test_gloo_ranks_share_gpus_round_robin(monkeypatch):
    fake_gpus(monkeypatch, 2)
    assert devices("cuda", "gloo", layout([4], [2])) == [torch.device("cuda", i) for i in (0, 1, 0, 1)]
    assert devices("auto", "gloo", layout([3], [1])) == [torch.device("cuda", 0)] * 3


def test_cpu_when_asked_or_when_no_gpu(monkeypatch):
    fake_gpus(monkeypatch, 2)
    assert devices("cpu", "gloo", layout([2], [2])) == [torch.device("cpu")] * 2
    fake_gpus(monkeypatch, 0)
    assert devices("auto", "gloo", layout([2], [0])) == [torch.device("cpu")] * 2
    with pytest.raises(launch.SetupError, match="no GPU is visible"):
        launch.choose_device("cuda", "gloo", layout([1], [0]), 0)


# --- resume on a GPU rank -------------------------------------------------------------------

def test_resume_on_a_gpu_rank_restores_the_cpu_rng(tmp_path):
    # "meta" stands in for CUDA: any device other than the CPU gave
    # "RNG state must be a torch.ByteTensor" when the checkpoint was mapped onto it.
    args = cli.parse_args(["--out", str(tmp_path), "--resume"])
    torch.manual_seed(1)
    states = [torch.get_rng_state(), torch.manual_seed(2).get_state()]
    random.seed(3)
    python_state = random.getstate()
    checkpoint.save_checkpoint({"model": {}, "optimizer": {}, "epoch": 1, "step": 0, "history": [],
                           "world_size": 2, "rng": states, "python_rng": python_state,
                           "args": vars(args)}, str(tmp_path / "checkpoint.pt"))
    torch.manual_seed(99)
    random.seed(99)
    ckpt = checkpoint.resume(args, rank=1, world=2, device=torch.device("meta"))
    assert ckpt["epoch"] == 1
    assert torch.equal(torch.get_rng_state(), states[1])
    assert random.getstate() == python_state


# --- the real thing, where there are GPUs ---------------------------------------------------

def _nccl_world(rank, world_size):
    device = torch.device("cuda", rank)
    x = torch.full((1024,), float(rank + 1), device=device)
    import collectives
    collectives.all_reduce(x, algorithm="ring")
    return x[0].item()


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2,
                    reason=f"multi-GPU NCCL needs at least 2 GPUs; {torch.cuda.device_count()} visible")
def test_nccl_one_gpu_per_rank():
    from tests.worlds import run_world
    n = torch.cuda.device_count()
    assert run_world(_nccl_world, n, backend="nccl", timeout=300) == [n * (n + 1) / 2] * n
