"""benchmarks/doorbell.py, run as a user runs it: every mechanism delivers every wake, one row
each with numbers, the FIFO's ratio to itself 1.00; a wake that is not rung fails the run.
No timing is asserted (the figures are in docs/benchmarks.md, "Doorbells")."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the doorbells are Linux's")


def _run(args, tmp_path, timeout=60):
    return subprocess.run([sys.executable, "-m", "benchmarks.doorbell", *args, "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def _rows(stdout):
    """{(pairs, mechanism): [median, p90, p99, vs_fifo, cpu, got, expected]} from the table."""
    rows = {}
    for line in stdout.splitlines():
        number = r"\s+([\d.]+)"
        m = re.fullmatch(r"\s*(\d+)\s+(\w+)\s+\d/\d\s+(?:yes|no)" + number * 5 + r"\s+(\d+)/(\d+)", line)
        if m:
            key = (int(m.group(1)), m.group(2))
            assert key not in rows, f"two rows for {key}:\n{stdout}"
            rows[key] = [float(x) for x in m.groups()[2:]]
    return rows


def test_every_mechanism_delivers_every_wake(tmp_path):
    from benchmarks import doorbell
    here = [m for m, why in doorbell.available().items() if why is None]
    n, w = 50, 5
    done = _run(["-n", str(n), "-w", str(w), "--pairs", "1,2", "--idle", "0.5"], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "load average" in done.stdout and "cores" in done.stdout
    rows = _rows(done.stdout)
    assert set(rows) == {(p, m) for p in (1, 2) for m in here}, done.stdout
    for (pairs, mechanism), (med, p90, p99, ratio, cpu, got, expected) in rows.items():
        assert expected == 2 * pairs * (n + w)          # each round trip: A's wake and B's
        assert got == expected, f"{mechanism} lost wakes:\n{done.stdout}"
        assert 0 < med <= p90 <= p99
        assert ratio > 0 and cpu > 0
        if mechanism == "fifo":
            assert ratio == 1.0
    saved = json.loads((tmp_path / "doorbell.json").read_text())
    assert {(r["pairs"], r["mechanism"]) for r in saved["rows"]} == set(rows)
    assert all(r["samples"] == r["pairs"] * n for r in saved["rows"])
    assert saved["meta"]["cores"] >= 1
    # never rung, each wait sleeps out its 0.5 s in kernel waits of up to 50 ms each: about 10
    # of them (fewer, never more, when the machine is slow to wake it), where a spinning wait
    # comes around thousands of times however little CPU it gets. Its CPU: a few wake-ups' worth;
    # a spinner's share of 2 cores among 6 waiters is 0.5 s x 2 / 36 = 28 ms even at a load of 30
    idle = {r["mechanism"]: r for r in saved["idle"]}
    assert set(idle) == set(here), done.stdout
    for m, r in idle.items():
        assert r["error"] is None and r["wall"] >= 0.5, (m, r)
        assert 1 <= r["sleeps"] <= 0.5 / doorbell.SLICE + 3, f"{m}'s wait: {r}\n{done.stdout}"
        assert r["cpu"] < 0.020, f"{m}'s wait used {r['cpu'] * 1e3:.1f} ms of CPU in 0.5 s: it spins\n{done.stdout}"


@pytest.mark.parametrize("mechanism", ["fifo", "futex"])   # a pollable bell, and the one that is not
def test_a_lost_wake_fails_the_run(tmp_path, mechanism):
    from benchmarks import doorbell
    if doorbell.available()[mechanism]:
        pytest.skip(doorbell.available()[mechanism])
    done = _run(["-n", "20", "-w", "2", "--pairs", "1", "--mechanisms", f"fifo,{mechanism}",
                 "--drop", f"{mechanism}:7", "--timeout", "0.5", "--idle", "0"], tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert re.search(rf"FAILED: [AB]0: Lost: {mechanism}: no ring within 0.5 s", done.stdout), done.stdout
    assert re.search(rf"FAILED: {mechanism} \(pairs 1\) delivered \d+/44 wakes", done.stdout), done.stdout
