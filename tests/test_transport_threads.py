"""The door takes the wake-up preemption away from gloo's socket threads (docs/benchmarks.md,
"The mid-size cliff"): which threads, when, and the switch that leaves them alone."""
import os

import pytest
import torch
import torch.distributed as dist

import collectives
from collectives import settings
from tests.worlds import run_world

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_BATCH") or not os.path.isdir("/proc/self/task"),
                                reason="SCHED_BATCH and /proc/self/task are Linux's")


def _policies():
    """{thread name: sorted policies} of this process's threads."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            out.setdefault(name, []).append(os.sched_getscheduler(int(tid)))
        except OSError:
            continue
    return {name: sorted(p) for name, p in out.items()}


def _named_io_threads():
    """Whether this torch's gloo names its socket threads (2.14 does; 2.11's leave them
    unnamed, 'python' like the main thread, so the door cannot find them and leaves them be)."""
    return "gloo_tcp_loop" in _policies()


def _calmed(rank, n):
    torch.set_num_threads(1)
    if not _named_io_threads():
        return None
    before = _policies()["gloo_tcp_loop"]
    x = torch.full((1000,), float(rank + 1))
    collectives.all_reduce(x, algorithm="ring")
    after_world = _policies()["gloo_tcp_loop"]
    sub = dist.new_group(list(range(n)))     # a new group: new socket threads
    fresh = _policies()["gloo_tcp_loop"]
    y = torch.full((3,), float(rank))
    collectives.broadcast(y, src=n - 1, group=sub)
    after_sub = _policies()["gloo_tcp_loop"]
    return before, after_world, fresh, after_sub, x[0].item(), y[0].item()


def test_gloo_socket_threads_become_batch_on_first_message():
    results = run_world(_calmed, 2)
    if results[0] is None:
        pytest.skip(f"torch {torch.__version__}'s gloo does not name its socket threads")
    for before, after_world, fresh, after_sub, total, got in results:
        assert set(before) == {os.SCHED_OTHER}
        assert after_world.count(os.SCHED_BATCH) >= 1 and os.SCHED_OTHER not in after_world
        assert os.SCHED_OTHER in fresh          # the new group's threads, not yet seen
        assert set(after_sub) == {os.SCHED_BATCH}
        assert (total, got) == (3.0, 1.0)


def _left_alone(rank, n):
    x = torch.ones(10)
    collectives.all_reduce(x)
    return _policies().get("gloo_tcp_loop", [os.SCHED_OTHER]), x[0].item()


def test_switch_off_leaves_them_as_torch_made_them():
    for policies, total in run_world(_left_alone, 2, env={"COLLECTIVES_GLOO_BATCH": "0"}):
        assert set(policies) == {os.SCHED_OTHER} and total == 2.0


def test_setting_is_validated(monkeypatch):
    monkeypatch.delenv("COLLECTIVES_GLOO_BATCH", raising=False)
    assert settings.gloo_batch() is True
    monkeypatch.setenv("COLLECTIVES_GLOO_BATCH", "0")
    assert settings.gloo_batch() is False
    monkeypatch.setenv("COLLECTIVES_GLOO_BATCH", "sometimes")
    with pytest.raises(ValueError, match="COLLECTIVES_GLOO_BATCH"):
        settings.gloo_batch()
