"""The learning-rate schedule: a pure function of the step, so a resumed run continues it exactly."""
import math


def learning_rate(args, step, total_steps):
    """Linear warmup over the first 3% of steps, then cosine decay to zero: a pure function of step."""
    warmup = max(1, int(0.03 * total_steps))
    if step < warmup:
        return args.lr * (step + 1) / warmup
    return args.lr * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total_steps - warmup)))
