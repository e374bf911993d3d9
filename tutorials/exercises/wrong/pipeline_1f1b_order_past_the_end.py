"""Wrong (raises for some pipelines): forgets that the warm-up is min(p - s - 1, m), so with fewer
micro-batches than the stages after this one it indexes forwards that do not exist."""


def pipeline_1f1b_order(p, s, m):
    warmup = p - s - 1                             # forgets min(., m)
    forwards = [("F", i) for i in range(m)]
    backwards = [("B", i) for i in range(m)]
    order = [forwards[i] for i in range(warmup)]   # past the end when m < p - s - 1
    for i in range(m - warmup):
        order += [forwards[warmup + i], backwards[i]]
    return order + [backwards[i] for i in range(m - warmup, m)]
