"""Build and tear down a lab: K hosts (network namespaces) on one switch, links shaped by tbf.

The network, for ``hosts=K``::

    host k (namespace collab<ID>-h<k>)        switch (namespace collab<ID>-sw)
      eth0 169.254.77.<k+1>/24 --- veth --- h<k> --[bridge br0]-- h<j> ... --- eth0 of host j
      tbf rate R on eth0 (host -> switch)     tbf rate R on h<k> (switch -> host)

* Every address is in 169.254.77.0/24 (IPv4 link-local) and lives only inside the lab's
  namespaces: no interface of the machine's own namespace is created or touched, there is no
  route out, and IPv6 is off on every lab interface (no link-local IPv6 chatter).
* Every name starts with ``collab<ID>`` where ID is ``<launcher pid>-<n>``; the owner's pid and
  start time are written to ``/run/collectives-lab/collab<ID>.pid`` *before* anything is
  created and removed *after* everything is gone. A lab whose owner no longer runs (killed with
  SIGKILL, say) is stale, and the next lab to start removes it.
* Teardown kills what still runs in the namespaces, deletes the veths and the bridge, then the
  namespaces, then the pid file. It runs on normal exit, on an exception, on Ctrl-C and on
  SIGTERM/SIGHUP (turned into SystemExit while a lab is up in the main thread).

torch's store prints "[c10d] The hostname of the client socket cannot be retrieved. err=-3"
once per connection in a lab: it looks up a name for each peer's address, and no name
service knows the lab's addresses. It is harmless (the connection is made by address).
"""
import contextlib
import ctypes
import os
import re
import shutil
import signal
import subprocess
import sys
import threading

PREFIX = "collab"
NETNS_DIR = "/run/netns"
STATE_DIR = "/run/collectives-lab"
SUBNET = "169.254.77"            # the lab's one /24 (IPv4 link-local), documented in README
IFNAME = "eth0"                  # each host's link, the name inside its namespace
BRIDGE = "br0"
_NAME = re.compile(rf"^{PREFIX}(\d+-\d+)-(sw|h\d+|probe)$")
_CLONE_NEWNET = 0x40000000
_CAP_NET_ADMIN, _CAP_SYS_ADMIN = 12, 21
_counter = iter(range(1 << 30))


class LabUnavailable(RuntimeError):
    """This machine cannot build a lab: the message says what is missing and what to do."""


class LabError(RuntimeError):
    """A command building or tearing down the lab failed; the message holds it and what it said."""


# --- commands ------------------------------------------------------------------------------

def _run(*argv, check=True):
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        raise LabError(f"lab: `{' '.join(argv)}` did not finish in 20 s") from None
    if check and proc.returncode:
        raise LabError(f"lab: `{' '.join(argv)}` failed: {proc.stderr.strip() or proc.returncode}")
    return proc


def _effective_caps():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    return 0


def _start_time(pid):
    """The process's start time in clock ticks (field 22 of /proc/PID/stat), or None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


# --- can a lab start here? ---------------------------------------------------------------

def _privilege_problem():
    if not sys.platform.startswith("linux"):
        return f"the lab needs Linux network namespaces; this is {sys.platform}"
    missing = [t for t in ("ip", "tc") if shutil.which(t) is None]
    if missing:
        return (f"the lab needs iproute2's `{'` and `'.join(missing)}` on PATH "
                f"(apt-get install iproute2)")
    caps = _effective_caps()
    lacking = [name for bit, name in ((_CAP_NET_ADMIN, "CAP_NET_ADMIN"), (_CAP_SYS_ADMIN, "CAP_SYS_ADMIN"))
               if not caps >> bit & 1]
    if lacking:
        return (f"the lab needs root: this process lacks {' and '.join(lacking)} (network namespaces "
                f"need CAP_SYS_ADMIN, links and tc need CAP_NET_ADMIN); run it as root, e.g. "
                f"`sudo -E {os.path.basename(sys.executable)} ...`, or leave --lab out")
    return None


def _tbf_problem(netns):
    proc = _run("tc", "-n", netns, "qdisc", "add", "dev", "lo", "root", "tbf",
                "rate", "1gbit", "burst", "64kb", "latency", "10ms", check=False)
    if proc.returncode:
        return (f"the kernel cannot shape a link with tbf: `tc qdisc add ... tbf` said "
                f"{proc.stderr.strip()!r}; load it (`modprobe sch_tbf`) or use a kernel built with "
                f"CONFIG_NET_SCH_TBF")
    return None


_reason_cache = {}


def unavailable_reason():
    """None if a lab can be built here, else why not (what tests print when they skip).

    Checks the tools, the privileges, and tbf for real (in a throw-away namespace).
    """
    if "reason" not in _reason_cache:
        reason = _privilege_problem()
        if reason is None:
            try:
                with _Owned() as owned:
                    _run("ip", "netns", "add", owned.name("probe"))
                    reason = _tbf_problem(owned.name("probe"))
            except (LabError, OSError) as exc:
                reason = f"the lab could not create a network namespace: {exc}"
        _reason_cache["reason"] = reason
    return _reason_cache["reason"]


def check_available():
    """Raise :class:`LabUnavailable` (saying what is missing) unless a lab can be built here."""
    reason = unavailable_reason()
    if reason:
        raise LabUnavailable(reason)


# --- ownership: pid files, stale labs, teardown --------------------------------------------

def _namespaces():
    try:
        return sorted(n for n in os.listdir(NETNS_DIR) if _NAME.match(n))
    except FileNotFoundError:
        return []


def _pid_file(lab_id):
    return os.path.join(STATE_DIR, f"{PREFIX}{lab_id}.pid")


def _owner_alive(lab_id):
    try:
        with open(_pid_file(lab_id)) as f:
            pid, start = (int(x) for x in f.read().split())
    except (OSError, ValueError):
        return False
    return _start_time(pid) == start


def remove(lab_id):
    """Remove lab ``lab_id`` entirely: its processes, veths, bridge, namespaces, then its pid file.

    Tolerates parts already gone (another process may be cleaning the same stale lab).
    """
    names = [n for n in _namespaces() if _NAME.match(n).group(1) == lab_id]
    for ns in names:
        pids = _run("ip", "netns", "pids", ns, check=False).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
    for ns in names:
        # Deleting the namespace frees its links only once no process holds it; deleting the
        # links first leaves nothing behind even if a killed process is slow to go.
        if ns.endswith("-sw"):
            links = _run("ip", "-n", ns, "-o", "link", "show", check=False).stdout
            for dev in re.findall(r"^\d+: ([^:@]+)", links, flags=re.M):
                if dev != "lo":
                    _run("ip", "-n", ns, "link", "del", dev, check=False)
        elif _NAME.match(ns).group(2).startswith("h"):
            _run("ip", "-n", ns, "link", "del", IFNAME, check=False)
        _run("ip", "netns", "del", ns, check=False)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(_pid_file(lab_id))


def stale_labs():
    """Ids of labs whose owner is gone (its pid file missing, or its process no longer running)."""
    ids = {_NAME.match(n).group(1) for n in _namespaces()}
    with contextlib.suppress(FileNotFoundError):
        ids |= {f[len(PREFIX):-4] for f in os.listdir(STATE_DIR)
                if f.startswith(PREFIX) and f.endswith(".pid")}
    return sorted(i for i in ids if not _owner_alive(i))


def clean_stale():
    """Remove every stale lab; return their ids. Labs of running launchers are left alone."""
    gone = stale_labs()
    for lab_id in gone:
        remove(lab_id)
    return gone


def leftovers(lab_id):
    """What of lab ``lab_id`` still exists: namespace names and the pid file (empty: none)."""
    left = [n for n in _namespaces() if _NAME.match(n).group(1) == lab_id]
    return left + ([_pid_file(lab_id)] if os.path.exists(_pid_file(lab_id)) else [])


class _Owned:
    """A lab id owned by this process: pid file first, :func:`remove` at the end, whatever happens.

    In the main thread, SIGTERM and SIGHUP become SystemExit while it is held (their default
    action would kill the process before any ``finally`` ran), and Ctrl-C is held back during
    the teardown itself so that a second Ctrl-C cannot leave half a lab.
    """

    def __init__(self):
        self.id = f"{os.getpid()}-{next(_counter)}"
        self._saved = {}

    def name(self, part):
        return f"{PREFIX}{self.id}-{part}"

    def __enter__(self):
        clean_stale()
        os.makedirs(STATE_DIR, exist_ok=True)
        with open(_pid_file(self.id), "w") as f:
            f.write(f"{os.getpid()} {_start_time(os.getpid())}\n")
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGHUP):
                if signal.getsignal(sig) is signal.SIG_DFL:
                    self._saved[sig] = signal.signal(sig, _exit_on_signal)
        return self

    def __exit__(self, *exc):
        main = threading.current_thread() is threading.main_thread()
        held = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
        try:
            remove(self.id)
        finally:
            if main:
                signal.signal(signal.SIGINT, held)
                for sig, old in self._saved.items():
                    signal.signal(sig, old)
        return False


def _exit_on_signal(signum, frame):
    raise SystemExit(128 + signum)


# --- entering a namespace --------------------------------------------------------------------

def _setns(fd):
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns into a lab host failed: {os.strerror(err)}")


def enter(netns):
    """Move the calling thread into network namespace ``netns`` (a name under /run/netns).

    Sockets opened afterwards live there; a process entered before it opens any socket is,
    for the network, a process on that host.
    """
    fd = os.open(os.path.join(NETNS_DIR, netns), os.O_RDONLY)
    try:
        _setns(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def inside(netns):
    """The calling thread in ``netns`` for the duration, then back where it was."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        enter(netns)
        try:
            yield
        finally:
            _setns(home)
    finally:
        os.close(home)


# --- the lab -----------------------------------------------------------------------------------

class Lab:
    """A lab of hosts, built on ``with`` and gone after it (see the module's docstring).

    Attributes:
        spec (LabSpec): What was asked for.
        id (str): ``<pid>-<n>``; every name of the lab starts with ``collab<id>``.
        netns (list[str]): The namespace of host 0, 1, ..., K-1.
        addresses (list[str]): The IPv4 address of host 0, 1, ..., K-1 (on its ``eth0``).
        switch (str): The switch's namespace.

    Example::

        with Lab(parse_lab("hosts=2,rate=1gbit")) as lab:
            subprocess.run(["ip", "netns", "exec", lab.netns[0], "python", "-c", "..."])
    """

    def __init__(self, spec):
        self.spec = spec
        self._owned = None
        self.id = self.switch = None
        self.netns, self.addresses = [], [f"{SUBNET}.{k + 1}" for k in range(spec.hosts)]

    def __enter__(self):
        check_available()
        self._owned = _Owned().__enter__()
        try:
            self._build()
        except BaseException:
            self._owned.__exit__(*sys.exc_info())
            raise
        return self

    def __exit__(self, *exc):
        return self._owned.__exit__(*exc)

    def _build(self):
        own = self._owned
        self.id, self.switch = own.id, own.name("sw")
        self.netns = [own.name(f"h{k}") for k in range(self.spec.hosts)]
        rate = str(self.spec.rate)
        # tbf's bucket: 2 ms of traffic at the rate, at least 8 full frames; 20 ms of queue.
        burst = str(max(8 * 1514, self.spec.rate // 8 // 500))
        shape = ["root", "tbf", "rate", f"{rate}bit", "burst", burst, "latency", "20ms"]
        for ns in [self.switch] + self.netns:
            _run("ip", "netns", "add", ns)
        _run("ip", "-n", self.switch, "link", "add", BRIDGE, "type", "bridge")
        _run("ip", "-n", self.switch, "link", "set", BRIDGE, "addrgenmode", "none")
        _run("ip", "-n", self.switch, "link", "set", BRIDGE, "up")
        for k, ns in enumerate(self.netns):
            port = f"h{k}"
            _run("ip", "link", "add", IFNAME, "netns", ns, "type", "veth", "peer", "name", port,
                 "netns", self.switch)
            _run("ip", "-n", self.switch, "link", "set", port, "addrgenmode", "none")
            _run("ip", "-n", self.switch, "link", "set", port, "master", BRIDGE)
            _run("ip", "-n", self.switch, "link", "set", port, "up")
            _run("ip", "-n", ns, "link", "set", IFNAME, "addrgenmode", "none")
            _run("ip", "-n", ns, "addr", "add", f"{self.addresses[k]}/24", "dev", IFNAME)
            _run("ip", "-n", ns, "link", "set", IFNAME, "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            for where, dev in ((ns, IFNAME), (self.switch, port)):
                proc = _run("tc", "-n", where, "qdisc", "add", "dev", dev, *shape, check=False)
                if proc.returncode:
                    raise LabUnavailable(_tbf_problem(where) or f"lab: tbf on {dev} failed: "
                                         f"{proc.stderr.strip()}")

    def host_environment(self, host):
        """What every process on host ``host`` needs to use the host's link (gloo, tensorpipe)."""
        return {"GLOO_SOCKET_IFNAME": IFNAME, "TP_SOCKET_IFNAME": IFNAME}
