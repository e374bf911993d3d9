"""The whole correctness matrix again, on CUDA tensors: skipped where there is no GPU.

Three ways a GPU meets this library, one test each:

* gloo ranks sharing one GPU: tensors live on the GPU, the library stages them
  through host memory because gloo's point-to-point sends only host buffers;
* NCCL with a world of one: the direct path, no staging, on a single GPU;
* NCCL with one GPU per rank: needs at least two GPUs (NCCL refuses two ranks
  on one device), so it skips on a one-GPU machine.

Every case of ``test_collectives`` runs, with its inputs built on the GPU
(``torch.set_default_device``): results must equal the closed forms and stay
on the caller's device (``assert_close`` checks the device too).
"""
import pytest
import torch
import torch.distributed as dist

from .expected import SIZES
from .test_collectives import assert_matrix_passed, matrix_world
from .worlds import run_world

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def cuda_matrix_world(rank, n):
    torch.cuda.set_device(rank % torch.cuda.device_count())
    torch.set_default_device(torch.device("cuda", torch.cuda.current_device()))
    return matrix_world(rank, n, SIZES, True, False)


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_gloo_ranks_sharing_a_gpu(world_size):
    results = run_world(cuda_matrix_world, world_size, env={"COLLECTIVES_TIMEOUT": "30"}, timeout=400)
    assert_matrix_passed(results, min_cases=500)


def test_nccl_world_of_one():
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert_matrix_passed([cuda_matrix_world(0, 1)], min_cases=500)
    finally:
        torch.set_default_device(None)
        dist.destroy_process_group()


@pytest.mark.skipif(torch.cuda.device_count() < 2,
                    reason=f"NCCL needs a GPU per rank; this machine has {torch.cuda.device_count()}")
@pytest.mark.parametrize("world_size", [2, 3])
def test_nccl_one_gpu_per_rank(world_size):
    if torch.cuda.device_count() < world_size:
        pytest.skip(f"{world_size} ranks need {world_size} GPUs")
    results = run_world(cuda_matrix_world, world_size, env={"COLLECTIVES_TIMEOUT": "30"}, timeout=400,
                        backend="nccl")
    assert_matrix_passed(results, min_cases=500)


def test_door_refuses_cuda_tensors_on_gloo():
    # gloo's send would write() from a device pointer and abort the process ("Bad address")
    from collectives.p2p_communications import Comm
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        comm = Comm(None, "test", "door")
        with pytest.raises(ValueError, match="CUDA tensor but the gloo group sends host memory only"):
            comm.post(0, sends=[(torch.ones(4, device="cuda"), 0)])
    finally:
        dist.destroy_process_group()
