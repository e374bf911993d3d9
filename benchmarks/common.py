"""What every benchmark shares: sizes and flags, worlds of processes, the timing loop, reports.

Flags mean what they mean in nccl-tests (``-b`` min bytes, ``-e`` max bytes,
``-f`` step factor, ``-i`` step increment, ``-n`` iterations, ``-w`` warmup
iterations, ``-c`` check, ``-o`` reduction op, ``-d`` datatype), and the world
size is ``--world-size`` everywhere, as in ``python -m collectives.train``.
Several world sizes (``--world-size 2,4``) run one after the other, each in
its own processes. ``--lab hosts=K[,ranks-per-host=L][,rate=1gbit]`` runs each
world in a lab of K hosts joined by links of that rate (root only; see
:mod:`collectives.tools.lab`), built for the world and torn down after it. Under ``torchrun`` the world is the one torchrun started
(``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``): every process runs the benchmark
and rank 0 prints and writes.

A benchmark is a *worker*: a module-level function ``worker(args, rank, n,
device)`` that runs on every rank of an initialised process group and returns
rank 0's results. :func:`run_worlds` starts it (through
:func:`collectives.tools.launch.run_job`) at every world size and hands the results
back to the launching process.

Example::

    def worker(args, rank, n, device):
        x = torch.zeros(1024, device=device)
        return time_candidates({"built-in": lambda: dist.all_reduce(x)}, 10, 2, 1, device)

    for n, times in run_worlds(worker, args):     # args from a parser with add_world_flags
        print(n, times)
"""
import argparse
import csv
import datetime
import json
import os
import pickle
import platform
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from collectives import settings
from collectives.tools import lab as lab_tools
from collectives.tools import launch

# nccl-tests' names first, torch's as aliases.
DTYPES = {"int8": torch.int8, "uint8": torch.uint8, "int32": torch.int32, "int64": torch.int64,
          "half": torch.float16, "float16": torch.float16, "float": torch.float32,
          "float32": torch.float32, "double": torch.float64, "float64": torch.float64,
          "bfloat16": torch.bfloat16}
OPS = {"sum": ReduceOp.SUM, "prod": ReduceOp.PRODUCT, "min": ReduceOp.MIN, "max": ReduceOp.MAX,
       "avg": ReduceOp.AVG}
OUT_DIR = "bench_out"


# ---------------------------------------------------------------- sizes

from collectives.tools.sizes import human, parse_size, sizes  # noqa: E402,F401  (the flags' sizes)


# ---------------------------------------------------------------- flags

from benchmarks.flags import positive, whole, whole_list  # noqa: E402,F401  (the flags' types)


def _world_sizes(text):
    try:
        values = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--world-size takes numbers, e.g. 4 or 2,4; got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"--world-size must be 1 or more, got {text!r}")
    return values


def add_world_flags(p, default="2", backend=True):
    """``--world-size`` (and the process options every benchmark takes) on parser ``p``."""
    p.add_argument("--world-size", type=_world_sizes, default=None,
                   help=f"ranks to start; several run in turn, e.g. 2,4 (default {default}); "
                        f"under torchrun the world it started")
    p.set_defaults(_world_default=default)
    p.add_argument("--threads", type=whole(1), default=1,
                   help="torch intra-op threads per rank (torch's default made hand-written rings "
                        "2-9x slower with more ranks than cores)")
    p.add_argument("--timeout", type=positive("seconds", settings.MAX_TIMEOUT), default=300,
                   help="seconds any rank waits for a peer (COLLECTIVES_TIMEOUT and the built-in's)")
    p.add_argument("--lab", type=lab_tools.lab_argument, default=None, metavar="hosts=K,...",
                   help=lab_tools.FLAG_HELP)
    if backend:
        p.add_argument("--backend", default="gloo", choices=("gloo", "nccl"))
        p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    return p


def add_size_flags(p, b="4K", e="16M", f=4, i="1M"):
    """nccl-tests' ``-b -e -f -i`` on parser ``p``; ``e=None``: ``-e`` defaults to ``-b`` (one size)."""
    p.add_argument("-b", "--minbytes", type=parse_size, default=parse_size(b), help=f"smallest size (default {b})")
    p.add_argument("-e", "--maxbytes", type=parse_size, default=None if e is None else parse_size(e),
                   help=f"largest size (default {e or 'the same as -b'})")
    p.add_argument("-f", "--stepfactor", type=whole(1), default=f,
                   help=f"multiply the size by this between points (default {f}); 1: add -i instead")
    p.add_argument("-i", "--stepbytes", type=parse_size, default=parse_size(i),
                   help=f"add this to the size between points when -f is 1 (default {i})")
    return p


def add_timing_flags(p, n=20, w=2):
    """nccl-tests' ``-n`` (iterations) and ``-w`` (warmup iterations) on parser ``p``."""
    p.add_argument("-n", "--iters", type=whole(1), default=n,
                   help=f"timed iterations (samples) per candidate and size (default {n})")
    p.add_argument("-w", "--warmup-iters", type=whole(0), default=w, help=f"untimed iterations first (default {w})")
    return p


def add_data_flags(p, check=True, op=True, dtype="float"):
    """nccl-tests' ``-c`` (check), ``-o`` (op) and ``-d`` (datatype) on parser ``p``."""
    if check:
        p.add_argument("-c", "--check", type=int, default=1, choices=(0, 1),
                       help="check every result against the closed form first (default 1)")
    if op:
        p.add_argument("-o", "--op", default="sum", choices=sorted(OPS), help="reduction op (default sum)")
    if dtype:
        p.add_argument("-d", "--datatype", default=dtype, choices=sorted(DTYPES),
                       help=f"element type, nccl-tests' names or torch's (default {dtype})")
    return p


def world_sizes(args):
    """The world sizes to run: torchrun's when under it, else ``--world-size`` (or its default).

    Raises SystemExit when ``--world-size`` contradicts torchrun's ``WORLD_SIZE``.
    """
    given = getattr(args, "world_size", None)
    if launch.under_torchrun():
        n = int(os.environ["WORLD_SIZE"])
        if given not in (None, [n]):
            raise SystemExit(f"--world-size {','.join(map(str, given))} but torchrun started {n} "
                             f"rank(s) (WORLD_SIZE={n}); leave --world-size out under torchrun")
        return [n]
    return given if given is not None else _world_sizes(getattr(args, "_world_default", "2"))


def finish_parsing(p, args):
    """Resolve ``--world-size`` and check the size flags; ``p.error`` on nonsense."""
    try:
        args.world_size = world_sizes(args)
        if hasattr(args, "minbytes"):
            if args.maxbytes is None:
                args.maxbytes = args.minbytes
            args.sizes = sizes(args.minbytes, args.maxbytes, args.stepfactor, args.stepbytes)
    except ValueError as exc:
        p.error(str(exc))
    if getattr(args, "iters", 1) < 1 or getattr(args, "warmup_iters", 0) < 0:
        p.error("-n must be 1 or more and -w 0 or more")
    if getattr(args, "device", "cpu") == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device here")
    if getattr(args, "lab", None) is not None:
        check_lab(p, args)
    return args


def check_lab(p, args):
    """``p.error`` unless every world of ``args`` fits ``--lab`` and a lab can be built here."""
    if launch.under_torchrun():
        p.error("--lab starts its own processes; under torchrun leave it out, or run "
                "`python -m collectives.tools.lab torchrun --lab ... -- -m ...`")
    for n in args.world_size:
        try:
            args.lab.layout(n)
        except ValueError as exc:
            p.error(str(exc))
    reason = lab_tools.unavailable_reason()
    if reason:
        p.error(f"--lab: {reason}")


# ---------------------------------------------------------------- worlds

def is_rank0():
    """True in the process that prints: rank 0 of a world, or the launcher outside one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank() == 0
    return int(os.environ.get("RANK", "0")) == 0


def in_world(worker, args):
    """Run ``worker(args, rank, n, device)`` in a process group built from the environment.

    The group uses ``args.backend`` (default gloo) with ``args.threads`` intra-op
    threads; with ``--device cuda`` rank r uses GPU ``LOCAL_RANK mod count``.
    Returns what the worker returns; the group is destroyed after.
    """
    rank, local_rank, n, _ = launch.place()
    torch.set_num_threads(getattr(args, "threads", 1))
    timeout = getattr(args, "timeout", 300)
    os.environ.setdefault("COLLECTIVES_TIMEOUT", str(timeout))
    device = torch.device("cpu")
    if getattr(args, "device", "cpu") == "cuda":
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group(getattr(args, "backend", "gloo"), init_method="env://", rank=rank,
                            world_size=n, timeout=datetime.timedelta(seconds=timeout))
    try:
        return worker(args, rank, n, device)
    finally:
        dist.destroy_process_group()


def _entry(worker, args, result_path):
    result = in_world(worker, args)
    if int(os.environ["RANK"]) == 0:
        with open(result_path, "wb") as f:
            pickle.dump(result, f)


def run_worlds(worker, args):
    """Run ``worker`` at every world size of ``args``; return [(n, rank 0's result)].

    Outside torchrun each world is a fresh set of processes started by
    :func:`collectives.tools.launch.run_job`; a failing rank's traceback is printed and
    this raises SystemExit(1). Under torchrun the worker runs in this process,
    in torchrun's world, and only rank 0 gets the list (the others get None).
    """
    if launch.under_torchrun():
        result = in_world(worker, args)
        return [(int(os.environ["WORLD_SIZE"]), result)] if int(os.environ["RANK"]) == 0 else None
    out = []
    with tempfile.TemporaryDirectory(prefix="collectives-bench-") as tmp:
        for n in args.world_size:
            path = os.path.join(tmp, f"world{n}.pkl")
            if launch.run_job(_entry, n, (worker, args, path), lab=getattr(args, "lab", None)) != 0:
                raise SystemExit(1)
            with open(path, "rb") as f:
                out.append((n, pickle.load(f)))
    return out


# ---------------------------------------------------------------- timing

def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def slowest_rank(samples, device):
    """Element-wise maximum over ranks of a table of seconds (lists of lists): every rank gets it."""
    mine = torch.tensor(samples, dtype=torch.float64)
    if "nccl" in str(dist.get_backend()):
        mine = mine.to(device)
    dist.all_reduce(mine, op=ReduceOp.MAX)
    return mine.cpu().tolist()


def batch_for(size, fixed=0):
    """Calls per sample: ``fixed`` if set, else up to 32 for small messages so timer and barrier
    noise amortise (256 KiB worth of calls)."""
    if fixed:
        return fixed
    return int(min(32, max(1, (256 << 10) // max(size, 1))))


def time_candidates(cands, iters, warmup, batch, device):
    """Time each of ``cands`` ({name: fn}); return {name: median over samples of the slowest rank}.

    Candidates are *interleaved*: sample i of every candidate runs before sample
    i+1 of any, in a rotating order, so that load from elsewhere on the machine
    hits them alike (ratios are far steadier than absolute times on a shared
    machine). Each sample is a barrier, then ``batch`` calls back to back; its
    time per call is the slowest rank's. Collective: every rank must call it.
    """
    return time_candidates_with_cpu(cands, iters, warmup, batch, device)[0]


def time_candidates_with_cpu(cands, iters, warmup, batch, device):
    """:func:`time_candidates`, plus the calling thread's CPU seconds per call, the same way.

    Returns ({name: seconds}, {name: CPU seconds}). The CPU clock is read outside
    the wall-clock window, so the wall times are those :func:`time_candidates` gives.
    """
    wall, cpu = time_samples(cands, iters, warmup, batch, device)
    return medians(wall), medians(cpu)


def medians(samples):
    """{name: [samples]} -> {name: their median}."""
    return {name: statistics.median(row) for name, row in samples.items()}


def paired_ratio(a, b):
    """Median over samples of ``a[i] / b[i]``: samples of one round ran side by side, so
    load that slows a round slows both, and the ratio of a round is steadier than the
    ratio of two medians."""
    return statistics.median(x / y for x, y in zip(a, b))


def time_samples(cands, iters, warmup, batch, device, cpu_clock=time.thread_time):
    """The samples behind :func:`time_candidates_with_cpu`: ({name: [seconds per call of
    round i]}, {name: [CPU seconds per call]}), the slowest rank's, in round order.

    ``cpu_clock``: the calling thread's CPU (default), or ``time.process_time`` for
    every thread of the process (the built-in's work runs on gloo's threads)."""
    names = list(cands)
    wall = [[] for _ in names]
    cpu = [[] for _ in names]
    for it in range(warmup + iters):
        k = it % len(names)
        for idx in list(range(k, len(names))) + list(range(k)):
            fn = cands[names[idx]]
            _sync(device)
            dist.barrier()
            c0 = cpu_clock()
            t0 = time.perf_counter()
            for _ in range(batch):
                fn()
            _sync(device)
            dt = (time.perf_counter() - t0) / batch
            dc = (cpu_clock() - c0) / batch
            if it >= warmup:
                wall[idx].append(dt)
                cpu[idx].append(dc)
    wall, cpu = slowest_rank(wall, device), slowest_rank(cpu, device)
    return dict(zip(names, wall)), dict(zip(names, cpu))


# ---------------------------------------------------------------- progress

class Progress:
    """Progress of a long run on rank 0: a tqdm bar on a terminal, else a line per point on stderr.

    Other ranks stay silent. Use ``step(label)`` before each point and ``close()`` at the end.
    """

    def __init__(self, total, desc):
        self.total, self.done, self.desc, self.bar = total, 0, desc, None
        self.enabled = is_rank0()
        if self.enabled and sys.stderr.isatty():
            from tqdm import tqdm
            self.bar = tqdm(total=total, desc=desc, file=sys.stderr, leave=False)

    def step(self, label):
        if not self.enabled:
            return
        if self.bar is not None:
            if self.done:
                self.bar.update(1)
            self.bar.set_postfix_str(label)
        else:
            print(f"# [{self.done + 1}/{self.total}] {self.desc}: {label}", file=sys.stderr, flush=True)
        self.done += 1

    def close(self):
        if self.bar is not None:
            self.bar.update(1)
            self.bar.close()


# ---------------------------------------------------------------- other work on the machine

def machine_cpu_seconds():
    """CPU seconds every process on this machine has used since boot, all cores together
    (``/proc/stat``: user, nice, system, irq, softirq; not idle, iowait or a hypervisor's
    steal), or None where there is no ``/proc/stat``."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()[1:]
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in fields[:7])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


class OtherWork:
    """The share of the machine's CPU that *other* processes used while a measurement ran.

    Timings taken beside other work say what wins beside that work: fewer wake-ups win when
    the cores are taken, and the quiet machine may rank the algorithms the other way. The
    rounds' own noise does not reveal it (the load slows every candidate alike, round after
    round), so the tune measures it: the machine's busy CPU over the measurement, less what
    the measuring processes used themselves, over all of its cores' time.

    ``stop(own_seconds)``: the CPU the measuring processes used (the tune sums its ranks');
    default: this process's. Sets and returns ``share`` (0 to 1), or None without ``/proc/stat``.
    """

    def __init__(self):
        self.machine = machine_cpu_seconds()
        self.own = time.process_time()
        self.wall = time.monotonic()
        self.share = None

    def own_seconds(self):
        """CPU this process has used since the start (every thread of it)."""
        return time.process_time() - self.own

    def stop(self, own_seconds=None):
        machine = machine_cpu_seconds()
        if machine is None or self.machine is None:
            return None
        own = self.own_seconds() if own_seconds is None else own_seconds
        cores_time = (time.monotonic() - self.wall) * (os.cpu_count() or 1)
        self.share = min(max((machine - self.machine - own) / cores_time, 0.0), 1.0) if cores_time > 0 else 0.0
        return self.share


# ---------------------------------------------------------------- reports

def machine_info(prog, args=None):
    """Where and how a run was made: date, command, host, cores, load, torch, backend."""
    load = " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else None
    device = getattr(args, "device", "cpu")
    return {"date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "command": " ".join([prog] + sys.argv[1:]),
            "host": platform.node(), "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(), "loadavg": load, "torch": torch.__version__,
            "python": platform.python_version(), "backend": getattr(args, "backend", "gloo"),
            "device": device, "threads_per_rank": getattr(args, "threads", 1),
            "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None,
            "lab": str(args.lab) if getattr(args, "lab", None) else None}


def run_and_write(prog, worker, args, name="results"):
    """A benchmark's ending: run ``worker`` at every world size, then write every rank 0 row
    with where and how it was measured. Returns the rows (None on ranks other than 0 under
    torchrun)."""
    meta = machine_info(prog, args)
    results = run_worlds(worker, args)
    if results is None:
        return None
    rows = [r for _, res in results for r in res]
    write_rows(args.out, name, rows, meta)
    return rows


def check_algorithms(parser, collective, names, extra=()):
    """Stop with the parser's usage error on an algorithm name ``collective`` does not have."""
    from collectives import ALGORITHMS
    valid = set(ALGORITHMS[collective]) | set(extra)
    unknown = [a for a in names if a not in valid]
    if unknown:
        parser.error(f"unknown {collective} algorithm(s) {', '.join(unknown)}; "
                     f"valid: {', '.join(sorted(valid))}")


def write_rows(out_dir, name, rows, meta=None):
    """Write ``rows`` (dicts) to ``out_dir/name.csv`` and ``out_dir/name.json`` (with ``meta``).

    Returns the two paths.
    """
    os.makedirs(out_dir, exist_ok=True)
    csv_path, json_path = os.path.join(out_dir, f"{name}.csv"), os.path.join(out_dir, f"{name}.json")
    with open(csv_path, "w", newline="") as f:
        fields = list(dict.fromkeys(k for row in rows for k in row))
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    with open(json_path, "w") as f:
        json.dump({"meta": meta or {}, "rows": rows}, f, indent=1)
    return csv_path, json_path


def fmt(x, spec):
    """``format(x, spec)``, or '-' for None."""
    return "-" if x is None else format(x, spec)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's defaults formatter, but each default said once and no reST markup: an option
    whose help already states its default ("(default 4K)", in the units a user types) is left as
    written, a flag's False and an unset None are not shown, and ``backticks`` are dropped."""

    def _get_help_string(self, action):
        text = (action.help or "").replace("``", "").replace("`", "")
        if "default" in text or action.default in (None, False, argparse.SUPPRESS) or not action.option_strings:
            return text
        return text + " (default: %(default)s)"
