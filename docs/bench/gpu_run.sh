#!/usr/bin/env bash
# The GPU checks, as run on a lent one-GPU machine (see docs/benchmarks.md, "GPU").
#
#   bash docs/bench/gpu_run.sh tests   # GPU tests, chapter 9's demo, MNIST on NCCL and on gloo+CUDA
#   bash docs/bench/gpu_run.sh bench   # the CUDA sweeps: gloo ranks sharing the GPU, NCCL world of 1
#
# Runs from the source tree (PYTHONPATH=.), needs MNIST's .gz files under $COLLECTIVES_DATA
# (default .gpu_data/MNIST/raw) and writes logs and bench outputs under $OUT (default gpu_out).
# Each step has its own time limit, so one slow step cannot eat the others' time.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=. PYTHONUNBUFFERED=1
export COLLECTIVES_DATA=${COLLECTIVES_DATA:-.gpu_data} COLLECTIVES_TEST_DATA=${COLLECTIVES_DATA:-.gpu_data}
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"

step() {  # step NAME SECONDS COMMAND...: run with a limit, keep the log, say how it ended
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    echo "== $name: exit $rc in $((SECONDS - t0)) s"
    tail -n 25 "$OUT/$name.log"
}

case "$1" in
tests)
    nvidia-smi -L
    python -c "import torch, torchvision; print('torch', torch.__version__, 'torchvision', torchvision.__version__, \
'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version(), torch.cuda.get_device_name(0))"
    step tests 300 python -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py tests/test_train.py \
        tests/test_errors.py
    step ch09 60 python -m tutorials.demos.ch09_gpus
    step train_nccl 150 python -m collectives.train --world-size 1 --backend nccl --out "$OUT/train_nccl" \
        --no-progress
    step train_gloo_cuda 200 python -m collectives.train --world-size 4 --backend gloo --device cuda \
        --out "$OUT/train_gloo_cuda" --no-progress
    ;;
bench)
    step bench_nccl 120 python -m benchmarks.sweep --device cuda --backend nccl --world-size 1 --no-plots \
        --collective all_reduce,broadcast,all_gather,reduce_scatter -b 4K -e 64M -f 16 -n 10 --out "$OUT/nccl"
    step bench_gloo_cuda 330 python -m benchmarks.sweep --device cuda --backend gloo --world-size 2,4 \
        --collective all_reduce,broadcast,all_gather,reduce_scatter -b 4K -e 16M -f 16 -n 8 --out "$OUT/gloo_cuda"
    # The same machine's 16 cores with CPU tensors: gloo without oversubscription, for comparison
    step bench_cpu16 150 python -m benchmarks.sweep --world-size 2,4,8 --collective all_reduce,broadcast \
        -b 4K -e 64M -f 64 -n 8 --no-plots --out "$OUT/cpu16"
    ;;
esac
# The device tool brings back at most 8 files: everything but the checkpoints, in one archive.
tar czf "/tmp/gpu_$1.tgz" --exclude=checkpoint.pt -C "$OUT" . && rm -rf "${OUT:?}"/* && mv "/tmp/gpu_$1.tgz" "$OUT/"
