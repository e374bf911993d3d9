"""Chapter 13: communication arithmetic, worked with the code the library uses.

    python -m tutorials.demos.ch13_arithmetic

No processes: every figure below is arithmetic, done by the same functions the
library and the benchmarks use (nccl-tests' busbw factor, each algorithm's
``cost()``, ``cost_model.predict``), so the chapter's examples and the code
cannot disagree. The chapter's exercises ask the same questions with other numbers.
"""
from benchmarks.sweep import busbw_factor
from collectives.algorithms import cost
from collectives.tuning import cost_model

GB, MiB = 1e9, 1 << 20
PARAMS = {"alpha": 5e-6, "beta": 1 / (12.5 * GB), "gamma": 1 / (20 * GB)}   # 100 Gbit/s, reduce at 20 GB/s


def bandwidths():
    print("1. algbw and busbw: a call of S bytes that took t seconds, on N = 8 ranks")
    s, t, n = 64 * MiB, 1.5e-3, 8
    algbw = s / t / GB
    print(f"   S = {s} B, t = {t * 1e3:g} ms: algbw = S / t = {algbw:.2f} GB/s")
    for collective in ("all_reduce", "all_gather", "reduce_scatter", "broadcast"):
        f = busbw_factor(collective, n)
        print(f"   {collective:15s} busbw = algbw x {f:<6g} = {algbw * f:6.2f} GB/s")


def model():
    print("2. the alpha-beta-gamma model (cost_model.predict), alpha = 5 us, beta = 1/12.5 GB/s, "
          "gamma = 1/20 GB/s, N = 8")
    a, b, g = PARAMS["alpha"], PARAMS["beta"], PARAMS["gamma"]
    print(f"   {'size':>8s} {'algorithm':19s} {'alpha term':>11s} {'beta term':>10s} {'gamma term':>11s} "
          f"{'total':>10s}")
    for size in (4 * 1024, 1 * MiB, 64 * MiB):
        for algorithm in ("ring", "recursive_doubling", "rabenseifner"):
            c = cost("all_reduce", algorithm, 8, size)
            terms = (a * max(c.steps, c.messages), b * max(c.critical_bytes, c.sent_bytes, c.recv_bytes),
                     g * c.reduced_bytes)
            total = cost_model.predict("all_reduce", algorithm, 8, size, PARAMS)
            assert abs(total - sum(terms)) <= 1e-12 + 1e-9 * total   # the model is exactly these three terms
            label = f"{size // 1024} KiB" if size < MiB else f"{size // MiB} MiB"
            print(f"   {label:>8s} {algorithm:19s} " + " ".join(f"{x * 1e6:9.1f}us" for x in terms)
                  + f" {total * 1e6:8.1f}us")


def memory():
    print("3. memory per rank, mixed-precision Adam (2 + 2 + 12 bytes per parameter), Psi = 1.5e9, N = 16")
    psi, n = 1.5e9, 16
    rows = [("data parallel", 2, 2, 12), ("ZeRO-1", 2, 2, 12 / n), ("ZeRO-2", 2, 2 / n, 12 / n),
            ("ZeRO-3", 2 / n, 2 / n, 12 / n)]
    for name, p, gr, opt in rows:
        print(f"   {name:14s} {p:g} + {gr:g} + {opt:g} bytes per parameter = {(p + gr + opt) * psi / GB:6.2f} GB")


def overlap():
    print("4. does the all_reduce hide behind backward? Psi = 2.5e7 fp32 gradients, N = 8, 25 MB buckets")
    psi, n, bw, flops, bucket = 2.5e7, 8, 5 * GB, 20e12, 25e6
    s = 4 * psi
    comm = 2 * (n - 1) / n * s / bw
    last = 2 * (n - 1) / n * bucket / bw        # the last bucket starts after the last gradient
    for tokens in (2048, 8192, 32768):
        backward = 4 * psi * tokens / flops
        exposed = max(comm - backward, last)
        verdict = (f"all but the last bucket hidden, {last * 1e3:.1f} ms exposed" if backward >= comm
                   else f"{exposed * 1e3:.1f} ms exposed (at best)")
        print(f"   {tokens:6d} tokens per rank: backward {backward * 1e3:5.1f} ms, all_reduce "
              f"{comm * 1e3:.1f} ms at {bw / GB:g} GB/s: {verdict}")


def tensor_parallel():
    print("5. tensor parallelism's all-reduces per layer: batch 4, sequence 4096, hidden 4096, fp16, 8 GPUs")
    nbytes, tp = 4 * 4096 * 4096 * 2, 8
    per_gpu = 4 * 2 * (tp - 1) / tp * nbytes
    for link, bw in (("NVLink (H100, 450 GB/s per direction)", 450 * GB), ("InfiniBand NDR (50 GB/s)", 50 * GB)):
        print(f"   {link:38s} {per_gpu / bw * 1e3:6.2f} ms")


if __name__ == "__main__":
    bandwidths()
    model()
    memory()
    overlap()
    tensor_parallel()
