"""A multi-node torchrun job in a lab: one torchrun agent per host, c10d rendezvous at host 0.

What a real cluster runs on each node (``torchrun --nnodes K --nproc-per-node L
--rdzv-backend c10d --rdzv-endpoint HOST0:PORT ...``), run here with each agent inside its host's
namespace (``ip netns exec``). Host 0's agent hosts the rendezvous store (``is_host=1``: every
namespace shares the machine's hostname, so torchrun cannot tell which one is host 0 by name),
and ``--local-addr`` tells each agent its own address, which the ranks then meet at.
"""
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time

from .netns import Lab
from .world import lab_environment

RDZV_PORT = 29400      # inside the lab's own namespaces: no other program can hold it


def _die_with_launcher():
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG


def agent_command(lab, host, argv, nproc_per_host):
    """The command line of host ``host``'s torchrun agent (run inside its namespace)."""
    k = lab.spec.hosts
    return ["ip", "netns", "exec", lab.netns[host], sys.executable, "-m", "torch.distributed.run",
            "--nnodes", str(k), "--nproc-per-node", str(nproc_per_host),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{lab.addresses[0]}:{RDZV_PORT}",
            "--rdzv-id", f"collab{lab.id}", "--rdzv-conf", f"is_host={int(host == 0)},join_timeout=60",
            "--local-addr", lab.addresses[host], "--max-restarts", "0", "--monitor-interval", "0.5",
            *argv]


def _stop(procs):
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    end = time.monotonic() + 10
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=max(0.1, end - time.monotonic()))
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def torchrun(spec, argv, env=None, timeout=None):
    """Build the lab of ``spec``, run ``torchrun ... argv`` with one agent per host; return the exit code.

    ``spec.ranks_per_host`` (default 1) is each agent's ``--nproc-per-node``, so ranks are placed
    host by host, as torchrun always places them. When an agent fails, the others are stopped;
    past ``timeout`` seconds all are killed and TimeoutError is raised. The lab is gone after.

    Args:
        spec (LabSpec): The lab.
        argv (list[str]): What follows torchrun's own flags: ``["-m", "collectives.train", ...]``
            or ``["script.py", ...]``.
        env (dict, optional): Added to every agent's environment.
        timeout (float, optional): Seconds before everything is killed.

    Returns:
        int: 0 if every agent succeeded, else the first failing agent's exit code.
    """
    per_host = spec.ranks_per_host or 1
    layout = [h for h in range(spec.hosts) for _ in range(per_host)]
    with Lab(spec) as lab:
        procs = []
        try:
            for host in range(spec.hosts):
                agent_env = {**os.environ, **(env or {}), **lab_environment(lab, layout, host)}
                procs.append(subprocess.Popen(agent_command(lab, host, argv, per_host), env=agent_env,
                                              preexec_fn=_die_with_launcher))
            deadline = None if timeout is None else time.monotonic() + timeout
            while True:
                codes = [p.poll() for p in procs]
                failed = [c for c in codes if c not in (None, 0)]
                if failed:
                    return failed[0]
                if all(c == 0 for c in codes):
                    return 0
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"torchrun on lab {spec} did not finish in {timeout:g} s")
                time.sleep(0.2)
        finally:
            _stop(procs)
