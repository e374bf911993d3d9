"""Off the happy path: no silent wrong answer, no hang, no abort.

Each test is a program a user really writes when swapping torch's collectives
for ours, and each must end the way the built-in's does, or with a clear error
in bounded time:

* ranks that call different collectives (or the same one with another
  algorithm, size or dtype) all raise ``collectives.DesyncError`` naming both
  calls, with detection always on (``COLLECTIVES_DEBUG`` unset);
* work on two groups progresses independently (torch completes the program);
* a blocking collective inside a ``get_future().then`` callback completes;
* a program that exits with async work not waited for exits with its own code;
* ``get_future().value()`` is what torch's is (a list of tensors);
* a bad ``COLLECTIVES_TIMEOUT`` is one clear error at the first call;
* when a rank stops answering (SIGSTOP), the survivors' errors name it.
"""
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import traceback
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import collectives
from collectives.tools.launch import free_port
from tests import worlds
from tests.expected import builtin_refused
from tests.worlds import run_world

TIMEOUT = 5.0     # COLLECTIVES_TIMEOUT where a failure is expected
SLACK = 8.0       # "within the timeout plus a few seconds", on a loaded 2-core machine
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def attempt(fn):
    """(kind, seconds, text, value): kind is 'ok' or the exception's class name."""
    start = time.monotonic()
    try:
        value = fn()
        return "ok", time.monotonic() - start, "", value
    except Exception as exc:
        return type(exc).__name__, time.monotonic() - start, str(exc), None


# --- (a) ranks that call different things ------------------------------------------------

MEMBERS = [0, 1, 2]   # each case in its own world of 3, on a group of all of them


def _a2a(n):
    return lambda kw: collectives.all_to_all([torch.zeros(2) for _ in range(n)],
                                             [torch.ones(2) for _ in range(n)], algorithm="linear", **kw)


def _ag(n):
    return lambda kw: collectives.all_gather([torch.zeros(2) for _ in range(n)], torch.ones(2),
                                             algorithm="ring", **kw)


# case: (odd global rank, the others' call, the odd rank's call, words both calls must be named by)
DESYNC_CASES = {
    "all_to_all_vs_all_gather": (1, _a2a(3), _ag(3), (r"all_to_all", r"all_gather", r"linear",
                                                      r"\bring\b", r"float32")),
    "all_reduce_vs_reduce_scatter": (
        2, lambda kw: collectives.all_reduce(torch.ones(6), algorithm="ring", **kw),
        lambda kw: collectives.reduce_scatter(torch.zeros(2), [torch.ones(2) for _ in range(3)],
                                              algorithm="ring", **kw),
        (r"all_reduce", r"reduce_scatter", r"\[6\]", r"\[2\]", r"float32")),
    # the root calls reduce, so every rank's messages meet the odd call (a broadcast leaf
    # that only hears from an agreeing root may rightly finish)
    "broadcast_vs_reduce": (
        0, lambda kw: collectives.broadcast(torch.ones(4), src=0, algorithm="binomial_tree", **kw),
        lambda kw: collectives.reduce(torch.ones(4), dst=0, algorithm="binomial_tree", **kw),
        (r"broadcast", r"(?<!_)\breduce\b", r"binomial_tree", r"\[4\]")),
    "algorithm": (
        2, lambda kw: collectives.all_reduce(torch.ones(8), algorithm="ring", **kw),
        lambda kw: collectives.all_reduce(torch.ones(8), algorithm="recursive_doubling", **kw),
        (r"all_reduce", r"\bring\b", r"recursive_doubling", r"\[8\]")),
    "size": (
        0, lambda kw: collectives.all_reduce(torch.ones(8), algorithm="ring", **kw),
        lambda kw: collectives.all_reduce(torch.ones(9), algorithm="ring", **kw),
        (r"all_reduce", r"\[8\]", r"\[9\]", r"\bring\b")),
    "dtype_same_bytes": (
        1, lambda kw: collectives.all_reduce(torch.ones(4), algorithm="ring", **kw),
        lambda kw: collectives.all_reduce(torch.ones(4, dtype=torch.int32), algorithm="ring", **kw),
        (r"all_reduce", r"float32", r"int32")),
    "async": (
        2, lambda kw: collectives.all_reduce(torch.ones(6), algorithm="ring", async_op=True, **kw).wait(),
        lambda kw: collectives.all_gather([torch.zeros(2) for _ in range(3)], torch.ones(2),
                                          algorithm="ring", async_op=True, **kw).wait(),
        (r"all_reduce", r"all_gather", r"\bring\b")),
}
WARMUP_CALLS = 2   # agreeing calls on the group first, so the mismatch is its third call


def _desync_world(rank, world_size, name):
    """One case per world: on the current code a mismatch can abort a process (gloo's
    "Received data size doesn't match expected size"), which would take the other cases down."""
    os.environ.pop("COLLECTIVES_DEBUG", None)   # detection must be on without it
    group = dist.new_group(MEMBERS)
    odd, usual_call, odd_call, _ = DESYNC_CASES[name]
    kw = dict(group=group)
    warmup = attempt(lambda: [collectives.all_reduce(torch.ones(3), **kw) for _ in range(WARMUP_CALLS)])
    if warmup[0] != "ok":
        return warmup[:3]
    return attempt(lambda: (odd_call if rank == odd else usual_call)(kw))[:3]


@pytest.mark.parametrize("case", list(DESYNC_CASES))
def test_different_calls_raise_desync_error_on_every_rank(case):
    """Every member raises DesyncError in time, naming both calls: collective, algorithm,
    the group (its global ranks), the call's sequence number on the group, shape, dtype."""
    odd, _, _, words = DESYNC_CASES[case]
    out = run_world(_desync_world, len(MEMBERS), case, env={"COLLECTIVES_TIMEOUT": str(TIMEOUT)},
                    timeout=60 + TIMEOUT + SLACK)
    for rank in MEMBERS:
        kind, seconds, text = out[rank]
        where = f"{case}, rank {rank}{' (the odd one)' if rank == odd else ''}"
        assert kind == "DesyncError", f"{where}: {kind} after {seconds:.1f} s: {text[:600]}"
        assert seconds < TIMEOUT + SLACK, f"{where}: took {seconds:.1f} s"
        for word in words:
            assert re.search(word, text), f"{where}: the message does not name {word!r}: {text}"
        assert str(MEMBERS) in text, f"{where}: the group's ranks are not named: {text}"
        # the sequence number on the group: #2 counting from 0 (as debug.py does), #3 from 1
        assert re.search(rf"#\s*({WARMUP_CALLS}|{WARMUP_CALLS + 1})\b", text), (
            f"{where}: the call's sequence number is not named: {text}")
        assert f"rank {odd}" in text, f"{where}: the odd rank is not named: {text}"


def test_desync_error_is_exported():
    assert collectives.DesyncError is collectives.desync.DesyncError
    assert issubclass(collectives.DesyncError, collectives.CollectiveError)


# --- (b) two groups, opposite issue orders ------------------------------------------------

def _two_groups(rank, api, a, b):
    """Ranks 0, 1: async on A, blocking on B; ranks 2, 3: async on B, blocking on A."""
    x = torch.full((4,), float(rank + 1))
    y = torch.full((4,), 10.0 * (rank + 1))
    first, second = ((x, a), (y, b)) if rank < 2 else ((y, b), (x, a))
    work = api.all_reduce(first[0], group=first[1], async_op=True)
    api.all_reduce(second[0], group=second[1])
    work.wait()
    return x.tolist(), y.tolist()


def _groups_world(rank, world_size):
    limit = timedelta(seconds=TIMEOUT + SLACK)
    builtin = attempt(lambda: _two_groups(rank, dist, dist.new_group([0, 1, 2, 3], timeout=limit),
                                          dist.new_group([0, 1, 2, 3], timeout=limit)))
    a, b = dist.new_group([0, 1, 2, 3]), dist.new_group([0, 1, 2, 3])
    ours = attempt(lambda: _two_groups(rank, collectives, a, b))
    return builtin, ours


def test_independent_groups_progress_independently():
    out = run_world(_groups_world, 4, env={"COLLECTIVES_TIMEOUT": str(TIMEOUT)}, timeout=120)
    want = ([10.0] * 4, [100.0] * 4)
    for rank, (builtin, ours) in enumerate(out):
        assert builtin[0] == "ok" and builtin[3] == want, f"rank {rank}: the built-in: {builtin}"
        kind, seconds, text, value = ours
        assert kind == "ok", f"rank {rank}: {kind} after {seconds:.1f} s: {text[:600]}"
        assert value == want, f"rank {rank}: {value}"


# --- (c) a blocking collective inside a future's callback ----------------------------------

def _callback_world(rank, world_size):
    x = torch.full((3,), float(rank + 1))

    def callback(fut):
        y = torch.full((2,), 10.0 * (rank + 1))
        collectives.all_reduce(y)   # blocking, on the same group, from inside the callback
        return y

    done = {}

    def run():
        done["outcome"] = attempt(lambda: collectives.all_reduce(x, async_op=True)
                                  .get_future().then(callback).wait().tolist())
    start = time.monotonic()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(TIMEOUT + SLACK)
    if t.is_alive():
        return "hung", time.monotonic() - start, "", None
    return done["outcome"]


def test_blocking_collective_inside_then_callback():
    out = run_world(_callback_world, 2, env={"COLLECTIVES_TIMEOUT": str(TIMEOUT)}, timeout=90)
    for rank, (kind, seconds, text, value) in enumerate(out):
        assert kind != "hung", f"rank {rank}: still waiting after {seconds:.1f} s"
        assert seconds < TIMEOUT + SLACK, f"rank {rank}: took {seconds:.1f} s"
        if kind == "ok":
            assert value == [30.0, 30.0], f"rank {rank}: {value}"
        else:   # a clear error is acceptable: it must say what was wrong
            assert re.search(r"callback|future|then", text, re.I), f"rank {rank}: {kind}: {text}"


# --- (d) exit with async work not waited for -----------------------------------------------

EXIT_SCRIPT = textwrap.dedent("""
    import sys
    import torch
    import torch.distributed as dist
    import collectives

    mode, code = sys.argv[1], int(sys.argv[2])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    work = collectives.all_reduce(torch.ones(1 << 20), async_op=True)   # 4 MiB: still moving
    if mode == "destroy":
        dist.destroy_process_group()
    if code:
        sys.exit(code)
""")
# The warning: one line naming the library and the work left behind.
EXIT_WARNING = re.compile(r"collectives.*(unwaited|(not|never) (been )?waited|pending|unfinished|"
                          r"outstanding|in flight|still running)", re.I)


# sys.exit(3) and falling off the end both end through interpreter finalization; 3 shows
# that the code is the program's. Each case costs two fresh interpreters importing torch.
EXIT_CASES = [("destroy", 3), ("exit", 3)]


@pytest.fixture(scope="module")
def exits(tmp_path_factory):
    """Every case's two ranks started at once (each process imports torch: seconds apiece);
    {case: [(returncode, stderr) per rank]}."""
    script = tmp_path_factory.mktemp("exit") / "exit_with_work.py"
    script.write_text(EXIT_SCRIPT)
    procs = {}
    for mode, code in EXIT_CASES:
        port = free_port()
        for rank in range(2):
            env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                       WORLD_SIZE="2", COLLECTIVES_TIMEOUT="10", PYTHONPATH=ROOT)
            env.pop("COLLECTIVES_DEBUG", None)
            procs[(mode, code, rank)] = subprocess.Popen(
                [sys.executable, str(script), mode, str(code)], env=env,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    results = {}
    deadline = time.monotonic() + 120
    try:
        for key, p in procs.items():
            _, err = p.communicate(timeout=max(deadline - time.monotonic(), 1))
            results.setdefault(key[:2], []).append((p.returncode, err))
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.communicate()
    return results


@pytest.mark.parametrize("mode, code", EXIT_CASES)
def test_exit_with_unwaited_async_work(exits, mode, code):
    """Async work never waited for, then destroy_process_group() and sys.exit(code), or just
    the end of the program: no SIGABRT, the program's own exit code, one warning."""
    for rank, (rc, err) in enumerate(exits[(mode, code)]):
        tail = err[-2000:]
        assert rc != -signal.SIGABRT, f"rank {rank} aborted (SIGABRT):\n{tail}"
        assert rc == code, f"rank {rank} exited with {rc}, the program's own code is {code}:\n{tail}"
        warnings = [line for line in err.splitlines() if EXIT_WARNING.search(line)]
        assert len(warnings) == 1, f"rank {rank}: want one warning, got {len(warnings)}:\n{tail}"


# --- (e) get_future().value() -------------------------------------------------------------

def _future_calls(api, rank, n):
    def t(k=0):
        return torch.arange(3, dtype=torch.float32) + 10 * rank + 100 * k
    kw = dict(async_op=True)
    return {
        "broadcast": lambda: api.broadcast(t(), src=0, **kw),
        "reduce": lambda: api.reduce(t(), dst=0, **kw),
        "all_reduce": lambda: api.all_reduce(t(), **kw),
        "scatter": lambda: api.scatter(t(), [t(k) for k in range(n)] if rank == 0 else None, src=0, **kw),
        "gather": lambda: api.gather(t(), [t(k) for k in range(n)] if rank == 0 else None, dst=0, **kw),
        "all_gather": lambda: api.all_gather([t(k) for k in range(n)], t(), **kw),
        "reduce_scatter": lambda: api.reduce_scatter(t(), [t(k) for k in range(n)], **kw),
        "all_to_all": lambda: api.all_to_all([t(k) for k in range(n)], [t(k) for k in range(n)], **kw),
        "barrier": lambda: api.barrier(**kw),
    }


def _shape_of(value):
    """A comparable picture of a future's value: lists of tensor values."""
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype), value.tolist())
    if isinstance(value, (list, tuple)):
        return ("list", [_shape_of(v) for v in value])
    return ("other", type(value).__name__, repr(value)[:100])


def _no_values(shape):
    if shape[0] == "tensor":
        return shape[0], shape[1], len(shape[2])
    if shape[0] == "list":
        return shape[0], [_no_values(v) for v in shape[1]]
    return shape


def _future_value(make):
    work = make()
    fut = work.get_future()
    work.wait()
    return _shape_of(fut.wait())


def _futures_world(rank, n):
    out = {}
    for name in _future_calls(collectives, rank, n):
        ours = attempt(lambda: _future_value(_future_calls(collectives, rank, n)[name]))
        builtin = attempt(lambda: _future_value(_future_calls(dist, rank, n)[name]))
        out[name] = ours, builtin
    return out


@pytest.mark.parametrize("n", [2, 3])
def test_future_value_is_torchs(n):
    out = run_world(_futures_world, n, timeout=120)
    bad = []
    for rank in range(n):
        for name, (ours, builtin) in out[rank].items():
            where = f"{name} on rank {rank} of {n}"
            if ours[0] != "ok":
                bad.append(f"{where}: {ours}")
            elif builtin[0] == "ok":
                if name == "reduce" and rank != 0:
                    # off dst, torch leaves its scratch in the tensor ("only dst receives the
                    # final result"): compare the shape of the value, not what it holds
                    ours, builtin = _no_values(ours[3]), _no_values(builtin[3])
                    if ours != builtin:
                        bad.append(f"{where}: ours {ours}, torch's {builtin}")
                elif ours[3] != builtin[3]:
                    bad.append(f"{where}: ours {ours[3]}, torch's {builtin[3]}")
            elif name == "reduce_scatter":
                # torch's gloo has no future for reduce_scatter ("Work::getFuture not
                # implemented"); the closed form is what its other collectives give: [output]
                want = sum(torch.arange(3, dtype=torch.float32) + 10 * r + 100 * rank for r in range(n))
                if ours[3] != ("list", [_shape_of(want)]):
                    bad.append(f"{where}: ours {ours[3]}, want [output] = {want.tolist()}")
            elif name == "all_to_all" and builtin_refused(builtin[2]):
                # torch 2.11's gloo has no alltoall at all; the closed form: output k is what
                # rank k sent to this rank, and the value is the output list
                want = [torch.arange(3, dtype=torch.float32) + 10 * k + 100 * rank for k in range(n)]
                if ours[3] != ("list", [_shape_of(w) for w in want]):
                    bad.append(f"{where}: ours {ours[3]}, want {[w.tolist() for w in want]}")
            else:
                bad.append(f"{where}: torch's future failed: {builtin}")
    assert not bad, "\n".join(bad)


# --- (f) bad COLLECTIVES_TIMEOUT ---------------------------------------------------------

BAD_TIMEOUTS = ("inf", "nan", "0", "-1", "abc")


def _bad_timeout_world(rank, world_size):
    out = {}
    for value in BAD_TIMEOUTS:
        os.environ["COLLECTIVES_TIMEOUT"] = value
        out[value] = (attempt(lambda: collectives.all_reduce(torch.ones(4)))[:3],
                      attempt(lambda: collectives.all_reduce(torch.ones(4), async_op=True))[:3])
        os.environ["COLLECTIVES_TIMEOUT"] = "30"
        dist.barrier()   # a rank that accepted the value has finished its call before the next
    t = torch.ones(2)
    collectives.all_reduce(t)   # a good value works again
    out["after"] = t.tolist()
    return out


def test_bad_timeout_values_raise_one_clear_error_at_the_first_call():
    out = run_world(_bad_timeout_world, 2, timeout=120)
    bad = []
    for rank in range(2):
        assert out[rank]["after"] == [2.0, 2.0]
        for value in BAD_TIMEOUTS:
            for how, (kind, seconds, text) in zip(("blocking", "async_op=True"), out[rank][value]):
                where = f"COLLECTIVES_TIMEOUT={value!r}, {how}, rank {rank}"
                if kind != "ValueError":
                    bad.append(f"{where}: {kind}: {text}")
                elif seconds > SLACK:
                    bad.append(f"{where}: took {seconds:.1f} s")
                elif "COLLECTIVES_TIMEOUT" not in text or repr(value) not in text:
                    bad.append(f"{where}: the variable or the value is not named: {text}")
                elif not (re.search(r"finite", text)
                          and re.search(r"positive|> ?0|0 ?<|greater than 0", text)):
                    bad.append(f"{where}: the accepted range is not stated: {text}")
    assert not bad, "\n".join(bad)


# --- (g) a rank that stops answering -----------------------------------------------------

def _stopped_world(rank, world_size, stopped):
    if rank == stopped:
        os.kill(os.getpid(), signal.SIGSTOP)   # alive, sockets open, silent
        return None
    return attempt(lambda: collectives.all_reduce(torch.ones(1024), algorithm="ring"))[:3]


def _stopped_worker(rank, n, port, stopped, env, results, ready):
    """Like worlds' worker, but the result is flushed before anything else and the group is
    not torn down: with a member stopped, teardown may block (with rank 0 stopped it held
    the result back for good)."""
    os.environ.update(env)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n)
    # the rank stops only once every rank is out of init_process_group: gloo's rendezvous may
    # still read a peer's address from the store after rank 0's own init has returned, and a
    # stopped rank 0 (the store's host) then held rank 3 inside torch's init for good, before
    # any collective of ours
    ready.wait(60)
    try:
        value = (True, _stopped_world(rank, n, stopped))
    except BaseException:
        value = (False, traceback.format_exc())
    results.put((rank, *value))
    results.close()
    results.join_thread()
    os._exit(0)


def _process_state(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "?"


@pytest.mark.parametrize("stopped", [2, 0])
def test_stopped_rank_is_named_by_the_survivors(stopped):
    """One rank of 4 is SIGSTOPped before a ring all_reduce; every survivor's error names it,
    not the neighbour that only forwarded the silence. Rank 0 also hosts the rendezvous store,
    so it cannot be asked where it is. The stopped rank is SIGKILLed at the end."""
    n = 4
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([worlds.__name__])
    results = ctx.Queue()
    port = free_port()
    env = {"COLLECTIVES_TIMEOUT": str(TIMEOUT)}
    ready = ctx.Barrier(n)
    procs = [ctx.Process(target=_stopped_worker, daemon=True,
                         args=(r, n, port, stopped, env, results, ready)) for r in range(n)]
    for p in procs:
        p.start()
    out, states = {}, set()
    deadline = time.monotonic() + 90
    try:
        while len(out) < n - 1 and time.monotonic() < deadline:
            try:
                rank, ok, value = results.get(timeout=1.0)
            except Exception:
                continue
            out[rank] = value if ok else ("traceback", 0.0, value)
        # On a loaded machine the survivors can give up before the stopped rank has run
        # os.kill (its gloo setup may lag); give it a moment rather than sample once.
        until = time.monotonic() + 20
        while _process_state(procs[stopped].pid) != "T" and time.monotonic() < until:
            time.sleep(0.1)
        states.add(_process_state(procs[stopped].pid))
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()   # SIGKILL ends a stopped process too
        for p in procs:
            p.join(10)
    assert not any(p.is_alive() for p in procs), "a process of the world outlived the test"
    assert states == {"T"}, f"rank {stopped} was not stopped (state {states})"
    assert sorted(out) == [r for r in range(n) if r != stopped], f"ranks that answered: {sorted(out)}"
    bad = []
    for rank, (kind, seconds, text) in sorted(out.items()):
        blamed = text.replace(f"on rank {rank}", "")
        if kind not in ("CollectiveTimeout", "CollectiveError"):
            bad.append(f"rank {rank}: {kind}: {text}")
        elif seconds > TIMEOUT + SLACK:
            bad.append(f"rank {rank}: took {seconds:.1f} s")
        elif not re.search(rf"\brank {stopped}\b", blamed):
            bad.append(f"rank {rank}'s error does not name the stopped rank {stopped}: {text}")
    assert not bad, "\n".join(bad)
