"""Chapter 8: a hang, dumped in torch's Flight Recorder format and read by torch's analyzer.

    python -m tutorials.demos.ch08_flight_recorder

Three ranks run an all_reduce; then rank 2 "has one batch fewer" and goes on with other work
while ranks 0 and 1 enter the next all_reduce. With ``COLLECTIVES_DUMP_ON_TIMEOUT=1`` the rank
that times out writes its flight recorder (its last calls) into ``COLLECTIVES_TRACE_DIR`` and
asks the others to write theirs; then torch's own analyzer,
``python -m torch.distributed.flight_recorder.fr_trace DIR``, reads the three dumps.
"""
import os
import pickle
import subprocess
import sys
import tempfile
import time

import torch

import collectives
from collectives import flight_recorder
from tutorials.demos.common import run

WORLD_SIZE = 3
TIMEOUT = 3


def one_batch_fewer(rank, world_size):
    collectives.all_reduce(torch.ones(4), algorithm="ring")      # every rank: call #0
    if rank == 2:
        time.sleep(TIMEOUT + 8)   # other work; its recorder's watchdog dumps when asked
        return None
    try:
        collectives.all_reduce(torch.ones(4), algorithm="ring")  # call #1: rank 2 never comes
    except collectives.CollectiveTimeout as error:
        return str(error).split(" (collectives.")[0]
    finally:
        time.sleep(3)             # the store (rank 0) stays up while rank 2 dumps


def main():
    trace_dir = tempfile.mkdtemp(prefix="collectives_trace_")
    env = {"COLLECTIVES_TIMEOUT": str(TIMEOUT), "COLLECTIVES_DUMP_ON_TIMEOUT": "1",
           "COLLECTIVES_TRACE_DIR": trace_dir}
    outcomes = run(one_batch_fewer, WORLD_SIZE, env=env)
    print(f"rank 0: {outcomes[0]}")
    files = sorted(os.listdir(trace_dir))
    print(f"dumps: {', '.join(files)}")
    with open(os.path.join(trace_dir, files[0]), "rb") as f:
        dump = pickle.load(f)
    print(f"rank 0's buffer (format {dump['version']}):")
    for e in dump["entries"]:
        waits = e["collectives"]["waiting_on"]
        waiting = f", waiting to {waits['kind']} {waits['bytes']} B at step {waits['step']} " \
                  f"{'to' if waits['kind'] == 'send' else 'from'} rank {waits['peer']}" if waits else ""
        print(f"  #{e['collective_seq_id']} {e['profiling_name']} ({e['collectives']['algorithm']}) "
              f"sizes {e['input_sizes']}: {e['state']}{waiting}")
    if not flight_recorder.analyzer_reads_gloo():
        print(f"(torch {torch.__version__}'s fr_trace reads NCCL records only: run it under a newer torch)")
        return
    analysis = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", trace_dir],
                              capture_output=True, text=True, timeout=120)
    print("python -m torch.distributed.flight_recorder.fr_trace DIR:")
    for line in (analysis.stdout + analysis.stderr).splitlines():
        if line.startswith("collective stack trace"):
            break                 # the frames name this machine's paths
        if "tabulate" not in line:
            print(f"  {line}")


if __name__ == "__main__":
    main()
