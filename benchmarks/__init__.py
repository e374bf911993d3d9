"""Benchmarks of the ``collectives`` library, beside it and never imported by it.

One module per job, each runnable as ``python -m benchmarks.NAME``:

* :mod:`benchmarks.sweep`: every algorithm of every collective against the
  built-in over a range of sizes, nccl-tests style (``-b -e -f -i -n -w -c -o -d``).
* :mod:`benchmarks.pingpong`: point-to-point latency and bandwidth, and the
  alpha-beta-gamma fit of :mod:`collectives.tuning.cost_model`.
* :mod:`benchmarks.call_overhead`: where a small call's time goes, layer by layer.
* :mod:`benchmarks.cpu`: a large call's CPU, thread by thread.
* :mod:`benchmarks.cliff`: gloo's socket threads preempting or not, side by side.
* :mod:`benchmarks.data_parallel`: a training step of our data parallelism
  against torch's DDP, and the Perfetto trace of one step.
* :mod:`benchmarks.memory`: each algorithm's extra peak memory per rank.
* :mod:`benchmarks.desync_cost`: what the always-on mismatch detection costs.

:mod:`benchmarks.common` holds what they share: sizes, flags, starting worlds
of processes (through :mod:`collectives.tools.launch`, so ``torchrun`` works too),
the timing loop, progress and the CSV/JSON reports. Results go to ``bench_out/``
(ignored by git) unless ``--out`` says otherwise.
"""
