"""Predict, then reveal: questions asked before the page shows the answer.

Every answer is computed here from the same recorded run the page draws, so a question and
its page never disagree; the page checks the learner's answer itself (``tolerance``: the
relative error accepted for a number read off a picture; 0 means exact).
"""


def _q(ask, answer, why, tolerance=0.0, unit=""):
    return dict(ask=ask, answer=answer, why=why, tolerance=tolerance, unit=unit)


def ranks_in(key, mode, n):
    v = int(key, 16)
    if mode == "nibbles":
        return sum((v >> (4 * r)) & 15 for r in range(n))
    return bin(v).count("1")


def collective_questions(d):
    """The questions of a collective's page (those its run can answer)."""
    n, msgs, steps = d["n"], d["msgs"], d["steps"]
    qs = []
    if not msgs:
        return qs
    r = 1 if n > 1 else 0
    mine = [m for m in msgs if m[0] == r]
    label = d["labels"]
    if mine:
        k = mine[len(mine) // 2][2]
        at = [m for m in mine if m[2] == k]
        if len(at) == 1:
            m = at[0]
            qs.append(_q(f"At step {label[k]}, to which rank does rank {r} send?", m[1],
                         f"the run's message of step {label[k]} from rank {r} goes to rank {m[1]}"))
            if m[7] >= 0:
                qs.append(_q(f"At step {label[k]}, which cell (counting from 0) of its buffer does rank {r} send?", m[7],
                             f"it sends {m[9]} element(s) starting at cell {m[7]}"))
            if m[6] >= 0 and d["mode"]:
                c = ranks_in(d["provs"][m[6]], d["mode"], n)
                qs.append(_q(f"The chunk rank {r} sends at step {label[k]}: how many ranks' contributions does it hold?", c,
                             "read off its colour: one stripe per contribution"))
    sent = sum(m[3] for m in msgs if m[0] == r)
    qs.append(_q(f"How many bytes does rank {r} send in the whole call?", sent,
                 f"the sum of its {sum(1 for m in msgs if m[0] == r)} messages", unit="B"))
    per_link = [0] * len(d["links"])
    for m in msgs:
        for x in m[10]:
            per_link[x] += m[3]
    busiest = max(range(len(per_link)), key=per_link.__getitem__)
    qs.append(_q("How many bytes cross the busiest link?", per_link[busiest],
                 f"the busiest link is {d['links'][busiest]['name']}", unit="B"))
    qs.append(_q("How many logical steps does the call take?", len(steps),
                 f"the steps the run's messages carry: {label[0]} to {label[-1]}"))
    if d.get("clock") == "measured":    # a measured time is this run's, not a figure to predict
        return qs
    qs.append(_q("How long does the call take on this network, in microseconds (within 10%)?",
                 round(d["time"] * 1e6, 3), "the simulated clock when the last rank finished", tolerance=0.1,
                 unit="us"))
    return qs


def pipeline_questions(d):
    p, m = d["p"], d["m"]
    return [
        _q("What fraction of the stage-time slots is idle (the bubble)? Answer as a fraction like 0.43 (within 1%).",
           round(d["bubble"], 4), f"idle slots / all slots = {d['idle']} / {d['slots']}", tolerance=0.01),
        _q("How many time slots does the whole schedule take?", d["makespan"],
           f"{p} stages, {m} micro-batches, forward and backward one slot each"),
        _q("How many activations does stage 0 hold at most at once (forwards done, backwards not yet)?",
           d["peak"][0], "count F minus B along stage 0's row; 1F1B bounds it by the stage count"),
    ]


def deadlock_questions(d):
    cyc = d["failure"]["cycle"]
    first = cyc[0]
    return [_q("How many ranks are on the wait-for cycle?", len(cyc),
               f"the simulator names a {d['failure']['type']} cycle"),
            _q(f"Rank {first['rank']} waits forever: for which rank?", first["peer"],
               f"it waits to {first['kind']} {first['nbytes']} B at step {first['step']}; that rank waits in turn")]
