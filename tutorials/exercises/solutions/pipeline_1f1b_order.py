"""Reference solution, step 1 of pipeline_1f1b: warm-up forwards, F/B pairs, the backwards left (chapter 16)."""


def pipeline_1f1b_order(p, s, m):
    warmup = min(p - s - 1, m)
    order = [("F", i) for i in range(warmup)]
    for i in range(m - warmup):
        order += [("F", warmup + i), ("B", i)]
    return order + [("B", i) for i in range(m - warmup, m)]
