"""Benchmark every algorithm against the built-in, nccl-tests style.

Usage::

    python -m collectives.bench                               # a few minutes: 4 collectives, 2 and 4 ranks
    python -m collectives.bench -b 16M -e 64M -f 4 -c all_reduce -n 2,4 --iters 20
    python -m collectives.bench -c all_reduce -a ring,builtin -b 4K -e 4K -n 2,4,8
    python -m collectives.bench --debug -c all_reduce -b 4K -e 1M     # COLLECTIVES_DEBUG=1 overhead
    python -m collectives.bench --write-table collectives/tuning_table.json   # what algorithm=None uses

For every (collective, algorithm, size) it prints one row: ``size`` and
``count`` as nccl-tests counts them (all_gather, gather: the whole output;
reduce_scatter, scatter, all_to_all: the whole input), ``time`` (each sample
is the slowest rank's time; the row shows the median over samples), ``algbw``
= size / time, ``busbw`` = algbw times nccl-tests' factor (all_reduce
2(N-1)/N; all_gather, reduce_scatter, all_to_all, gather, scatter (N-1)/N;
broadcast, reduce 1) and ``vs_builtin``, our time over the built-in's time.
The candidates of one size are *interleaved* (sample i of every candidate
runs before sample i+1 of any, in a rotating order) so all of them see the
same noise; ratios are much steadier than absolute times on a shared machine.
``default`` is ``algorithm=None``; its row also reports ``default/best``, its
time over the fastest algorithm's at that point.

Before timing, every candidate runs once on rank-encoded inputs and its result
is compared with the closed form (and the built-in's result with the same).
It also measures point-to-point ping-pong (one-way latency and bandwidth,
ranks 0 and 1) and a ring exchange (every rank sends right and receives left
at once: the bandwidth a ring can use), fits the alpha-beta-gamma cost model
(``collectives.cost_model``) and predicts every row.

``--out DIR`` (default ``bench_out``) gets results.csv, results.json, p2p.csv,
model.json, report.md (the tables docs/benchmarks.md embeds) and the plots.
Every worker process runs with ``--threads`` intra-op threads (default 1):
torch's default thread count made hand-written rings 2-9x slower on 2 cores.
"""
import argparse
import functools
import json
import os
import platform
import statistics
import sys
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed import ReduceOp

from . import cost_model
from .algorithms import ALGORITHMS
from .launch import free_port

COLLECTIVES = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter",
               "all_to_all", "gather", "scatter")
DEFAULT_COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "reduce_scatter")
OPS = {"sum": ReduceOp.SUM, "prod": ReduceOp.PRODUCT, "min": ReduceOp.MIN, "max": ReduceOp.MAX,
       "avg": ReduceOp.AVG}
REDUCING = ("all_reduce", "reduce", "reduce_scatter")


def busbw_factor(collective, n):
    """nccl-tests' bus-bandwidth factor: busbw = algbw * factor."""
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    if collective in ("broadcast", "reduce"):
        return 1.0
    return (n - 1) / n


def parse_size(text):
    """'4K' -> 4096, '64M' -> 67108864, '1G', or plain bytes."""
    text = str(text).strip().upper().rstrip("B")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def human(nbytes):
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return f"{nbytes}"


def sizes_from(args):
    sizes, s = [], parse_size(args.minbytes)
    end = parse_size(args.maxbytes)
    while s <= end:
        sizes.append(s)
        s = s * args.stepfactor if args.stepfactor > 1 else s + parse_size(args.stepbytes)
    return sizes


# ---------------------------------------------------------------- one collective, one size

def _value(rank, j, numel, dtype, op):
    """Rank r's input piece j: small integers, so every reduction is exact in every dtype."""
    i = torch.arange(numel, dtype=torch.int64)
    if op == ReduceOp.PRODUCT:
        v = 1 + (i + rank + j) % 2
    else:
        v = 1 + (i + 3 * j) % 5 + rank % 3
    return v.to(dtype)


def _reduce_closed_form(pieces, op, n):
    fn = {ReduceOp.SUM: torch.add, ReduceOp.AVG: torch.add, ReduceOp.PRODUCT: torch.mul,
          ReduceOp.MIN: torch.minimum, ReduceOp.MAX: torch.maximum}[op]
    out = functools.reduce(fn, pieces)
    return out / n if op == ReduceOp.AVG else out


class Case:
    """Buffers and calls for one (collective, size) on this rank.

    ``size`` is nccl-tests' size; for the list collectives each rank's piece is
    size / N bytes (rounded down to whole elements).
    """

    def __init__(self, collective, size, dtype, op, device, rank, n):
        self.collective, self.dtype, self.op, self.device = collective, dtype, op, device
        self.rank, self.n = rank, n
        es = torch.empty((), dtype=dtype).element_size()
        listy = collective not in ("all_reduce", "broadcast", "reduce")
        self.piece = max(size // es // n, 1) if listy else max(size // es, 1)
        self.count = self.piece * n if listy else self.piece
        self.size = self.count * es
        # Timing inputs stay fixed under repeated reduction (0+0, 1*1): no inf, no denormals.
        self.fill = 1 if op == ReduceOp.PRODUCT else 0

    def _buf(self, value=None, j=0, rank=None):
        if value is None:
            return torch.full((self.piece,), self.fill, dtype=self.dtype, device=self.device)
        return _value(self.rank if rank is None else rank, j, self.piece, self.dtype,
                      self.op).to(self.device)

    def buffers(self, encoded):
        """Fresh buffers: rank-encoded (``encoded``) for the check, constant for timing."""
        n, c = self.n, self.collective
        v = (lambda j=0: self._buf(True, j)) if encoded else (lambda j=0: self._buf())
        if c in ("all_reduce", "broadcast", "reduce"):
            return {"t": v()}
        if c == "all_gather":
            return {"t": v(), "outs": [self._buf() for _ in range(n)]}
        if c == "reduce_scatter":
            return {"out": self._buf(), "ins": [v(j) for j in range(n)]}
        if c == "all_to_all":
            return {"outs": [self._buf() for _ in range(n)], "ins": [v(j) for j in range(n)]}
        if c == "gather":
            return {"t": v(), "outs": [self._buf() for _ in range(n)] if self.rank == 0 else None}
        return {"out": self._buf(), "ins": [v(j) for j in range(n)] if self.rank == 0 else None}

    def call(self, lib, b, **kw):
        """Run the collective once with ``lib`` (torch.distributed or collectives)."""
        c, op = self.collective, self.op
        if c == "all_reduce":
            return lib.all_reduce(b["t"], op=op, **kw)
        if c == "broadcast":
            return lib.broadcast(b["t"], src=0, **kw)
        if c == "reduce":
            return lib.reduce(b["t"], dst=0, op=op, **kw)
        if c == "all_gather":
            return lib.all_gather(b["outs"], b["t"], **kw)
        if c == "reduce_scatter":
            return lib.reduce_scatter(b["out"], b["ins"], op=op, **kw)
        if c == "all_to_all":
            return lib.all_to_all(b["outs"], b["ins"], **kw)
        if c == "gather":
            return lib.gather(b["t"], b["outs"], dst=0, **kw)
        return lib.scatter(b["out"], b["ins"], src=0, **kw)

    def expected(self):
        """(name of the result buffer, expected value(s)) on this rank, or None if unchecked."""
        n, r, c = self.n, self.rank, self.collective
        val = functools.partial(_value, numel=self.piece, dtype=self.dtype, op=self.op)
        if c == "all_reduce":
            return "t", _reduce_closed_form([val(q, 0) for q in range(n)], self.op, n)
        if c == "reduce":
            return ("t", _reduce_closed_form([val(q, 0) for q in range(n)], self.op, n)) if r == 0 else None
        if c == "broadcast":
            return "t", val(0, 0)
        if c == "all_gather":
            return "outs", [val(q, 0) for q in range(n)]
        if c == "reduce_scatter":
            return "out", _reduce_closed_form([val(q, r) for q in range(n)], self.op, n)
        if c == "all_to_all":
            return "outs", [val(q, r) for q in range(n)]
        if c == "gather":
            return ("outs", [val(q, 0) for q in range(n)]) if r == 0 else None
        return "out", val(0, r)

    def check(self, lib, **kw):
        """Run once on encoded inputs; return None if right, else a description of the error."""
        b = self.buffers(encoded=True)
        self.call(lib, b, **kw)
        want = self.expected()
        if want is None:
            return None
        got, want = b[want[0]], want[1]
        got, want = (got, want) if isinstance(got, list) else ([got], [want])
        tol = 1e-2 if self.dtype in (torch.float16, torch.bfloat16) else 1e-5
        for g, w in zip(got, want):
            g = g.cpu()
            ok = torch.allclose(g, w, rtol=tol, atol=tol) if g.is_floating_point() else torch.equal(g, w)
            if not ok:
                bad = (g != w).nonzero()[:3].flatten().tolist()
                return f"differs from the closed form at elements {bad}"
        return None


# ---------------------------------------------------------------- timing

def _gather_max(samples, device):
    """Per-sample maximum over ranks of a [candidates, samples] table of seconds."""
    mine = torch.tensor(samples, dtype=torch.float64)
    backend_device = "cuda" if "nccl" in str(dist.get_backend()) else "cpu"
    mine = mine.to(backend_device)
    out = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(out, mine)
    return torch.stack(out).amax(0).cpu().tolist()


def _batch(size, fixed):
    """Calls per sample: several for small messages, so timer and barrier noise amortise."""
    if fixed:
        return fixed
    return int(min(32, max(1, (256 << 10) // max(size, 1))))


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_candidates(cands, iters, warmup, batch, device):
    """Interleave ``cands`` {name: fn}; return {name: median over samples of max over ranks}."""
    return time_candidates_with_cpu(cands, iters, warmup, batch, device)[0]


def time_candidates_with_cpu(cands, iters, warmup, batch, device):
    """:func:`time_candidates`, plus the calling thread's CPU time per call the same way.

    Returns ({name: seconds}, {name: CPU seconds}). The CPU clock is read outside
    the wall-clock window, so the wall times are those ``time_candidates`` reports.
    """
    names = list(cands)
    samples = [[] for _ in names]
    cpu = [[] for _ in names]
    for it in range(warmup + iters):
        k = it % len(names)
        for idx in list(range(k, len(names))) + list(range(k)):
            fn = cands[names[idx]]
            _sync(device)
            dist.barrier()
            c0 = time.thread_time()
            t0 = time.perf_counter()
            for _ in range(batch):
                fn()
            _sync(device)
            dt = (time.perf_counter() - t0) / batch
            dc = (time.thread_time() - c0) / batch
            if it >= warmup:
                samples[idx].append(dt)
                cpu[idx].append(dc)
    wall_table, cpu_table = _gather_max(samples, device), _gather_max(cpu, device)
    return ({name: statistics.median(row) for name, row in zip(names, wall_table)},
            {name: statistics.median(row) for name, row in zip(names, cpu_table)})


def candidates_for(collective, algorithms, builtin_ok, debug):
    """[(label, algorithm or None, library, debug)] to run for one collective."""
    import collectives
    ours = list(ALGORITHMS[collective]) if algorithms in (None, ["all"]) else \
        [a for a in algorithms if a in ALGORITHMS[collective]]
    want_builtin = algorithms in (None, ["all"]) or "builtin" in algorithms
    want_default = algorithms in (None, ["all"]) or "default" in algorithms
    out = [("builtin", None, dist, False)] if (builtin_ok and want_builtin) else []
    out += [(a, a, collectives, False) for a in ours]
    if want_default:
        out.append(("default", None, collectives, False))
    if debug:
        out += [(f"{label}+debug", a, lib, True) for label, a, lib, _ in out if lib is collectives]
    return out


def _run_case(case, label, algorithm, lib, debug, b):
    import collectives
    kw = {} if lib is dist else {"algorithm": algorithm}

    def fn():
        if lib is collectives:
            os.environ["COLLECTIVES_DEBUG"] = "1" if debug else "0"
        case.call(lib, b, **kw)
    return fn


def bench_collective(args, collective, size, rank, n, device):
    """Rows for one (collective, size) on this world; identical on every rank."""
    import collectives
    from . import tuning
    dtype, op = getattr(torch, args.dtype), OPS[args.op]
    case = Case(collective, size, dtype, op, device, rank, n)
    builtin_ok = not args.no_builtin
    errors = {}
    if builtin_ok:
        try:
            errors["builtin"] = case.check(dist)
        except (RuntimeError, ValueError) as exc:
            builtin_ok = False
            errors["builtin"] = f"unavailable: {str(exc).splitlines()[0][:60]}"
    cands = candidates_for(collective, args.algorithms, builtin_ok, args.debug)
    for label, algo, lib, debug in cands:
        if lib is collectives and not args.no_check and label not in errors:
            os.environ["COLLECTIVES_DEBUG"] = "1" if debug else "0"
            errors[label] = case.check(lib, algorithm=algo)
    os.environ["COLLECTIVES_DEBUG"] = "0"
    bad = {k: v for k, v in errors.items() if v and not v.startswith("unavailable")}
    if bad:
        raise AssertionError(f"{collective} size {size} on {n} ranks: wrong results: {bad}")
    fns = {}
    for label, algo, lib, debug in cands:
        fns[label] = _run_case(case, label, algo, lib, debug, case.buffers(encoded=False))
    times = time_candidates(fns, args.iters, args.warmup, _batch(case.size, args.batch), device)
    chosen = tuning.choose(collective, case.size, n)
    base = times.get("builtin")
    plain = {k: v for k, v in times.items() if k not in ("builtin", "default") and "+debug" not in k}
    best = min(list(plain.values()) + ([times["default"]] if "default" in times else []), default=None)
    rows = []
    for label, t in times.items():
        algo = chosen if label == "default" else label.replace("+debug", "")
        algbw = case.size / t / 1e9
        row = {"collective": collective, "world_size": n, "algorithm": label, "size": case.size,
               "count": case.count, "dtype": args.dtype, "op": args.op, "time_us": t * 1e6,
               "algbw_GBps": algbw, "busbw_GBps": algbw * busbw_factor(collective, n),
               "vs_builtin": (t / base) if base else None,
               "default_over_best": (t / best) if (label == "default" and best) else None,
               "debug_overhead": (t / times[label.replace("+debug", "")]) if "+debug" in label else None,
               "chosen": chosen if label == "default" else None,
               "check": "skipped" if args.no_check and label != "builtin" else
                        (errors.get(label) or "ok"),
               "algorithm_run": algo}
        rows.append(row)
    return rows


# ---------------------------------------------------------------- point to point and compute

def bench_p2p(args, rank, n, device, sizes):
    """Ping-pong between ranks 0 and 1 and a ring exchange on all ranks, through the door."""
    from .p2p_communications import Comm
    comm = Comm(dist.group.WORLD, "bench", "p2p")
    rows = []
    right, left = (rank + 1) % n, (rank - 1) % n
    # What the algorithms' messages live in: the tensor's device where the backend sends it
    # (NCCL), host memory where it does not (gloo stages CUDA tensors to the host once per call).
    wire = device if comm.nccl else torch.device("cpu")
    for size in sizes:
        a = torch.zeros(max(size // 4, 1), device=wire)
        b = torch.zeros_like(a)
        batch = _batch(size, args.batch)

        def pingpong():
            if rank == 0:
                comm.send(a, 1, 0)
                comm.recv(b, 1, 1)
            elif rank == 1:
                comm.recv(b, 0, 0)
                comm.send(a, 0, 1)

        def ring():
            comm.sendrecv(a, right, b, left, 2)

        def reduce_local():
            b.add_(a)
        t = time_candidates({"pingpong": pingpong, "ring_exchange": ring, "reduce": reduce_local},
                            args.iters, args.warmup, batch, wire)
        nbytes = a.numel() * 4
        rows.append({"world_size": n, "size": nbytes, "pingpong_oneway_us": t["pingpong"] / 2 * 1e6,
                     "pingpong_GBps": nbytes / (t["pingpong"] / 2) / 1e9,
                     "ring_exchange_us": t["ring_exchange"] * 1e6,
                     "ring_exchange_GBps": nbytes / t["ring_exchange"] / 1e9,
                     "reduce_us": t["reduce"] * 1e6, "reduce_GBps": nbytes / t["reduce"] / 1e9})
    return rows


# ---------------------------------------------------------------- worlds

def _print_row(row, out=sys.stdout):
    vs = f"{row['vs_builtin']:.2f}" if row["vs_builtin"] else "-"
    extra = ""
    if row["default_over_best"]:
        extra = f"  {row['chosen']}, {row['default_over_best']:.2f}x best"
    if row["debug_overhead"]:
        extra = f"  debug on/off {row['debug_overhead']:.2f}x"
    print(f"{row['collective']:>14} {row['world_size']:>3} {row['algorithm']:>24} {row['size']:>11} "
          f"{row['count']:>10} {row['time_us']:>11.1f} {row['algbw_GBps']:>7.3f} "
          f"{row['busbw_GBps']:>7.3f} {vs:>6} {row['check']:>5}{extra}", file=out, flush=True)


HEADER = (f"{'collective':>14} {'N':>3} {'algorithm':>24} {'size(B)':>11} {'count':>10} "
          f"{'time(us)':>11} {'algbw':>7} {'busbw':>7} {'vs_bi':>6} {'check':>5}")


def _worker(rank, n, port, args, results):
    torch.set_num_threads(args.threads)
    os.environ.setdefault("COLLECTIVES_TIMEOUT", "120")
    try:
        if args.device == "cuda":
            torch.cuda.set_device(rank % torch.cuda.device_count())
            device = torch.device("cuda", torch.cuda.current_device())
        else:
            device = torch.device("cpu")
        dist.init_process_group(args.backend, init_method=f"tcp://127.0.0.1:{port}",
                                rank=rank, world_size=n)
        sizes = sizes_from(args)
        out = {"rows": [], "p2p": []}
        if args.p2p and n >= 2:
            out["p2p"] = bench_p2p(args, rank, n, device, sorted(set([4, 64, 1024] + sizes)))
            if rank == 0:
                for r in out["p2p"]:
                    print(f"p2p N={n} {r['size']:>11} B: ping-pong {r['pingpong_oneway_us']:9.1f} us one way "
                          f"({r['pingpong_GBps']:.3f} GB/s), ring exchange {r['ring_exchange_GBps']:.3f} GB/s, "
                          f"local reduce {r['reduce_GBps']:.3f} GB/s", flush=True)
        if rank == 0:
            print(HEADER, flush=True)
        for collective in args.collectives:
            for size in sizes:
                rows = bench_collective(args, collective, size, rank, n, device)
                if rank == 0:
                    for row in rows:
                        _print_row(row)
                out["rows"] += rows
        if rank == 0:
            results.put(("ok", out))
    except BaseException:
        results.put(("error", f"rank {rank}:\n{traceback.format_exc()}"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_world(args, n):
    """Spawn ``n`` ranks, run the sweep, return rank 0's results (hard timeout: --timeout)."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, n, port, args, results), daemon=True) for r in range(n)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + args.timeout
    try:
        while True:
            try:
                status, value = results.get(timeout=1.0)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"world of {n} ranks did not finish in {args.timeout} s")
                if all(p.exitcode is not None for p in procs):
                    raise RuntimeError(f"world of {n} ranks died: exit codes {[p.exitcode for p in procs]}")
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    if status != "ok":
        raise RuntimeError(value)
    return value


# ---------------------------------------------------------------- outputs

def write_outputs(args, rows, p2p, model, out_dir):
    import csv
    os.makedirs(out_dir, exist_ok=True)
    meta = machine_info(args)
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows, "p2p": p2p, "model": model}, f, indent=1)
    for name, data in (("results.csv", rows), ("p2p.csv", p2p)):
        if data:
            with open(os.path.join(out_dir, name), "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for row in data for k in row)))
                w.writeheader()
                w.writerows(data)
    with open(os.path.join(out_dir, "model.json"), "w") as f:
        json.dump(model, f, indent=1)
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write(report_markdown(meta, rows, p2p, model))
    if not args.no_plots:
        plot(rows, p2p, out_dir)


def machine_info(args):
    return {"date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "command": "python -m collectives.bench " + " ".join(sys.argv[1:]),
            "host": platform.node(), "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(), "loadavg_at_start": getattr(args, "loadavg", None),
            "torch": torch.__version__, "python": platform.python_version(),
            "backend": args.backend, "device": args.device, "threads_per_rank": args.threads,
            "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None}


def _fmt(x, spec):
    return "-" if x is None else format(x, spec)


def report_markdown(meta, rows, p2p, model):
    lines = [f"Measured {meta['date_utc']} on {meta['host']} ({meta['cores']} cores, {meta['cpu']}), "
             f"load average at start {meta['loadavg_at_start']}, torch {meta['torch']}, "
             f"{meta['backend']}/{meta['device']}{' (' + meta['gpu'] + ')' if meta.get('gpu') else ''}, "
             f"{meta['threads_per_rank']} thread(s) per rank.", "",
             f"Command: `{meta['command']}`", ""]
    if p2p:
        lines += ["Point to point (through the door; ping-pong between ranks 0 and 1, ring exchange on all ranks):", "",
                  "| N | size | ping-pong one way (us) | ping-pong GB/s | ring exchange GB/s | local reduce GB/s |",
                  "|---|---:|---:|---:|---:|---:|"]
        lines += [f"| {r['world_size']} | {human(r['size'])} | {r['pingpong_oneway_us']:.1f} | "
                  f"{r['pingpong_GBps']:.3f} | {r['ring_exchange_GBps']:.3f} | {r['reduce_GBps']:.3f} |"
                  for r in p2p]
        lines.append("")
    if model:
        lines += ["Cost model fitted here (per world size): " + "; ".join(
            f"N={k}: alpha {v['alpha'] * 1e6:.1f} us, beta {1e-9 / v['beta']:.2f} GB/s "
            f"(ring {1e-9 / v['beta_ring']:.2f} GB/s), gamma {1e-9 / v['gamma']:.2f} GB/s"
            for k, v in model.items()), ""]
    lines += ["| collective | N | algorithm | size | time (us) | busbw (GB/s) | vs built-in | "
              "of p2p ceiling | predicted (us) | predicted, ring-exchange alpha/beta (us) | default/best | check |",
              "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        algo = f"default ({r['chosen']})" if r["algorithm"] == "default" else r["algorithm"]
        lines.append(f"| {r['collective']} | {r['world_size']} | {algo} | {human(r['size'])} | "
                     f"{r['time_us']:.1f} | {r['busbw_GBps']:.3f} | {_fmt(r['vs_builtin'], '.2f')} | "
                     f"{_fmt(r.get('of_p2p_ceiling'), '.2f')} | {_fmt(r.get('predicted_us'), '.1f')} | "
                     f"{_fmt(r.get('predicted_loaded_us'), '.1f')} | {_fmt(r['default_over_best'], '.2f')} | "
                     f"{r['check']} |")
    debug_rows = [r for r in rows if r["debug_overhead"]]
    if debug_rows:
        lines += ["", "COLLECTIVES_DEBUG=1 overhead (time with the desync check over time without):", "",
                  "| collective | N | algorithm | size | on/off |", "|---|---|---|---:|---:|"]
        lines += [f"| {r['collective']} | {r['world_size']} | {r['algorithm']} | {human(r['size'])} | "
                  f"{r['debug_overhead']:.2f} |" for r in debug_rows]
    return "\n".join(lines) + "\n"


def plot(rows, p2p, out_dir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    groups = sorted({(r["collective"], r["world_size"]) for r in rows})
    for collective, n in groups:
        sel = [r for r in rows if r["collective"] == collective and r["world_size"] == n]
        fig, (ax_bw, ax_t) = plt.subplots(1, 2, figsize=(12, 4.5))
        for label in dict.fromkeys(r["algorithm"] for r in sel):
            pts = sorted((r["size"], r["busbw_GBps"], r["time_us"]) for r in sel if r["algorithm"] == label)
            style = {"color": "black", "linewidth": 2.5} if label == "builtin" else {}
            ax_bw.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label, **style)
            ax_t.plot([p[0] for p in pts], [p[2] for p in pts], marker="o", label=label, **style)
        if p2p and collective in ("all_reduce", "all_gather", "reduce_scatter"):
            ring = sorted((r["size"], r["ring_exchange_GBps"]) for r in p2p if r["world_size"] == n)
            ax_bw.plot([p[0] for p in ring], [p[1] for p in ring], "k--", label="ring exchange (p2p ceiling)")
        ax_bw.set(xscale="log", xlabel="size (bytes)", ylabel="busbw (GB/s)", title=f"{collective}, N={n}")
        ax_t.set(xscale="log", yscale="log", xlabel="size (bytes)", ylabel="time (us)",
                 title=f"{collective}, N={n}")
        ax_bw.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, f"{collective}_n{n}.png"), dpi=90)
        plt.close(fig)
    pred = [r for r in rows if r.get("predicted_us")]
    if pred:
        fig, ax = plt.subplots(figsize=(6, 6))
        for collective in dict.fromkeys(r["collective"] for r in pred):
            sel = [r for r in pred if r["collective"] == collective]
            ax.scatter([r["predicted_us"] for r in sel], [r["time_us"] for r in sel], s=12, label=collective)
        lo = min(min(r["predicted_us"], r["time_us"]) for r in pred)
        hi = max(max(r["predicted_us"], r["time_us"]) for r in pred)
        ax.plot([lo, hi], [lo, hi], "k--", linewidth=1)
        ax.set(xscale="log", yscale="log", xlabel="predicted (us)", ylabel="measured (us)",
               title="alpha-beta-gamma model vs measurement")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "model_vs_measured.png"), dpi=90)
        plt.close(fig)


# ---------------------------------------------------------------- main

def build_parser():
    p = argparse.ArgumentParser(prog="python -m collectives.bench", description=__doc__.split("\n")[0])
    p.add_argument("-b", "--minbytes", default="4K", help="smallest size (nccl-tests -b), e.g. 4K")
    p.add_argument("-e", "--maxbytes", default="16M", help="largest size (nccl-tests -e), e.g. 64M")
    p.add_argument("-f", "--stepfactor", type=int, default=4, help="multiply the size by this (nccl-tests -f)")
    p.add_argument("-i", "--stepbytes", default="1M", help="add this to the size when -f is 1")
    p.add_argument("-c", "--collectives", default=",".join(DEFAULT_COLLECTIVES),
                   help=f"comma-separated, or 'all': {','.join(COLLECTIVES)}")
    p.add_argument("-a", "--algorithms", default="all",
                   help="comma-separated algorithm names, plus 'builtin' and 'default'; 'all' for every one")
    p.add_argument("-n", "--world-sizes", default="2,4", help="comma-separated world sizes")
    p.add_argument("-d", "--dtype", default="float32")
    p.add_argument("-o", "--op", default="sum", choices=sorted(OPS))
    p.add_argument("--iters", type=int, default=10, help="timed samples per candidate and size")
    p.add_argument("-w", "--warmup", type=int, default=2, help="untimed samples first")
    p.add_argument("--batch", type=int, default=0, help="calls per sample (0: more for small sizes)")
    p.add_argument("--backend", default="gloo", help="gloo or nccl")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    p.add_argument("--no-check", action="store_true", help="skip the correctness check")
    p.add_argument("--no-builtin", action="store_true", help="do not run the built-in")
    p.add_argument("--no-p2p", dest="p2p", action="store_false", help="skip ping-pong and the model fit")
    p.add_argument("--debug", action="store_true",
                   help="also time every algorithm with COLLECTIVES_DEBUG=1 and report the overhead")
    p.add_argument("--out", default="bench_out", help="directory for CSV, JSON, report.md and plots")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--write-table", default=None,
                   help="write the measured best algorithm per (collective, N, size) to this JSON "
                        "(collectives/tuning_table.json is what algorithm=None reads)")
    p.add_argument("--timeout", type=float, default=1800, help="hard limit per world, seconds")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    args.collectives = list(COLLECTIVES) if args.collectives == "all" else args.collectives.split(",")
    for c in args.collectives:
        if c not in COLLECTIVES:
            raise SystemExit(f"unknown collective {c!r}; choose from {', '.join(COLLECTIVES)}")
    args.algorithms = args.algorithms.split(",")
    args.loadavg = " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else None
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here")
    rows, p2p = [], []
    for n in [int(x) for x in args.world_sizes.split(",")]:
        result = run_world(args, n)
        rows += result["rows"]
        p2p += result["p2p"]
    model = {}
    for n in sorted({r["world_size"] for r in p2p}):
        model[n] = cost_model.fit([r for r in p2p if r["world_size"] == n])
    for r in rows:
        params = model.get(r["world_size"])
        if params and r["algorithm"] not in ("builtin",) and "+debug" not in r["algorithm"]:
            r["predicted_us"] = 1e6 * cost_model.predict(r["collective"], r["algorithm_run"],
                                                         r["world_size"], r["size"], params)
            # The same formula with the ring exchange's alpha and beta: links busy both ways.
            loaded = dict(params, alpha=params["alpha_ring"], beta=params["beta_ring"])
            r["predicted_loaded_us"] = 1e6 * cost_model.predict(r["collective"], r["algorithm_run"],
                                                                r["world_size"], r["size"], loaded)
    for r in rows:
        ring = [q for q in p2p if q["world_size"] == r["world_size"] and q["size"] == r["size"]]
        if ring and r["collective"] in ("all_reduce", "all_gather", "reduce_scatter"):
            # A ring's busbw cannot exceed what each rank gets sending and receiving at once.
            r["of_p2p_ceiling"] = r["busbw_GBps"] / ring[0]["ring_exchange_GBps"]
    summarize(rows)
    write_outputs(args, rows, p2p, model, args.out)
    if args.write_table:
        from . import tuning
        tuning.write_table(args.write_table, rows, model, machine_info(args))
        print(f"wrote {args.write_table}")
    print(f"wrote {args.out}/ (results.csv, results.json, p2p.csv, model.json, report.md"
          f"{'' if args.no_plots else ', plots'})")


def summarize(rows):
    """Print the default's worst point and the ratios that the targets are about."""
    dflt = [r for r in rows if r["algorithm"] == "default" and r["default_over_best"]]
    if dflt:
        worst = max(dflt, key=lambda r: r["default_over_best"])
        print(f"default/best: worst {worst['default_over_best']:.2f} ({worst['collective']}, "
              f"N={worst['world_size']}, {human(worst['size'])}, chose {worst['chosen']}); "
              f"{sum(r['default_over_best'] <= 1.10 for r in dflt)}/{len(dflt)} points within 1.10")
        for r in dflt:
            if r["vs_builtin"]:
                ceiling = (f", {r['of_p2p_ceiling']:.2f} of the ring-exchange ceiling"
                           if r.get("of_p2p_ceiling") else "")
                print(f"  default vs built-in: {r['collective']:>14} N={r['world_size']} "
                      f"{human(r['size']):>5}: time {r['vs_builtin']:.2f}x, busbw {1 / r['vs_builtin']:.2f}x"
                      f"{ceiling}")


if __name__ == "__main__":
    main()
