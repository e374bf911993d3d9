"""PyTorch's own distributed test suite on backend "collectives" (docs/torch_suite.md).

torch ships ``torch/testing/_internal/distributed/distributed_test.py`` in its wheel; torch's CI
runs it on gloo and NCCL. Here it runs on our backend at world size 2 (``tests/torch_suite.py``
drives it as torch's harness does), in two parts:

* ``SELECTION``: every case that passes on gloo here and that torch's own decorators do not
  skip for a backend other than gloo (66 on torch 2.14.1; none errs);
* ``GATED``: cases torch skips for any backend but gloo by its *name* alone, although what they
  test is every backend's job (``all_reduce_coalesced``, ``get_future``, DDP without
  ``no_sync``...): run with the decorators reading "gloo" and the worlds on our backend.

The cases that pass on gloo and are left out, each with its reason, are listed in
docs/torch_suite.md. A case a torch version does not have is reported "absent" and passes.
"""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SELECTION = [
    "test_Backend_enum_class", "test_DistributedDataParallelCPU",
    "test_DistributedDataParallelCPU_grad_is_view", "test_SyncBatchNorm_process_group",
    "test_all_gather", "test_all_gather_coalesced_complex", "test_all_gather_coalesced_full_group",
    "test_all_gather_coalesced_simple", "test_all_gather_coalesced_with_empty",
    "test_all_gather_complex", "test_all_gather_full_group",
    "test_all_reduce_coalesced_max_complex_unsupported", "test_all_reduce_complex_unsupported_ops",
    "test_all_reduce_full_group_max", "test_all_reduce_full_group_min",
    "test_all_reduce_full_group_product", "test_all_reduce_full_group_sum", "test_all_reduce_max",
    "test_all_reduce_min", "test_all_reduce_product", "test_all_reduce_sum",
    "test_all_reduce_sum_async", "test_all_reduce_sum_complex", "test_barrier",
    "test_barrier_full_group", "test_broadcast", "test_broadcast_full_group",
    "test_ddp_create_graph", "test_ddp_logging_data_cpu", "test_destroy_full_group",
    "test_destroy_group", "test_dump_DDP_relevant_env_vars", "test_gather", "test_gather_checks",
    "test_gather_full_group", "test_get_backend", "test_get_rank", "test_get_rank_size_full_group",
    "test_get_rank_size_group", "test_irecv", "test_isend", "test_isend_autograd_profiler",
    "test_isend_torch_profiler", "test_reduce_full_group_max", "test_reduce_full_group_min",
    "test_reduce_full_group_product", "test_reduce_full_group_sum", "test_reduce_max",
    "test_reduce_min", "test_reduce_product", "test_reduce_sum", "test_reduce_sum_twice",
    "test_scatter", "test_scatter_checks", "test_scatter_complex", "test_scatter_full_group",
    "test_send_recv", "test_send_recv_any_source", "test_send_recv_any_source_autograd_profiler",
    "test_send_recv_any_source_torch_profiler", "test_send_recv_autograd_profiler",
    "test_send_recv_torch_profiler", "test_send_recv_with_tag",
    "test_send_recv_with_tag_autograd_profiler", "test_send_recv_with_tag_torch_profiler",
    "test_static_graph_api_cpu",
]

GATED = [
    "test_DistributedDataParallel_requires_grad", "test_all_gather_object_default_pg",
    "test_all_gather_object_subgroup", "test_all_reduce_coalesced_full_group_max",
    "test_all_reduce_coalesced_full_group_min", "test_all_reduce_coalesced_full_group_product",
    "test_all_reduce_coalesced_full_group_sum", "test_all_reduce_coalesced_max",
    "test_all_reduce_coalesced_min", "test_all_reduce_coalesced_product",
    "test_all_reduce_coalesced_sum", "test_batch_isend_irecv_gloo", "test_batch_isend_irecv_gloo_tags",
    "test_get_future", "test_grads_same_across_ranks_with_no_sync",
    "test_scatter_object_list",
]


def _run(names, tmp_path, decorate_as=None, timeout=400):
    pytest.importorskip("expecttest", reason="torch's test utilities need expecttest (pip install -e '.[test]')")
    out = tmp_path / "outcomes.json"
    temp_dir = tmp_path / "temp"
    temp_dir.mkdir()
    env = {**os.environ, "BACKEND": "collectives", "WORLD_SIZE": "2", "TEMP_DIR": str(temp_dir),
           "COLLECTIVES_TIMEOUT": "60", "PYTORCH_PRINT_REPRO_ON_FAILURE": "0"}
    if decorate_as:
        env["TORCH_SUITE_DECORATE_AS"] = decorate_as
    run = subprocess.run([sys.executable, "-m", "tests.torch_suite", "--json", str(out), *names], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=timeout)
    assert out.exists(), f"the suite did not finish (exit {run.returncode}):\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    outcomes = json.loads(out.read_text())["outcomes"]
    assert set(outcomes) == set(names)
    bad = {name: o for name, o in outcomes.items() if o != "passed" and o != "absent"}
    assert not bad, f"torch's cases that did not pass on our backend: {bad}\n{run.stderr[-6000:]}"
    return outcomes


@pytest.mark.slow
def test_torchs_distributed_suite_passes_on_our_backend(tmp_path):
    outcomes = _run(SELECTION, tmp_path)
    assert list(outcomes.values()).count("passed") >= 50, outcomes


@pytest.mark.slow
def test_torchs_gloo_only_cases_pass_on_our_backend(tmp_path):
    _run(GATED, tmp_path, decorate_as="gloo")
