"""The lab: hosts as network namespaces with shaped links, worlds and torchrun inside it, teardown.

Tests that build a lab need root and tbf; without them they skip, giving
:func:`collectives.tools.lab.unavailable_reason` as the reason. The rest (parsing,
layouts, refusal messages) run everywhere.
"""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from collectives import settings
from collectives.tools import lab, launch
from collectives.tools.lab import netns
from tests.worlds import run_in_group

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
needs_lab = pytest.mark.skipif(bool(lab.unavailable_reason()), reason=f"no lab here: {lab.unavailable_reason()}")


def _mine():
    """Lab namespaces of this process still present."""
    return [n for n in netns._namespaces() if n.startswith(f"{netns.PREFIX}{os.getpid()}-")]


# --- no privilege needed --------------------------------------------------------------------

def test_parse_and_layouts():
    spec = lab.parse_lab("hosts=2, ranks-per-host=2, rate=500mbit")
    assert (spec.hosts, spec.ranks_per_host, spec.rate) == (2, 2, 500_000_000)
    assert str(spec) == "hosts=2,ranks-per-host=2,rate=500mbit"
    assert lab.parse_lab("hosts=3").layout(7) == [0, 0, 0, 1, 1, 2, 2]
    assert lab.parse_lab("hosts=3").layout(3) == [0, 1, 2]
    assert lab.parse_lab("hosts=2,placement=interleaved").layout(5) == [0, 1, 0, 1, 0]
    assert lab.parse_rate("1.5gbit") == 1_500_000_000 and lab.parse_rate("8000") == 8000
    for bad, words in [("ranks-per-host=2", "hosts=K is required"), ("hosts=0", "1..64"),
                       ("hosts=2,rate=1gbps", "not a rate"), ("hosts=2,speed=1", "unknown key"),
                       ("hosts=2,hosts=3", "given twice"), ("hosts=2,placement=x", "placement"),
                       ("hosts", "key=value")]:
        with pytest.raises(ValueError, match=words):
            lab.parse_lab(bad)
    with pytest.raises(ValueError, match="leaves hosts empty"):
        lab.parse_lab("hosts=4").layout(2)
    with pytest.raises(ValueError, match="2 hosts x 2 ranks per host is 4 ranks, but the world has 3"):
        lab.parse_lab("hosts=2,ranks-per-host=2").layout(3)


def test_layout_settings(monkeypatch):
    monkeypatch.delenv("COLLECTIVES_LAB_LAYOUT", raising=False)
    assert settings.lab_layout() is None and settings.lab_rate() is None
    monkeypatch.setenv("COLLECTIVES_LAB_LAYOUT", "0,1,0,1")
    monkeypatch.setenv("COLLECTIVES_LAB_RATE", "1000000000")
    assert settings.lab_layout() == [0, 1, 0, 1] and settings.lab_rate() == 10 ** 9
    for bad in ("0,2", "a,b", "-1,0"):
        monkeypatch.setenv("COLLECTIVES_LAB_LAYOUT", bad)
        with pytest.raises(ValueError, match="COLLECTIVES_LAB_LAYOUT"):
            settings.lab_layout()


def test_refusal_without_privilege():
    """Without CAP_NET_ADMIN/CAP_SYS_ADMIN the lab refuses at once, naming what is missing."""
    setpriv = "/usr/bin/setpriv"
    if os.geteuid() != 0 or not os.path.exists(setpriv):
        pytest.skip("needs root and setpriv to drop the capabilities")
    out = subprocess.run([setpriv, "--bounding-set", "-net_admin,-sys_admin", "--inh-caps", "-all",
                          sys.executable, "-m", "collectives.tools.lab", "check"],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert "lacks CAP_NET_ADMIN and CAP_SYS_ADMIN" in out.stdout and "run it as root" in out.stdout
    train = subprocess.run([setpriv, "--bounding-set", "-net_admin,-sys_admin", "--inh-caps", "-all",
                            sys.executable, "-m", "collectives.train", "--world-size", "2",
                            "--lab", "hosts=2", "--out", "/nonexistent/never"],
                           cwd=REPO, capture_output=True, text=True, timeout=60)
    assert train.returncode == 1 and "--lab: the lab needs root" in train.stderr


def test_refusal_without_tbf(monkeypatch):
    real = netns._run

    def no_tbf(*argv, check=True):
        if argv[0] == "tc":
            return subprocess.CompletedProcess(argv, 2, "", "Error: Specified qdisc kind is unknown.")
        return real(*argv, check=check)

    monkeypatch.setattr(netns, "_run", no_tbf)
    monkeypatch.setattr(netns, "_reason_cache", {})
    monkeypatch.setattr(netns, "_privilege_problem", lambda: None)
    if os.geteuid() != 0:
        pytest.skip("the probe namespace needs root")
    reason = lab.unavailable_reason()
    assert "cannot shape a link with tbf" in reason and "modprobe sch_tbf" in reason
    with pytest.raises(launch.SetupError, match="--lab: the kernel cannot shape a link with tbf"):
        launch.start_world(print, 2, lab="hosts=2", timeout=30)
    assert _mine() == []


# --- in a lab ------------------------------------------------------------------------------

@needs_lab
def test_lab_network_and_teardown():
    with lab.Lab(lab.parse_lab("hosts=2,rate=200mbit")) as built:
        lab_id = built.id
        assert lab.leftovers(lab_id)                      # namespaces and pid file exist
        qdisc = subprocess.run(["tc", "-n", built.netns[1], "qdisc", "show", "dev", "eth0"],
                               capture_output=True, text=True).stdout
        assert "tbf" in qdisc and "200Mbit" in qdisc
        qdisc = subprocess.run(["tc", "-n", built.switch, "qdisc", "show", "dev", "h1"],
                               capture_output=True, text=True).stdout
        assert "tbf" in qdisc and "200Mbit" in qdisc      # and the other direction
        ping = subprocess.run(["ip", "netns", "exec", built.netns[0], sys.executable, "-c",
                               "import socket; s = socket.create_connection(('169.254.77.2', 9), 2)"],
                              capture_output=True, text=True, timeout=30)
        assert "Connection refused" in ping.stderr      # host 1 answered (nobody listens on 9)
        with lab.inside(built.netns[0]):
            routes = subprocess.run(["ip", "route"], capture_output=True, text=True).stdout
        assert routes.strip() == "169.254.77.0/24 dev eth0 proto kernel scope link src 169.254.77.1"
    assert lab.leftovers(lab_id) == []


def _place(rank, world):
    x = torch.full((5,), float(rank + 1))
    import collectives
    collectives.all_reduce(x, algorithm="ring")
    return (x[0].item(), int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"]),
            settings.lab_layout(), os.readlink("/proc/self/ns/net"), os.environ["MASTER_ADDR"])


def _fail(rank, world):
    if rank == 1:
        raise RuntimeError("rank 1 fails on purpose")
    import collectives
    collectives.all_reduce(torch.ones(3))


@needs_lab
def test_world_in_lab_two_levels_and_teardown():
    """2 hosts x 2 ranks, interleaved: each rank on its host, told its place; nothing left after."""
    out = run_in_group(_place, 4, lab="hosts=2,ranks-per-host=2,placement=interleaved", timeout=120,
                       start_method="forkserver", preload=["tests.worlds"], env={"COLLECTIVES_TIMEOUT": "30"})
    assert [o[0] for o in out] == [10.0] * 4
    assert [(o[1], o[2]) for o in out] == [(0, 2), (0, 2), (1, 2), (1, 2)]
    assert all(o[3] == [0, 1, 0, 1] for o in out) and out[0][5] == "169.254.77.1"
    ns = [o[4] for o in out]
    assert ns[0] == ns[2] != ns[1] == ns[3] and os.readlink("/proc/self/ns/net") not in ns
    assert _mine() == []
    with pytest.raises(AssertionError, match="rank 1 fails on purpose"):
        try:
            run_in_group(_fail, 2, lab="hosts=2", timeout=120, start_method="forkserver",
                         preload=["tests.worlds"], env={"COLLECTIVES_TIMEOUT": "30"})
        except launch.WorldError as exc:
            raise AssertionError(str(exc)) from None
    assert _mine() == []


@needs_lab
@pytest.mark.slow
def test_torchrun_two_hosts(tmp_path):
    """torchrun with one agent per host (c10d at host 0): 2 hosts x 2 ranks, a real all_reduce."""
    code = lab.torchrun(lab.parse_lab("hosts=2,ranks-per-host=2"),
                        [os.path.join(REPO, "tests", "lab_rank.py"), str(tmp_path)],
                        env={"COLLECTIVES_TIMEOUT": "60", "PYTHONPATH": REPO}, timeout=240)
    assert code == 0
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
    assert all(s["sum"] == s["want"] == 10 and s["world"] == 4 for s in seen)
    assert [(s["local_rank"], s["local_world"]) for s in seen] == [(0, 2), (1, 2), (0, 2), (1, 2)]
    assert all(s["layout"] == [0, 0, 1, 1] and s["rate"] == 10 ** 9 for s in seen)
    assert seen[0]["netns"] == seen[1]["netns"] != seen[2]["netns"] == seen[3]["netns"]
    assert seen[0]["master"] in ("169.254.77.1", "169.254.77.2")
    assert _mine() == []


# The holder takes Ctrl-C whatever it inherited: a suite started in the background by a
# non-interactive shell (`nohup ... &`) runs with SIGINT ignored, which every child inherits,
# and Python then installs no KeyboardInterrupt (the SIGINT case waited out its 60 s).
HOLD = """
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
from collectives.tools import lab
with lab.Lab(lab.parse_lab("hosts=2")) as built:
    print(built.id, flush=True)
    time.sleep(120)
"""


def _holder():
    proc = subprocess.Popen([sys.executable, "-c", HOLD], cwd=REPO, stdout=subprocess.PIPE, text=True)
    lab_id = proc.stdout.readline().strip()
    assert lab_id.startswith(f"{proc.pid}-") and lab.leftovers(lab_id)
    return proc, lab_id


@needs_lab
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_launcher_interrupted_tears_down(sig):
    proc, lab_id = _holder()
    assert lab.clean_stale() == [] or lab.leftovers(lab_id)     # a live lab is never "stale"
    assert lab.leftovers(lab_id)
    proc.send_signal(sig)
    proc.wait(timeout=60)
    assert lab.leftovers(lab_id) == []


@needs_lab
def test_killed_launcher_is_cleaned_at_next_start():
    proc, lab_id = _holder()
    proc.kill()
    proc.wait(timeout=30)
    time.sleep(0.2)
    # SIGKILL: nothing could run, so the lab is still there and stale (unless a lab started
    # by a test running beside this one has already removed it).
    assert lab_id in netns.stale_labs() or not lab.leftovers(lab_id)
    with lab.Lab(lab.parse_lab("hosts=1")):     # the next start removes it
        assert lab.leftovers(lab_id) == []


def test_launchers_refuse_a_world_that_does_not_fit(tmp_path, capsys):
    """The trainer and the benchmarks refuse a mismatched --lab before anything starts."""
    from benchmarks import sweep
    from collectives.train import cli
    with pytest.raises(SystemExit) as stop:
        cli.main(["--world-size", "2", "--lab", "hosts=4", "--out", str(tmp_path / "run")])
    assert "a world of 2 rank(s) leaves hosts empty" in str(stop.value.code)
    assert not (tmp_path / "run").exists()
    with pytest.raises(SystemExit):
        cli.parse_args(["--lab", "hosts=2,rate=fast"])
    assert "--lab rate='fast' is not a rate" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        sweep.parse_args(["--lab", "hosts=2,ranks-per-host=2", "--world-size", "2,4"])
    assert "2 hosts x 2 ranks per host is 4 ranks, but the world has 2" in capsys.readouterr().err
    with pytest.raises(launch.SetupError, match="leaves hosts empty"):
        launch.start_world(print, 1, lab="hosts=2", timeout=30)


def _hierarchical_bytes_over_links(rank, world):
    """Bytes this rank sent to ranks on other hosts in one hierarchical all_reduce, and its result."""
    import collectives
    from collectives.p2p_communications import hosts_of
    hosts = hosts_of(range(world))
    x = torch.full((4096,), float(rank + 1))
    with collectives.trace() as tr:
        collectives.all_reduce(x, algorithm="hierarchical")
    sent = sum(m.nbytes for m in tr.messages if m.kind == "send" and hosts[m.dst] != hosts[rank])
    return hosts, sent, x[0].item()


@needs_lab
def test_hierarchical_follows_an_interleaved_lab():
    """With ranks interleaved over 2 hosts, the hierarchy groups by the true hosts (the lab's
    layout), so each host sends S over its link, not the 2 S a block guess would cost."""
    import collectives
    if "hierarchical" not in collectives.ALGORITHMS["all_reduce"]:
        pytest.skip("this version has no hierarchical all_reduce")
    out = run_in_group(_hierarchical_bytes_over_links, 4, lab="hosts=2,placement=interleaved",
                       timeout=120, start_method="forkserver", preload=["tests.worlds"],
                       env={"COLLECTIVES_TIMEOUT": "30"})
    assert all(o[0] == (0, 1, 0, 1) and o[2] == 10.0 for o in out)
    per_host = [sum(o[1] for o, h in zip(out, (0, 1, 0, 1)) if h == host) for host in (0, 1)]
    assert per_host == [4096 * 4, 4096 * 4]          # S = 16 KiB each way
