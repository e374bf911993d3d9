"""Exercise, step 1 of 3 of pipeline_1f1b: the 1F1B order of work of one stage, no messages yet.

Build ``pipeline_1f1b_order(p, s, m)``: the forwards and backwards stage s of p runs for m
micro-batches, in 1F1B's order, as a list of ``("F", i)`` and ``("B", i)``. No world, no
message: the grader calls it for every stage of pipelines of 1 to 5 stages, with 1 to 2p + 1
micro-batches, and compares with the library's schedule (switched off for you).

Read: chapter 16, tutorials/16_pipeline_parallelism.md, "1F1B".

Hint: stage s first runs w = min(p - s - 1, m) warm-up forwards (F0 .. Fw-1): the last stage
none, the first p - 1. Then, m - w times, one forward and one backward (F(w) B0 F(w+1) B1 ...),
then the w backwards left. Stage s then holds at most p - s micro-batches' activations.

Traffic to reach: none (step 2 adds the messages; step 3 is pipeline_1f1b itself).

Grade it:  python -m tutorials.exercises.grade pipeline_1f1b --step 1
"""


def pipeline_1f1b_order(p, s, m):
    """Stage s's work in 1F1B order: a list of ("F", i) and ("B", i), each micro-batch once of each."""
    raise NotImplementedError("write the 1F1B order here")
