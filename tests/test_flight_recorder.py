"""Hangs that torch's own tools can read: the flight recorder and torch's analyzer.

Six ways a job hangs, each in a world of 3 with ``COLLECTIVES_DUMP_ON_TIMEOUT=1``: our own
explanation names the culprit rank within 10 s of the group timeout, every rank that can
write (not a stopped or killed one) dumps its ring buffer in torch's Flight Recorder format,
and ``python -m torch.distributed.flight_recorder.fr_trace DIR`` reads the dumps and, where
it can see the fault, names the same collective and rank.
"""
import os
import pickle
import re
import signal
import subprocess
import sys
import time
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import collectives
from collectives import flight_recorder
from collectives.tools.launch import free_port
from tests import worlds

TIMEOUT = 4.0
WITHIN = 10.0      # the explanation arrives within the timeout plus this
N = 3


def _scenario(rank, name, groups):
    """What each rank does in scenario ``name``; returns the call's outcome."""
    C = collectives
    t = torch.ones(4)
    C.all_reduce(t, algorithm="ring")         # one call that completes: the recorder's history
    if name == "never_calls":
        if rank == 2:
            time.sleep(TIMEOUT + 12)          # busy elsewhere; its watchdog dumps when asked
            return None
        return C.all_reduce(torch.ones(4), algorithm="ring")
    if name == "sizes":
        return C.all_reduce(torch.ones(5 if rank == 2 else 4), algorithm="ring")
    if name == "op":
        op = C.ReduceOp.MAX if rank == 2 else C.ReduceOp.SUM
        return C.all_reduce(torch.ones(4), op=op, algorithm="ring")
    if name == "group_order":
        a, b = groups
        first, second = (b, a) if rank == 2 else (a, b)
        C.all_reduce(torch.ones(4), group=first, algorithm="ring")
        return C.all_reduce(torch.ones(4), group=second, algorithm="ring")
    if name == "stopped":
        if rank == 2:
            os.kill(os.getpid(), signal.SIGSTOP)
            return None
        return C.all_reduce(torch.ones(4), algorithm="ring")
    if name == "killed":
        if rank == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        return C.all_reduce(torch.ones(1 << 16), algorithm="ring")
    raise AssertionError(name)


def _worker(rank, n, port, name, env, results):
    os.environ.update(env)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n)
    groups = [dist.new_group(list(range(n))) for _ in range(2)]
    for g in groups:      # each group's first call (its agreement), in the same order everywhere
        collectives.barrier(group=g)
    start = time.monotonic()
    try:
        _scenario(rank, name, groups)
        value = ("ok", time.monotonic() - start, "")
    except Exception as exc:
        value = (type(exc).__name__, time.monotonic() - start, str(exc))
    except BaseException:
        value = ("crash", 0.0, traceback.format_exc())
    results.put((rank, value))
    # let the others' watchdogs and the store live until every rank has dumped
    time.sleep(6.0)
    results.close()
    results.join_thread()
    os._exit(0)


def _run(name, tmp_path):
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([worlds.__name__])
    results = ctx.Queue()
    port = free_port()
    env = {"COLLECTIVES_TIMEOUT": str(TIMEOUT), "COLLECTIVES_DUMP_ON_TIMEOUT": "1",
           "COLLECTIVES_TRACE_DIR": str(tmp_path)}
    procs = [ctx.Process(target=_worker, daemon=True, args=(r, N, port, name, env, results)) for r in range(N)]
    for p in procs:
        p.start()
    out = {}
    deadline = time.monotonic() + 120
    survivors = N - 1 if name in ("stopped", "killed") else N
    try:
        while len(out) < survivors and time.monotonic() < deadline:
            try:
                rank, value = results.get(timeout=1.0)
            except Exception:
                continue
            out[rank] = value
        time.sleep(3.0)   # the dumps the others' watchdogs write
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        for p in procs:
            p.join(10)
    return out


def _fr_trace(path, *extra):
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(path),
                           *extra], capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stdout + proc.stderr


SCENARIOS = {
    # name: (ranks whose error must name rank 2, how fr_trace names the fault or None)
    "never_calls": ([0, 1], r"Not all ranks joining collective(?s:.*)missing ranks: \{2\}"),
    "sizes": ([0, 1, 2], r"(?s)(size|Size).*(mismatch|does not match)"),
    "op": ([0, 1, 2], None),                   # torch records no op: only our explanation can tell
    # symmetric: ranks 0 and 1 wait for rank 2 in group a, rank 2 for them in group b
    "group_order": ([0, 1], r"Not all ranks joining collective"),
    "stopped": ([0, 1], None),                 # the stopped rank cannot dump: incomplete ranks
    "killed": ([0, 1], None),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_a_hang_is_named_and_dumped_for_torchs_analyzer(name, tmp_path):
    out = _run(name, tmp_path)
    who, pattern = SCENARIOS[name]
    problems = []
    for rank in who:
        if rank not in out:
            problems.append(f"rank {rank} never reported")
            continue
        kind, seconds, text = out[rank]
        if kind in ("ok", "crash"):
            problems.append(f"rank {rank}: {kind} {text}")
            continue
        if seconds > TIMEOUT + WITHIN:
            problems.append(f"rank {rank}: the explanation took {seconds:.1f} s")
        blamed = text.replace(f"on rank {rank}", "")
        if not re.search(r"\brank 2\b|\branks? [0-9, ]*2\b", blamed):
            problems.append(f"rank {rank}'s error does not name rank 2: {text}")
    assert not problems, "\n".join(problems)

    dumped = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(flight_recorder.PREFIX))
    expect = [f"{flight_recorder.PREFIX}{r}" for r in (range(2) if name in ("stopped", "killed") else range(N))]
    assert dumped == expect, dumped
    with open(tmp_path / dumped[0], "rb") as f:
        data = pickle.load(f)
    assert data["version"] == flight_recorder.VERSION
    states = [e["state"] for e in data["entries"]]
    assert "completed" in states and states[-1] in ("started", "scheduled"), states
    last = data["entries"][-1]
    assert last["profiling_name"] == "gloo:all_reduce" and last["collectives"]["algorithm"] == "ring"

    extra = ("--allow-incomplete-ranks",) if name in ("stopped", "killed") else ()
    code, text = _fr_trace(tmp_path, *extra)
    if not flight_recorder.analyzer_reads_gloo():
        # torch 2.11's analyzer refuses every record not named nccl/xccl, and nothing else
        assert "name formatting error? gloo" in text, text
        return
    assert "Traceback" not in text, text
    if pattern is not None:
        assert re.search(pattern, text), text


def test_sigusr1_dumps_the_buffer(tmp_path):
    script = f"""
import os, signal, time, torch, torch.distributed as dist
import collectives
os.environ["COLLECTIVES_TRACE_DIR"] = {str(tmp_path)!r}
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
collectives.all_reduce(torch.ones(3))
os.kill(os.getpid(), signal.SIGUSR1)
time.sleep(0.5)
print(sorted(os.listdir({str(tmp_path)!r})))
dist.destroy_process_group()
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"{flight_recorder.PREFIX}0" in proc.stdout
    with open(tmp_path / f"{flight_recorder.PREFIX}0", "rb") as f:
        data = pickle.load(f)
    assert [e["state"] for e in data["entries"]] == ["completed"]
    assert data["reason"] == "SIGUSR1"


def test_frames_are_kept_unsymbolised_and_name_the_callers_line_when_read():
    # the entry keeps (code, instruction) per frame; the line is worked out when it is read,
    # and must be the line of the call, not the function's first line
    def issuing_call():
        return flight_recorder._frames(), sys._getframe().f_lineno

    frames, line = issuing_call()
    code, lasti = frames[0]
    assert code.co_name == "issuing_call"
    assert flight_recorder._line(code, lasti) == line != code.co_firstlineno
    outer, outer_lasti = frames[1]
    assert outer.co_name == "test_frames_are_kept_unsymbolised_and_name_the_callers_line_when_read"
    assert flight_recorder._line(outer, outer_lasti) == line + 2
