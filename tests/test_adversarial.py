"""The adversarial programs of issue 29, each a test, each run on torch's gloo too where that
makes sense: ours must never end worse than the built-in (a silent wrong answer, a hang, a
raw traceback), and may end better (sooner, with a clearer error).

* roots: ``src=-1``, ``dst=-1``, ``src=5`` in a world of 2, through our backend and through
  our API: the same clear error on every rank before any message, and the group still works;
* every rank runs the same algorithm: an uneven ``all_to_all``, an uneven ``all_gather``,
  tuning tables that differ per rank, ``COLLECTIVES_ALGO`` that differs per rank;
* collectives issued inside future callbacks, torch's PowerSGD and fp16 DDP hooks;
* a rank killed mid ``all_reduce``: every survivor names it, soon, whatever the algorithm;
* destroy and init again (also after an error), destroying one group while another has
  work in flight, and the lane threads of destroyed groups.
"""
import json
import os
import re
import threading
import time

import pytest
import torch
import torch.distributed as dist

import collectives
from collectives import desync
from tests.worlds import run_world

TIMEOUT = 4.0     # COLLECTIVES_TIMEOUT where a failure is expected
SLACK = 8.0       # "within the timeout plus a few seconds", on a loaded 2-core machine


def attempt(fn):
    """(kind, text): kind is 'ok' or the exception's class name."""
    try:
        fn()
        return "ok", ""
    except Exception as exc:
        return type(exc).__name__, str(exc)


# --- roots -----------------------------------------------------------------------------

def _root_cases(rank, ours_api):
    """name -> a call with a root torch's gloo refuses (-1, or 5 in a world of 2)."""
    t = torch.full((3,), rank + 1.0)
    if ours_api:
        b, r, g, s = collectives.broadcast, collectives.reduce, collectives.gather, collectives.scatter
    else:
        b, r, g, s = dist.broadcast, dist.reduce, dist.gather, dist.scatter
    return {
        "broadcast src=-1": lambda: b(t, src=-1),
        "broadcast src=5": lambda: b(t, src=5),
        "reduce dst=-1": lambda: r(t, dst=-1),
        "reduce dst=5": lambda: r(t, dst=5),
        "gather dst=-1": lambda: g(t, None, dst=-1),      # no rank is the root: no list
        "scatter src=5": lambda: s(t, None, src=5),
    }, t


def _roots_world(rank, n, ours_api):
    cases, t = _root_cases(rank, ours_api)
    outcomes = {}
    for name, call in cases.items():
        outcomes[name] = attempt(call)
        # nothing moved: the tensor is this rank's own and the group still works
        outcomes[name] += (t.tolist(),)
    after = torch.full((2,), rank + 1.0)
    dist.all_reduce(after)
    return outcomes, after.tolist()


@pytest.mark.parametrize("backend,ours_api", [("collectives", False), ("gloo", True), ("gloo", False)],
                         ids=["our-backend", "our-api", "gloo"])
def test_bad_roots_raise_the_same_clear_error_on_every_rank(backend, ours_api):
    results = run_world(_roots_world, 2, ours_api, backend=backend, env={"COLLECTIVES_TIMEOUT": "20"},
                        timeout=120)
    for rank, (outcomes, after) in enumerate(results):
        assert after == [3.0, 3.0], f"rank {rank}: the group no longer works after the bad roots"
        for name, (kind, text, t) in outcomes.items():
            assert kind != "ok", f"rank {rank}: {name} raised nothing (gloo: invalid root rank)"
            assert t == [rank + 1.0] * 3, f"rank {rank}: {name} wrote into the tensor: {t}"
            if backend == "collectives" or ours_api:
                assert kind == "ValueError" and re.search(r"out of range", text), f"rank {rank}: {name}: {text}"
                assert "collectives" in text, text
    if backend == "collectives" or ours_api:
        errors = [{name: o[:2] for name, o in outcomes.items()} for outcomes, _ in results]
        assert errors[0] == errors[1], "the ranks raised different errors"


# --- every rank runs the same algorithm ----------------------------------------------------

def _table(tmp, rank, choices):
    path = os.path.join(tmp, f"table-rank{rank}.json")
    with open(path, "w") as f:
        json.dump({"choices": choices}, f)
    return path


# rank 0's table says ring/linear everywhere, rank 1's recursive_doubling/pairwise: before
# the tables were agreed, the ranks ran different algorithms and timed out (DesyncError)
TABLES = [{"all_reduce": {"2": [[4, "ring"]]}, "all_to_all": {"2": [[4, "linear"]]}},
          {"all_reduce": {"2": [[4, "recursive_doubling"]]}, "all_to_all": {"2": [[4, "pairwise"]]}}]
# one table for both ranks, whose all_to_all choice turns at 64 KiB: an uneven all_to_all
# with 16 bytes from rank 0 and 1 MiB from rank 1 chose by each rank's own bytes
BY_SIZE = {"all_to_all": {"2": [[1024, "linear"], [1 << 20, "pairwise"]]}}


def _same_algorithm_world(rank, n, tmp, through):
    from collectives import tuning
    os.environ["COLLECTIVES_TUNING_TABLE"] = _table(tmp, rank, TABLES[rank])
    tuning.reload()
    if through == "backend":
        group = dist.new_group([0, 1], backend="collectives")
        all_reduce, all_to_all, all_gather = dist.all_reduce, dist.all_to_all_single, dist.all_gather
    elif through == "api":
        group = dist.new_group([0, 1], backend="gloo")
        all_reduce, all_to_all, all_gather = (collectives.all_reduce, collectives.all_to_all_single,
                                              collectives.all_gather)
    else:   # torch's gloo, the same program
        group = dist.new_group([0, 1], backend="gloo")
        all_reduce, all_to_all, all_gather = dist.all_reduce, dist.all_to_all_single, dist.all_gather
    out = {}
    t = torch.full((1000,), rank + 1.0)
    all_reduce(t, group=group)
    out["all_reduce"] = t[0].item()
    # uneven all_to_all: rank 0 sends 4 floats to each rank, rank 1 65536
    os.environ["COLLECTIVES_TUNING_TABLE"] = _table(tmp, 2, BY_SIZE)
    tuning.reload()
    count = [4, 65536]
    inp = torch.cat([torch.full((count[rank],), 10.0 * rank + j) for j in range(2)])
    outp = torch.zeros(sum(count))
    all_to_all(outp, inp, count, [count[rank]] * 2, group=group)
    outs = outp.split(count)
    out["all_to_all"] = [(o.numel(), o[0].item(), o[-1].item()) for o in outs]
    # uneven all_gather: rank r contributes r + 1 elements (gloo refuses: "invalid tensor size")
    if through == "gloo":
        return out
    lst = [torch.zeros(j + 1) for j in range(2)]
    all_gather(lst, torch.full((rank + 1,), rank + 5.0), group=group)
    out["all_gather"] = [x.tolist() for x in lst]
    return out


@pytest.mark.parametrize("through", ["backend", "api", "gloo"])
def test_every_rank_runs_the_same_algorithm(through, tmp_path):
    results = run_world(_same_algorithm_world, 2, str(tmp_path), through,
                        env={"COLLECTIVES_TIMEOUT": str(TIMEOUT)}, timeout=120)
    for rank, out in enumerate(results):
        assert out["all_reduce"] == 3.0
        assert out["all_to_all"] == [(4, float(rank), float(rank)), (65536, 10.0 + rank, 10.0 + rank)]
        assert out.get("all_gather", [[5.0], [6.0, 6.0]]) == [[5.0], [6.0, 6.0]]


def _algo_env_world(rank, n):
    os.environ["COLLECTIVES_ALGO"] = "all_reduce:ring" if rank == 0 else "all_reduce:recursive_doubling"
    start = time.monotonic()
    kind, text = attempt(lambda: dist.new_group([0, 1], backend="collectives"))
    return kind, text, time.monotonic() - start


def test_collectives_algo_that_differs_between_ranks_is_one_clear_error():
    results = run_world(_algo_env_world, 2, env={"COLLECTIVES_TIMEOUT": str(TIMEOUT)}, timeout=90)
    assert results[0][:2] == results[1][:2], results
    for kind, text, seconds in results:
        assert kind == "ValueError", text
        assert "COLLECTIVES_ALGO='all_reduce:ring'" in text and \
            "COLLECTIVES_ALGO='all_reduce:recursive_doubling'" in text, text
        assert seconds < TIMEOUT, f"took {seconds:.1f} s: the error must come at once"


# --- collectives inside future callbacks ----------------------------------------------------

def _callback_cases(rank, through):
    """name -> a program that issues a collective from inside a future's callback."""
    if through in ("backend", "gloo"):
        all_reduce = dist.all_reduce
    else:
        all_reduce = collectives.all_reduce

    def blocking(fut):
        y = torch.full((2,), 10.0 * (rank + 1))
        all_reduce(y)
        return y

    def async_then_wait(fut):
        y = torch.full((2,), 10.0 * (rank + 1))
        all_reduce(y, async_op=True).wait()
        return y

    def async_future(fut):
        y = torch.full((2,), 10.0 * (rank + 1))
        return all_reduce(y, async_op=True).get_future().wait()[0]
    return {"blocking": blocking, "async then wait": async_then_wait, "async future": async_future}


def _callback_world(rank, n, through):
    out = {}
    for name, callback in _callback_cases(rank, through).items():
        x = torch.full((3,), float(rank + 1))
        done = {}

        def run():
            work = (collectives.all_reduce if through == "api" else dist.all_reduce)(x, async_op=True)
            done["value"] = attempt(lambda: done.setdefault("y", work.get_future().then(callback).wait()))
        start = time.monotonic()
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        thread.join(TIMEOUT + SLACK)
        if thread.is_alive():
            out[name] = ("hung", time.monotonic() - start)
            break
        kind, text = done["value"]
        out[name] = (kind, text) if kind != "ok" else ("ok", done["y"].tolist())
    return out


@pytest.mark.parametrize("through", ["backend", "api", "gloo"])
def test_collectives_inside_future_callbacks_complete(through):
    backend = "collectives" if through == "backend" else "gloo"
    results = run_world(_callback_world, 2, through, backend=backend, env={"COLLECTIVES_TIMEOUT": str(TIMEOUT)},
                        timeout=120)
    for rank, out in enumerate(results):
        assert out == {name: ("ok", [30.0, 30.0]) for name in ("blocking", "async then wait", "async future")}, \
            f"rank {rank}: {out}"


# --- destroy, init again; one group's destroy; lane threads ---------------------------------

def _reinit_world(rank, n, backend, tmp):
    """An error that leaves the ranks' call numbers apart, then destroy and init again."""
    t = torch.ones(4)
    if rank == 0:   # rank 0's call fails validation: no call number taken
        attempt(lambda: collectives.all_reduce(t, algorithm="no_such_algorithm"))
    else:           # rank 1's runs alone and times out
        attempt(lambda: collectives.all_reduce(t))
    dist.destroy_process_group()
    dist.init_process_group(backend, init_method=f"file://{tmp}/store", rank=rank, world_size=n)
    t = torch.full((4,), rank + 1.0)
    outcome = attempt(lambda: collectives.all_reduce(t))
    return outcome, t.tolist()


@pytest.mark.parametrize("backend", ["gloo", "collectives"])
def test_destroy_and_init_again_starts_clean_after_an_error(backend, tmp_path):
    results = run_world(_reinit_world, 2, backend, str(tmp_path), backend=backend,
                        env={"COLLECTIVES_TIMEOUT": "2"}, timeout=120)
    for rank, (outcome, t) in enumerate(results):
        assert outcome == ("ok", ""), f"rank {rank}: {outcome}"
        assert t == [3.0] * 4


def _destroy_one_world(rank, n, backend):
    """Rank 0 leaves async work pending on group A and destroys group B; rank 1 first enters a
    world barrier, then does its part on A. Destroying B must not wait for A."""
    a = dist.new_group([0, 1], backend=backend)
    b = dist.new_group([0, 1], backend=backend)
    dist.all_reduce(torch.ones(1), group=b)
    t = torch.full((2,), rank + 1.0)
    start = time.monotonic()
    if rank == 0:
        work = dist.all_reduce(t, group=a, async_op=True)   # waits for rank 1's part
        dist.destroy_process_group(b)
        dist.barrier()
        work.wait()
    else:
        dist.destroy_process_group(b)
        dist.barrier()
        dist.all_reduce(t, group=a)
    return t.tolist(), time.monotonic() - start


@pytest.mark.parametrize("backend", ["collectives", "gloo"])
def test_destroying_one_group_waits_only_for_its_own_work(backend):
    results = run_world(_destroy_one_world, 2, backend, backend=backend, env={"COLLECTIVES_TIMEOUT": str(TIMEOUT)},
                        timeout=120)
    for rank, (t, seconds) in enumerate(results):
        assert t == [3.0, 3.0], f"rank {rank}: {t}"
        assert seconds < TIMEOUT, f"rank {rank}: {seconds:.1f} s (waited for another group's work)"


def _threads_world(rank, n, through):
    import gc
    before = threading.active_count()
    for _ in range(100):
        g = dist.new_group([0, 1], backend="collectives" if through == "backend" else "gloo")
        t = torch.ones(2)
        work = (dist.all_reduce if through == "backend" else collectives.all_reduce)(t, group=g, async_op=True)
        work.wait()
        dist.destroy_process_group(g)
        del g, work
    gc.collect()
    deadline = time.monotonic() + 10
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    return before, threading.active_count()


@pytest.mark.parametrize("through", ["backend", "api"])
def test_destroyed_groups_leave_no_thread(through):
    results = run_world(_threads_world, 2, through, backend="collectives" if through == "backend" else "gloo",
                        timeout=180)
    for rank, (before, after) in enumerate(results):
        assert after == before, f"rank {rank}: {before} threads before 100 groups, {after} after"


# --- a rank killed mid all_reduce -----------------------------------------------------------

def _killed_world(rank, n, algorithm, builtin):
    from tests.worlds import DEATH_EXIT_CODE
    t = torch.ones(1 << 12)
    dist.barrier()
    if dist.get_backend() == "collectives":   # torch's call on our backend (COLLECTIVES_ALGO picks)
        builtin = True
    if rank == 1:           # dies while the others are inside the all_reduce
        time.sleep(0.5)
        os._exit(DEATH_EXIT_CODE)
    start = time.monotonic()
    if builtin:
        kind, text = attempt(lambda: dist.all_reduce(t))
    else:
        kind, text = attempt(lambda: collectives.all_reduce(t, algorithm=algorithm))
    return kind, text, time.monotonic() - start


@pytest.mark.parametrize("algorithm,through", [("naive_ring", "api"), ("ring", "api"),
                                               ("recursive_doubling", "api"), ("tree", "api"),
                                               ("naive_ring", "backend"), ("ring_pipelined", "backend")])
def test_a_killed_rank_is_named_by_every_survivor_as_soon_as_gloo_knows(algorithm, through):
    # the deaths must be found by their closed connections, on the door gloo's own run uses: over
    # shared memory a survivor that raised and exited is seen gone at once (its pidfd), and a
    # rank that waited only on it may blame it instead of the rank that died first
    env = {"COLLECTIVES_TIMEOUT": "60", "COLLECTIVES_TRANSPORT": "gloo"}
    gloo = run_world(_killed_world, 3, algorithm, True, env=env, timeout=120)
    if through == "backend":
        env["COLLECTIVES_ALGO"] = f"all_reduce:{algorithm}"
    ours = run_world(_killed_world, 3, algorithm, False, env=env, timeout=120,
                     backend="collectives" if through == "backend" else "gloo")
    slowest_gloo = max(r[2] for r in gloo if r is not None)
    for rank, outcome in enumerate(ours):
        if rank == 1:
            continue
        kind, text, seconds = outcome
        assert kind in ("CollectiveError", "CollectiveTimeout"), f"rank {rank}: {kind}: {text}"
        assert "rank 1 of the group" in text and "died" in text, f"rank {rank}: {text}"
        # the polling interval: a rank whose connection closed has ALIVE_WAIT seconds to show
        # it is alive (it timed out) before it is named dead; 1.5 s more for a loaded machine
        print(f"{algorithm} through {through}: rank {rank} {seconds:.2f} s, gloo's slowest {slowest_gloo:.2f} s")
        assert seconds <= slowest_gloo + desync.ALIVE_WAIT + 1.5, \
            f"rank {rank} ({algorithm}): {seconds:.1f} s; gloo's slowest survivor: {slowest_gloo:.1f} s"


# --- torch's DDP communication hooks ------------------------------------------------------------

def _hooks_world(rank, n, hook_name):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    from torch.nn.parallel import DistributedDataParallel
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                                        torch.nn.Linear(16, 4)))
    if hook_name == "powerSGD":
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                            start_powerSGD_iter=2, min_compression_rate=0.5)
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    else:
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(rank)
    for _ in range(4):
        x, y = torch.randn(5, 8, generator=gen), torch.randn(5, 4, generator=gen)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return [p.detach().reshape(-1).tolist() for p in model.parameters()]   # lists: no shared memory


@pytest.mark.parametrize("hook_name", ["powerSGD", "fp16"])
def test_torchs_ddp_hooks_train_on_our_backend(hook_name):
    env = {"COLLECTIVES_TIMEOUT": str(TIMEOUT)}
    ours = run_world(_hooks_world, 2, hook_name, backend="collectives", env=env, timeout=120)
    gloo = run_world(_hooks_world, 2, hook_name, backend="gloo", env=env, timeout=120)
    assert ours[0] == ours[1], "the ranks' models differ"
    for a, b in zip(ours[0], gloo[0]):
        a, b = torch.tensor(a), torch.tensor(b)
        # the same steps as on gloo (the sums may round differently: another algorithm)
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-3)


# --- the launcher's headline --------------------------------------------------------------------

def _stopped_rank_world(rank, n):
    import signal
    dist.barrier()
    if rank == 2:
        os.kill(os.getpid(), signal.SIGSTOP)   # alive, sockets open, silent (killed by the launcher)
    collectives.all_reduce(torch.ones(64), algorithm="ring")


def test_the_launchers_first_line_names_the_rank_the_timeout_found_silent():
    with pytest.raises(AssertionError) as info:
        run_world(_stopped_rank_world, 3, env={"COLLECTIVES_TIMEOUT": "3"}, timeout=90)
    headline = str(info.value).splitlines()[0]
    assert headline.startswith("rank 2 of 3 never answered"), headline
