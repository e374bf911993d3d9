"""Every registered algorithm states its cost as code, and the cost model reads it from there."""
import math
import pathlib
import re

import pytest

from collectives.tuning import cost_model
from collectives.algorithms import ALGORITHMS, MODULES, Cost, cost

PARAMS = {"alpha": 2e-5, "beta": 1e-9, "gamma": 3e-10}


@pytest.mark.parametrize("collective,algorithm",
                         [(c, a) for c in ALGORITHMS for a in ALGORITHMS[c]])
def test_every_registered_algorithm_states_its_cost(collective, algorithm):
    module = MODULES[collective][algorithm]
    assert callable(getattr(module, "cost", None)), f"{module.__name__} has no cost(n, s, item)"
    assert "Extra memory:" in module.__doc__, f"{module.__name__}'s card does not state its extra memory"
    assert cost(collective, algorithm, 1, 4096) == Cost()       # a group of one moves nothing
    for n in (2, 3, 4, 5, 8):
        for s in (0, 4, 4096, 1 << 20):
            c = cost(collective, algorithm, n, s, 4)
            assert isinstance(c, Cost)
            assert all(isinstance(v, int) and v >= 0 for v in vars(c).values()), (n, s, c)
            t = cost_model.predict(collective, algorithm, n, s, PARAMS)
            assert math.isfinite(t) and t >= 0


def test_a_module_without_a_cost_is_refused(monkeypatch):
    monkeypatch.delattr(MODULES["all_reduce"]["ring"], "cost")
    with pytest.raises(ValueError, match="states no cost"):
        cost_model.predict("all_reduce", "ring", 4, 4096, PARAMS)


@pytest.mark.parametrize("collective,algorithm", [("all_reduce", "ringg"), ("allreduce", "ring"),
                                                  ("broadcast", "ring")])
def test_predict_raises_on_an_unknown_name(collective, algorithm):
    with pytest.raises(ValueError, match=f"no algorithm '{algorithm}' for '{collective}'"):
        cost_model.predict(collective, algorithm, 4, 4096, PARAMS)


def test_predict_is_the_stated_cost_in_seconds():
    a, b, g = PARAMS["alpha"], PARAMS["beta"], PARAMS["gamma"]
    for n in (2, 3, 4, 8):
        for s in (4096, 1 << 20):
            m = s / n
            assert math.isclose(cost_model.predict("all_reduce", "ring", n, s, PARAMS),
                                2 * (n - 1) * a + 2 * (n - 1) * m * b + (n - 1) * m * g,
                                rel_tol=1e-3)   # exact pieces: N=3 cuts 4096 bytes 1366 + 1365 + 1365
            c = cost("broadcast", "linear", n, s)
            assert math.isclose(cost_model.predict("broadcast", "linear", n, s, PARAMS),
                                (n - 1) * a + (n - 1) * s * b) and c.messages == n - 1
    # the pipelined ring states its own time (reductions overlap transfers)
    from collectives.algorithms import all_reduce_ring_pipelined as rp
    assert cost_model.predict("all_reduce", "ring_pipelined", 4, 1 << 24, PARAMS) == rp.time(4, 1 << 24, a, b, g)
    # recursive doubling on 3 ranks: the fold costs two more messages of S and one more reduction
    s = 4096
    assert math.isclose(cost_model.predict("all_reduce", "recursive_doubling", 3, s, PARAMS),
                        3 * (a + s * b) + 2 * s * g)


def test_model_crossovers():
    """Latency-bound sizes favour few steps, bandwidth-bound sizes few bytes."""
    names = ALGORITHMS["all_reduce"]
    assert cost_model.best("all_reduce", names, 8, 64, PARAMS) == "recursive_doubling"
    assert cost_model.best("all_reduce", names, 8, 64 << 20, PARAMS) in ("ring", "ring_pipelined", "rabenseifner")
    assert cost_model.best("broadcast", ALGORITHMS["broadcast"], 8, 64, PARAMS) == "binomial_tree"


CHAPTER = pathlib.Path(__file__).resolve().parents[1] / "tutorials" / "05_algorithms.md"
MARKER = '<!-- cost table: collectives.tuning.cost_model.table("all_reduce", 4, 1 << 20, notes); ' \
         'tests/test_cost.py checks it -->\n'


def chapter_table(text):
    start = text.index(MARKER) + len(MARKER)
    return text[start:text.index("\n\n", start)]


def expected_table(text):
    notes = {}
    for line in chapter_table(text).splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        notes[re.match(r"`(\w+)`", cells[0]).group(1)] = cells[-1]
    return cost_model.table("all_reduce", 4, 1 << 20, notes)


def test_chapter_5_table_is_generated_from_cost():
    """tutorials/05_algorithms.md's all_reduce table is ``cost_model.table`` (its last column,
    the prose, is kept). To regenerate: ``python -m tests.test_cost``."""
    text = CHAPTER.read_text()
    assert chapter_table(text) == expected_table(text), (
        "chapter 5's cost table differs from the algorithms' cost(); run python -m tests.test_cost")


if __name__ == "__main__":
    text = CHAPTER.read_text()
    CHAPTER.write_text(text.replace(chapter_table(text), expected_table(text)))
    print(f"rewrote the cost table in {CHAPTER}")


@pytest.mark.parametrize("seed", range(6))
def test_a_ring_counted_at_once_is_the_ring_counted_message_by_message(seed):
    """``Tally.ring`` (O(M): every algorithm built on a ring states its cost at 4,096 ranks at
    once) against the same ring counted one message at a time."""
    import random

    from collectives.algorithms._cost import Tally
    rng = random.Random(seed)
    n = rng.randint(1, 12)
    members = rng.sample(range(n), rng.randint(1, n))
    m = len(members)
    sizes = [rng.choice([0, 0, 1, 7, 64, 100]) for _ in range(m)]
    step0, shift, fold = rng.randint(0, 5), rng.randint(0, 2), rng.random() < 0.5
    at_once, one_by_one = Tally(n), Tally(n)
    at_once.ring(sizes, range(step0, step0 + m - 1), shift=shift, reduce=fold, members=members)
    for i, r in enumerate(members):
        for s in range(m - 1):
            nbytes = sizes[(i - s - shift) % m]
            one_by_one.message(step0 + s, r, members[(i + 1) % m], nbytes)
            if fold:
                one_by_one.reduce(members[(i + 1) % m], nbytes)
    for field in ("sent", "recv", "sent_msgs", "recv_msgs", "reduced", "largest"):
        assert getattr(at_once, field) == getattr(one_by_one, field), field
