"""Wrong, step 1 of pipeline_1f1b: one forward and one backward in turn from the start, on every
stage. Right only on the last stage (whose warm-up is empty); the others must run p - s - 1
forwards first, or stage s waits for a gradient that needs forwards it has not yet sent."""


def pipeline_1f1b_order(p, s, m):
    order = []
    for i in range(m):
        order += [("F", i), ("B", i)]
    return order
