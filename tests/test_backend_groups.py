"""The collectives backend: every kind of group, backend strings, COLLECTIVES_ALGO, clear errors, timeouts."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.distributed as dist

import collectives
from collectives.backend import backend_of
from collectives.errors import UnsupportedOperation
from collectives.settings import parse_algorithms

from .worlds import run_world


def groups_world(rank, n):
    out = {}
    # split_group: the parent backend splits itself (supports_splitting)
    try:
        g = dist.split_group(split_ranks=[[0, 1], [2]])
    except RuntimeError as exc:
        # torch up to 2.14 splits only a group bound to a device (see the test)
        out["split"] = str(exc)
    else:
        t = torch.full((2,), float(rank))
        with collectives.count_traffic() as traffic:
            dist.all_reduce(t, group=g)
        out["split"] = (t.tolist(), dist.get_backend(g), traffic.sent_messages > 0 if rank < 2 else None)
    # subgroups
    cur, _ = dist.new_subgroups_by_enumeration([[0, 2], [1]])
    t = torch.full((1,), rank + 1.0)
    dist.all_reduce(t, group=cur)
    out["subgroups"] = (t.item(), dist.get_backend(cur))
    # uneven all_gather: rank r contributes r + 1 elements
    outs = [torch.empty(i + 1) for i in range(n)]
    dist.all_gather(outs, torch.full((rank + 1,), float(rank)))
    out["uneven"] = [o.tolist() for o in outs]
    # which algorithm ran: COLLECTIVES_ALGO was read when the world group was made
    with collectives.trace() as messages:
        dist.all_reduce(torch.ones(10))
        dist.broadcast(torch.ones(10), src=0)
    out["algorithms"] = sorted({(m.collective, m.algorithm) for m in messages})
    # clear errors, raised on the calling rank before any message moves
    errors = {}
    for name, call in [("sparse", lambda: dist.all_reduce(torch.eye(2).to_sparse())),
                       ("premul", lambda: dist.all_reduce(torch.ones(2), op=dist._make_nccl_premul_sum(2.0))),
                       ("bool sum", lambda: dist.all_reduce(torch.ones(2, dtype=torch.bool)))]:
        try:
            call()
            errors[name] = None
        except UnsupportedOperation as exc:
            errors[name] = str(exc)
        except (ValueError, RuntimeError) as exc:
            errors[name] = f"{type(exc).__name__}: {exc}"
    out["errors"] = errors
    return out


def test_groups_algorithm_choice_and_errors():
    results = run_world(groups_world, 3, backend="collectives",
                        env={"COLLECTIVES_ALGO": "all_reduce:recursive_doubling,broadcast:binomial_tree"})
    for rank, out in enumerate(results):
        want = [1.0, 1.0] if rank < 2 else [2.0, 2.0]
        if isinstance(out["split"], str):
            # torch up to 2.14 splits only a group bound to a device (gloo's CPU groups neither);
            # 2.15 splits ours
            assert "No device associated with the default pg" in out["split"], out["split"]
            assert torch.__version__ < "2.15", f"torch {torch.__version__} refused split_group: {out['split']}"
        else:
            assert out["split"] == (want, "collectives", True if rank < 2 else None)
        assert out["subgroups"] == ((4.0 if rank != 1 else 2.0), "collectives")
        assert out["uneven"] == [[float(i)] * (i + 1) for i in range(3)]
        assert out["algorithms"] == [("all_reduce", "recursive_doubling"), ("broadcast", "binomial_tree")]
        errors = out["errors"]
        assert errors["sparse"] == ("collectives backend: allreduce: a tensor has layout torch.sparse_coo; "
                                    "only dense (strided) tensors can be sent")
        assert errors["premul"].startswith("collectives backend: allreduce: op must be a "
                                           "torch.distributed.ReduceOp"), errors["premul"]
        assert "op=ReduceOp.SUM is not defined for dtype torch.bool" in errors["bool sum"]


def test_parse_algorithms():
    assert parse_algorithms("all_reduce:ring, broadcast : pipeline,") == {"all_reduce": "ring",
                                                                         "broadcast": "pipeline"}
    assert parse_algorithms("") == {}
    with pytest.raises(ValueError, match=r"COLLECTIVES_ALGO: unknown algorithm 'rign' for all_reduce; valid: "):
        parse_algorithms("all_reduce:rign")
    with pytest.raises(ValueError, match=r"unknown collective 'allreduce' in 'allreduce:ring'; valid: broadcast"):
        parse_algorithms("allreduce:ring")
    with pytest.raises(ValueError, match=r"entry 'ring' must read collective:algorithm"):
        parse_algorithms("ring")


def bad_env_world(rank, n):
    return "unreachable"


def test_unknown_algorithm_fails_at_init():
    with pytest.raises(AssertionError, match="COLLECTIVES_ALGO: unknown algorithm 'fastest' for all_gather"):
        run_world(bad_env_world, 2, backend="collectives", env={"COLLECTIVES_ALGO": "all_gather:fastest"},
                  timeout=60)


def backend_string_world(rank, n):
    t = torch.full((3,), rank + 1.0)
    with collectives.count_traffic() as traffic:
        dist.all_reduce(t)
    return dist.get_backend(), t.tolist(), traffic.sent_messages


@pytest.mark.parametrize("spec", [
    "cpu:collectives",
    pytest.param("cpu:collectives,cuda:nccl", marks=pytest.mark.skipif(
        not torch.cuda.is_available(), reason="torch's NCCL backend needs a GPU to be created")),
])
def test_backend_strings(spec):
    for backend, t, messages in run_world(backend_string_world, 2, backend=spec):
        assert backend == spec and t == [3.0] * 3 and messages > 0


def late_world(rank, n):
    import time
    if rank == 1:
        time.sleep(8)                                 # never calls the collective (and stays alive)
        return None
    start = time.monotonic()
    try:
        dist.all_reduce(torch.ones(4))
    except Exception as exc:
        return time.monotonic() - start, type(exc).__name__, str(exc)
    return "no error"


def test_a_missing_peer_times_out_with_our_message():
    results = run_world(late_world, 2, backend="collectives", env={"COLLECTIVES_TIMEOUT": "2"}, timeout=90)
    seconds, kind, text = results[0]
    assert seconds < 30 and kind == "CollectiveTimeout", results[0]
    assert "collectives.all_reduce" in text and "timed out after 2 s" in text


SCRIPT = textwrap.dedent("""
    import torch, torch.distributed as dist, collectives
    dist.init_process_group("collectives")            # env:// from torchrun
    t = torch.full((2,), dist.get_rank() + 1.0)
    dist.all_reduce(t)
    print(f"rank {dist.get_rank()}: {t.tolist()} on {dist.get_backend()}", flush=True)
    dist.destroy_process_group()
""")


def test_torchrun_env_init(tmp_path):
    from collectives.tools.launch import free_port
    script = tmp_path / "prog.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1")
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                          "--master-port", str(free_port()), str(script)],
                         capture_output=True, text=True, timeout=180, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "rank 0: [3.0, 3.0] on collectives" in run.stdout and "rank 1: [3.0, 3.0] on collectives" in run.stdout


def group_timeout_world(rank, n):
    import datetime
    import time
    group = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=2))
    if rank == 1:
        time.sleep(10)                                # never calls the collective on that group
        return None
    start = time.monotonic()
    try:
        dist.all_reduce(torch.ones(4), group=group)
    except Exception as exc:
        return time.monotonic() - start, type(exc).__name__, str(exc)
    return "no error"


def test_the_groups_own_timeout_bounds_each_wait():
    """``new_group(timeout=2 s)`` bounds the waits even though COLLECTIVES_TIMEOUT (30 s here) is longer."""
    results = run_world(group_timeout_world, 2, backend="collectives", timeout=90)
    seconds, kind, text = results[0]
    assert kind == "CollectiveTimeout" and seconds < 20, results[0]
    assert "timed out after 2 s" in text, text


def uneven_gather_world(silent_seconds):
    """A world that joins its group itself, with the group's own timeout of 3 s (no
    COLLECTIVES_TIMEOUT below it), then an uneven all_gather that rank 2 never enters."""
    import datetime
    import time
    from collectives.tools.launch import place
    rank, _, world, _ = place()
    torch.set_num_threads(1)
    dist.init_process_group("collectives", init_method="env://", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=3))
    try:
        if rank == 2:
            time.sleep(silent_seconds)            # alive, but never calls the collective
            return None
        outs = [torch.zeros(i + 1) for i in range(world)]       # rank i contributes i + 1 elements
        start = time.monotonic()
        try:
            dist.all_gather(outs, torch.full((rank + 1,), float(rank)))
        except Exception as exc:
            return time.monotonic() - start, type(exc).__name__, str(exc)
        return "no error"
    finally:
        if rank != 2:
            dist.destroy_process_group()


def test_uneven_all_gather_takes_the_one_path_and_the_groups_timeout():
    """Issue 23: the backend's uneven all_gather used to build its own door and skip the call
    machinery, so the group's own timeout (3 s) and the timeout explanation did not apply: it
    waited COLLECTIVES_TIMEOUT (60 s here) and blamed the neighbour."""
    from collectives.tools import launch
    results = launch.start_world(uneven_gather_world, 3, 25, env={"COLLECTIVES_TIMEOUT": "60"},
                                 timeout=120, start_method="forkserver", preload=["tests.worlds"])
    for rank in (0, 1):
        seconds, kind, text = results[rank]
        assert kind == "CollectiveTimeout" and seconds < 20, results[rank]
        assert "rank 2" in text and "never answered" in text, text
        assert "all_gather" in text, text
