"""The ladder of a long exercise: smaller graded steps that climb to it (issue 33, section 3).

``python -m tutorials.exercises.grade pipeline_1f1b --step 1`` grades step 1, a function of
its own with its own verdict; the last step is the exercise itself. ``LADDERS`` names each
step's exercise (its file, its function, its check):

1. ``pipeline_1f1b_order(p, s, m)``: stage s's order of work, as a list, no messages. Graded
   in this process against the library's schedule (switched off for the learner) on every
   stage of pipelines of 1 to 5 stages (quick: 1 to 4) and 1 to 2p + 1 micro-batches.
2. ``pipeline_1f1b_forward(stage, m)``: the forwards alone, with their messages: each stage
   receives micro-batch i's activation from the previous stage, computes, sends to the next.
   Graded in worlds of processes like every exercise (results, deadlock, traffic).
3. ``pipeline_1f1b``: both together, in the order of step 1.
"""
import os
import traceback

from tutorials.exercises import _routes

LADDERS = {"pipeline_1f1b": ["pipeline_1f1b_order", "pipeline_1f1b_forward", "pipeline_1f1b"]}


def _checks():
    from tutorials.exercises import _checks
    return _checks


def _ops(work):
    return " ".join(f"{k}{i}" for k, i in work)


class Pipeline1F1BOrder:
    local = True      # a pure function: graded in the grader's own process, no world
    chapter = "chapter 16 (tutorials/16_pipeline_parallelism.md)"

    def grade(self, name, source, shown, quick=False, world_sizes=None):
        """(passed, reason, text)."""
        from collectives.parallel.pipeline import one_f_one_b
        from tutorials.exercises import _sim

        restore = _routes.switch_off(source)     # the library's one_f_one_b is the answer: off
        try:
            try:
                fn = _sim.load(name, source)
            except Exception:
                return False, "load_error", (f"FAIL {name}: {shown} does not load:\n"
                                             f"{traceback.format_exc(limit=-1)}")
            stages = world_sizes or ((1, 2, 3, 4) if quick else (1, 2, 3, 4, 5))
            cases = 0
            for p in stages:
                for m in sorted({1, max(p - 1, 1), p, 2 * p + 1}):
                    for s in range(p):
                        want = one_f_one_b(p, m, s)
                        try:
                            got = fn(p, s, m)
                        except NotImplementedError:
                            return False, "not_written", (f"NOT WRITTEN {name}: {shown} still raises "
                                                         f"NotImplementedError. Write its body, then grade it "
                                                         f"again.")
                        got = [tuple(op) for op in got] if isinstance(got, (list, tuple)) else got
                        cases += 1
                        if got != want:
                            shown_got = _ops(got) if isinstance(got, list) and all(
                                isinstance(op, tuple) and len(op) == 2 for op in got) else repr(got)
                            warmup = min(p - s - 1, m)
                            return False, "wrong", (
                                f"FAIL {name}: wrong order for stage s = {s} of p = {p}, m = {m} micro-batches.\n"
                                f"  expected {_ops(want)}\n  received {shown_got}\n"
                                f"1F1B on stage s: w = min(p - s - 1, m) = {warmup} warm-up forwards, then "
                                f"one forward and one backward in turn, then the last w backwards; as a list "
                                f"of (\"F\", i) and (\"B\", i). See {self.chapter}.")
            return True, "pass", (f"PASS {name}: the 1F1B order right for all {cases} (p, s, m) on pipelines of "
                                  f"{', '.join(map(str, stages))} stages.")
        except _routes.BuiltinUsed as exc:
            frames = [f for f in traceback.extract_tb(exc.__traceback__)
                      if os.path.abspath(f.filename) == _routes.source_file(source)]
            line = f"line {frames[-1].lineno} of {os.path.basename(frames[-1].filename)}: " \
                   f"{(frames[-1].line or '').strip()}" if frames else "in your code"
            return False, "builtin", (f"FAIL {name}: it calls {exc.name} ({line}). The library's schedule is "
                                      f"switched off while grading: write the order yourself. See {self.chapter}.")
        finally:
            restore()


class Pipeline1F1BForward:
    chapter = "chapter 16 (tutorials/16_pipeline_parallelism.md)"

    def cases(self, n, quick):
        from tutorials.exercises._checks_parallel import Pipeline1F1B
        return Pipeline1F1B().cases(n, quick)      # the exercise's own cases, forwards only

    def label(self, case):
        from tutorials.exercises._checks_parallel import Pipeline1F1B
        return Pipeline1F1B().label(case) + ", forwards only"

    def run(self, fn, case, rank, n):
        from tutorials.exercises._checks_parallel import Stage
        m = case["m"]
        stage = Stage(rank, n, m, case)
        fn(stage, m)
        lines = list(stage.problems[:2])
        want = [("F", i) for i in range(m)]
        if any(kind == "B" for kind, _ in stage.work):
            lines.append(f"stage {rank} called stage.backward: this step runs the forwards only")
        elif stage.work != want:
            lines.append(f"stage {rank} ran {_ops(stage.work) or 'nothing'}; the forwards are "
                         f"{_ops(want)}, each once, in micro-batch order")
        if lines:
            return {"ok": False, "lines": lines}
        return {"ok": True, "lines": [f"stage {rank}: {_ops(stage.work)}, each given its micro-batch's "
                                      f"activation  ok"]}

    def need(self, case, n):
        if n == 1:
            return None
        from tutorials.exercises._checks_parallel import WIDTH
        a = case["rows"] * WIDTH * 8
        m = case["m"]
        return _checks().Need(sent_bytes=m * a, sent_messages=m,
                              ideal=f"at most m = {m} messages of A = {a} bytes (one activation per "
                                    f"micro-batch, to the next stage)", algorithm="a pipeline stage's forwards",
                              chapter=self.chapter)


CHECKS = {"pipeline_1f1b_order": Pipeline1F1BOrder(), "pipeline_1f1b_forward": Pipeline1F1BForward()}
