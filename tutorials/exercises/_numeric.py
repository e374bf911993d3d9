"""Numeric exercises: communication arithmetic done by hand, checked by the grader (chapter 13).

Each exercise is a question with one number for an answer. The answer is
computed here by the code the course teaches (``cost_model.predict``, each
algorithm's ``cost()``, nccl-tests' bus-bandwidth factor), never typed in, so
the chapter, the grader and the library cannot disagree. An answer within
``tolerance`` (relative) passes; a wrong one is shown the worked solution's
first step, and the step after that on each further try is the learner's.

    python -m tutorials.exercises.grade busbw --answer 146.8
    grade("busbw", 146.8)          # from Python or a notebook

An exercise has ``question`` (text), ``unit``, ``tolerance``, ``chapter``, and
``solve()`` -> (answer, [worked steps]).
"""
import math

from benchmarks.sweep import busbw_factor
from collectives import plan
from collectives.algorithms import cost
from collectives.parallel.recompute import block_activation_elements
from collectives.tuning import cost_model

MiB, GB = 1 << 20, 1e9


class Numeric:
    """One question, its unit and tolerance, and the code that solves it step by step."""

    def __init__(self, question, unit, tolerance, solve, chapter="chapter 13 (tutorials/13_communication_arithmetic.md)"):
        self.question, self.unit, self.tolerance, self._solve, self.chapter = question, unit, tolerance, solve, chapter

    def solve(self):
        return self._solve()


def _busbw():
    n, s, t = 8, 256 * MiB, 3.2e-3
    algbw = s / t / GB
    factor = busbw_factor("all_reduce", n)
    return algbw * factor, [
        f"algbw = S / t = {s} B / {t * 1e3:g} ms = {algbw:.2f} GB/s (the size of the call over its time)",
        f"busbw = algbw x 2(N-1)/N = {algbw:.2f} x {factor:g} = {algbw * factor:.1f} GB/s: the bytes each "
        f"rank's link carried, per second, whatever N (a ring all_reduce sends 2(N-1)/N x S per rank)",
    ]


def _busbw_all_gather():
    n, s, t = 16, 1024 * MiB, 12.5e-3
    algbw = s / t / GB
    factor = busbw_factor("all_gather", n)
    return algbw * factor, [
        f"algbw = S / t = {s} B / {t * 1e3:g} ms = {algbw:.2f} GB/s (S: all_gather's whole output)",
        f"busbw = algbw x (N-1)/N = {algbw:.2f} x {factor:g} = {algbw * factor:.1f} GB/s: each rank "
        f"receives the N-1 pieces it lacks",
    ]


# ranks, bytes: where the latency term is 42% of the answer (at 64 MiB on 8 ranks it was 0.6%, within
# the tolerance, so a model without alpha passed)
ALPHA_BETA_RING = (64, 4 * MiB)
PARAMS = {"alpha": 5e-6, "beta": 1 / (12.5 * GB), "gamma": 1 / (20 * GB)}


def _model_steps(collective, algorithm, n, s):
    c = cost(collective, algorithm, n, s)
    a, b, g = PARAMS["alpha"], PARAMS["beta"], PARAMS["gamma"]
    t = cost_model.predict(collective, algorithm, n, s, PARAMS)
    return t * 1e3, [
        f"cost('{collective}', '{algorithm}', {n}, {s}): steps = {c.steps}, messages = {c.messages}, "
        f"critical bytes = {c.critical_bytes}, sent = {c.sent_bytes}, received = {c.recv_bytes}, "
        f"reduced = {c.reduced_bytes}",
        f"alpha x max(steps, messages) = {a * 1e6:g} us x {max(c.steps, c.messages)} = "
        f"{a * max(c.steps, c.messages) * 1e3:.4f} ms",
        f"beta x max(critical, sent, received) = {max(c.critical_bytes, c.sent_bytes, c.recv_bytes)} B / "
        f"12.5 GB/s = {b * max(c.critical_bytes, c.sent_bytes, c.recv_bytes) * 1e3:.4f} ms",
        f"gamma x reduced = {c.reduced_bytes} B / 20 GB/s = {g * c.reduced_bytes * 1e3:.4f} ms",
        f"total = {t * 1e3:.4f} ms",
    ]


def _memory(stage):
    psi, n = 7.5e9, 64
    fp16_params, fp16_grads, optimizer = 2 * psi, 2 * psi, 12 * psi
    kept = {0: (fp16_params, fp16_grads, optimizer),
            1: (fp16_params, fp16_grads, optimizer / n),
            2: (fp16_params, fp16_grads / n, optimizer / n),
            3: (fp16_params / n, fp16_grads / n, optimizer / n)}[stage]
    total = sum(kept) / GB
    first = ("mixed-precision Adam keeps, per parameter: 2 bytes of fp16 weights, 2 of fp16 gradients, "
             "and 12 of optimizer state (fp32 master weights, momentum, variance: 4 + 4 + 4): 16 bytes")
    sharded = {0: "nothing is sharded", 1: "ZeRO-1 shards the 12 bytes of optimizer state over N",
               2: "ZeRO-2 shards the optimizer state and the gradients", 3: "ZeRO-3 shards all three"}[stage]
    return total, [first, f"{sharded}: {kept[0] / GB:g} + {kept[1] / GB:g} + {kept[2] / GB:g} GB "
                          f"= {total:.2f} GB per rank (Psi = 7.5e9{', N = 64' if stage else ''})"]


def _overlap():
    psi, n, bw, flops = 100e6, 16, 10 * GB, 100e12
    s = 4 * psi                                   # fp32 gradients
    t_comm = 2 * (n - 1) / n * s / bw
    tokens = t_comm * flops / (4 * psi)
    return tokens, [
        f"the ring all_reduce sends 2(N-1)/N x S per rank: {2 * (n - 1) / n:g} x {s / 1e6:g} MB at "
        f"{bw / GB:g} GB/s = {t_comm * 1e3:.1f} ms (bandwidth term; alpha is small beside it here)",
        f"backward costs about 4 Psi FLOPs per token (twice the forward's 2 Psi): "
        f"{t_comm * 1e3:.1f} ms x {flops / 1e12:g} TFLOP/s / (4 x {psi:g}) = {tokens:.0f} tokens",
    ]


def _tensor_parallel():
    b, s, h, tp = 8, 2048, 8192, 8
    nbytes = b * s * h * 2                          # fp16 activations of one layer
    per_call = 2 * (tp - 1) / tp * nbytes
    nvlink, ib = 450 * GB, 50 * GB
    t_ib = 4 * per_call / ib
    return t_ib * 1e3, [
        f"one layer's activations: b x s x h x 2 bytes = {b} x {s} x {h} x 2 = {nbytes} B; Megatron's "
        f"tensor parallelism all-reduces them twice in forward and twice in backward: 4 all_reduces",
        f"each sends 2(N-1)/N x S = {per_call / 1e6:.1f} MB per GPU: 4 x {per_call / 1e6:.1f} MB / "
        f"{ib / GB:g} GB/s = {t_ib * 1e3:.1f} ms over InfiniBand (over NVLink at {nvlink / GB:g} GB/s: "
        f"{4 * per_call / nvlink * 1e3:.2f} ms)",
    ]


# one block of a 7B-class model: sequence, batch, hidden, heads, MLP width; tensor-parallel ranks
BLOCK = dict(s=2048, b=1, h=4096, a=32, f=4 * 4096, t=8)


def _activations(sequence_parallel):
    s, b, h, a, f, t = BLOCK.values()
    elements = block_activation_elements(s, b, h, a, f, t, sequence_parallel=sequence_parallel)
    mib = 2 * elements / MiB
    if sequence_parallel:
        return mib, [
            f"with sequence parallelism every activation is split over the t ranks, the LayerNorms' "
            f"inputs and outputs too: (8SBH + 2SBF + SBA + 4SB) / t elements",
            f"(8 x {s} x {b} x {h} + 2 x {s} x {b} x {f} + {s} x {b} x {a} + 4 x {s} x {b}) / {t} = "
            f"{elements} elements x 2 bytes = {mib:.2f} MiB",
        ]
    return mib, [
        f"without sequence parallelism the two LayerNorms' inputs and outputs are whole on every rank "
        f"(4SBH); Q, K, V and attention's output (4SBH/t), the MLP's two hidden activations (2SBF/t) and "
        f"attention's log-sum-exp (SBA/t) are this rank's share; the LayerNorms' mean and 1/std 4SB",
        f"4 x {s} x {b} x {h} + (4 x {s} x {b} x {h} + 2 x {s} x {b} x {f} + {s} x {b} x {a}) / {t} + "
        f"4 x {s} x {b} = {elements} elements x 2 bytes = {mib:.2f} MiB",
    ]


# the planner's arithmetic: 1.3e9 parameters, 24 layers, hidden 2048, 2048 tokens, 8 sequences
PLANNED = plan.Model(1.3e9, 24, 2048, 2048, 8), plan.Config(dp=2, tp=2, pp=2, cp=1, zero=2)


def _planned_state():
    model, config = PLANNED
    m = plan.memory(model, config)
    local = model.params / (config.tp * config.pp)
    total = (m["parameters"] + m["gradients"] + m["optimizer"]) / GB
    return total, [
        f"tensor and pipeline parallelism split the parameters: Psi / (TP x PP) = 1.3e9 / 4 = {local:.4g} "
        f"per rank; ZeRO-2 then shards gradients and optimizer state over the DP = 2 copies",
        f"weights 2 x {local:.4g} = {m['parameters'] / GB:.3f} GB, gradients 2 x {local:.4g} / 2 = "
        f"{m['gradients'] / GB:.3f} GB, optimizer 12 x {local:.4g} / 2 = {m['optimizer'] / GB:.3f} GB: "
        f"{total:.3f} GB per rank (python -m collectives.plan --model 1.3e9,24,2048,2048,8 --ranks 8 "
        f"--config 2,2,2,1 --zero 2 prints the same three columns)",
    ]


NUMERIC = {
    "busbw": Numeric(
        "nccl-tests times an all_reduce of 256 MiB on 8 GPUs at 3.2 ms. What busbw (GB/s, 1 GB = 1e9 B) "
        "does it report?", "GB/s", 0.02, _busbw),
    "busbw_all_gather": Numeric(
        "An all_gather whose whole output is 1 GiB takes 12.5 ms on 16 GPUs. Its busbw (GB/s)?",
        "GB/s", 0.02, _busbw_all_gather),
    "alpha_beta_ring": Numeric(
        "The alpha-beta-gamma model as collectives.tuning.cost_model.predict computes it, alpha = 5 us, "
        "beta = 1 / (12.5 GB/s), gamma = 1 / (20 GB/s): the time (ms) of a ring all_reduce of 4 MiB on 64 ranks?",
        "ms", 0.02, lambda: _model_steps("all_reduce", "ring", *ALPHA_BETA_RING)),
    "alpha_beta_small": Numeric(
        "Same model and numbers: the time (ms) of a recursive_doubling all_reduce of 8 KiB on 8 ranks?",
        "ms", 0.02, lambda: _model_steps("all_reduce", "recursive_doubling", 8, 8 * 1024)),
    "adam_memory": Numeric(
        "Mixed-precision Adam, Psi = 7.5e9 parameters, plain data parallelism: memory per rank (GB) for "
        "weights, gradients and optimizer state?", "GB", 0.02, lambda: _memory(0)),
    "zero2_memory": Numeric(
        "The same model with ZeRO stage 2 on N = 64 ranks: memory per rank (GB)?", "GB", 0.02,
        lambda: _memory(2)),
    "overlap_tokens": Numeric(
        "A model of Psi = 1e8 parameters with fp32 gradients, 16 ranks, a ring all_reduce at 10 GB/s per "
        "rank, GPUs at 100 TFLOP/s: how many tokens per rank must a step have for backward (4 Psi FLOPs per "
        "token) to last as long as the all_reduce, so that the all_reduce can hide behind it?",
        "tokens", 0.03, _overlap),
    "tensor_parallel_ib": Numeric(
        "Tensor parallelism over 8 GPUs, batch 8, sequence 2048, hidden 8192, fp16: the time (ms) per layer "
        "of its all-reduces (forward and backward) if the 8 GPUs were in different nodes, linked by "
        "InfiniBand at 50 GB/s per GPU (bandwidth term only)?", "ms", 0.03, _tensor_parallel),
    "activation_memory": Numeric(
        "One transformer block of chapter 17's kind, S = 2048 tokens, B = 1, H = 4096, 32 heads, MLP width "
        "4H, bf16 (2 bytes), tensor parallel over t = 8 ranks without sequence parallelism: the activations "
        "one rank keeps for backward (MiB, 1 MiB = 2**20 B)?", "MiB", 0.02, lambda: _activations(False),
        chapter="chapter 17 (tutorials/17_tensor_and_sequence_parallelism.md)"),
    "activation_memory_sp": Numeric(
        "The same block with sequence parallelism: the activations one rank keeps (MiB)?", "MiB", 0.02,
        lambda: _activations(True), chapter="chapter 17 (tutorials/17_tensor_and_sequence_parallelism.md)"),
    "plan_state_memory": Numeric(
        "The planner's arithmetic: 1.3e9 parameters, mixed-precision Adam (2 + 2 + 12 bytes per parameter), "
        "DP 2 x TP 2 x PP 2 with ZeRO-2: weights, gradients and optimizer state per rank (GB, 1 GB = 1e9 B)?",
        "GB", 0.02, _planned_state, chapter="chapter 23 (tutorials/23_choosing_a_configuration.md)"),
}


def grade_number(name, answer):
    """(passed, text) for ``answer`` to numeric exercise ``name``; passed is None for no answer."""
    ex = NUMERIC[name]
    right, steps = ex.solve()
    if answer is None:
        return None, (f"NOT WRITTEN {name}: no answer yet. Question: {ex.question}\n"
                      f"Work it out ({ex.chapter}), then grade your number ({ex.unit}).")
    try:
        value = float(answer)
    except (TypeError, ValueError):
        return False, (f"FAIL {name}: the answer must be a number ({ex.unit}), not {answer!r}.\n"
                       f"Question: {ex.question}")
    if math.isfinite(value) and abs(value - right) <= ex.tolerance * abs(right):
        return True, (f"PASS {name}: {value:g} {ex.unit} is right (the answer is {right:.4g} {ex.unit}; "
                      f"within {ex.tolerance:.0%} passes).\nThe worked solution:\n"
                      + "\n".join(f"  {i + 1}. {step}" for i, step in enumerate(steps)))
    off = "too large" if value > right else "too small"
    return False, (f"FAIL {name}: {value:g} {ex.unit} is {off} (within {ex.tolerance:.0%} of the answer "
                   f"passes).\nQuestion: {ex.question}\n"
                   f"The worked solution starts:\n  1. {steps[0]}\n"
                   f"Go on from there (see {ex.chapter}), then grade again.")
