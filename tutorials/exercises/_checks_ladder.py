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

``fsdp_step``'s ladder (chapter 18), each graded in worlds of processes on one layer whose
size N does not divide (25, 1 and 11 values), so the padding matters:

1. ``fsdp_step_gather(shard, shapes)``: this rank's piece of the layer's padded flat vector
   in, the layer's tensors out (all-gather, padding cut off, each viewed as its shape).
2. ``fsdp_step_reduce_scatter(grads)``: this rank's gradients in, its piece of their
   average out (flattened, padded to N x k, reduce-scattered, divided by N).
3. ``fsdp_step``: both, layer by layer, in a forward and a backward.

``moe_dispatch``'s ladder (chapter 19), on moe_dispatch's own routings (a rank with no
tokens, every token to the last expert, skewed):

1. ``moe_dispatch_counts(expert_of)``: the tokens this rank sends to each expert, and the
   counts exchanged, so that each rank knows how many rows each other rank sends it.
2. ``moe_dispatch_tokens(tokens, expert_of, send, recv)``: the counts given, the tokens sent
   to their experts in uneven pieces.
3. ``moe_dispatch``: both.

``ring_attention``'s ladder (chapter 20):

1. ``ring_attention_rotate(k, v)``: one move of the (k, v) blocks, to rank r + 1, from rank
   r - 1, posted together. Graded in worlds of processes, called N times in a row on what it
   returned: after rotation s rank r holds rank r - s's block (values name the rank), and each
   rotation sent the block it was handed once, to rank r + 1 (a store of every block fails).
2. ``ring_attention_merge(o, m, l, s, v)``: the online softmax folds one block's scores and
   values into the running (o, m, l). Graded in this process after every merge of 1 to 5
   blocks against torch's softmax attention in float64, one case with scores in the thousands
   (exp of them overflows: the running maximum is not optional).
3. ``ring_attention``: both, N - 1 rotations, a merge at each block.
"""
import math
import traceback

import torch

from tutorials.exercises import _common, _routes

LADDERS = {"pipeline_1f1b": ["pipeline_1f1b_order", "pipeline_1f1b_forward", "pipeline_1f1b"],
           "fsdp_step": ["fsdp_step_gather", "fsdp_step_reduce_scatter", "fsdp_step"],
           "moe_dispatch": ["moe_dispatch_counts", "moe_dispatch_tokens", "moe_dispatch"],
           "ring_attention": ["ring_attention_rotate", "ring_attention_merge", "ring_attention"]}


def _ops(work):
    return " ".join(f"{k}{i}" for k, i in work)


class Pipeline1F1BOrder:
    local = True      # a pure function: graded in the grader's own process, no world
    chapter = "chapter 16 (tutorials/16_pipeline_parallelism.md)"

    def grade(self, name, source, shown, quick=False, world_sizes=None):
        """(passed, reason, text)."""
        from collectives.parallel.pipeline import one_f_one_b

        # the library's one_f_one_b is the answer: off while the learner's function runs
        return _common.graded_here(
            name, source, shown, lambda fn: self.orders(fn, name, shown, source, one_f_one_b, quick, world_sizes),
            "The library's schedule is switched off while grading: write the order yourself.", self.chapter)

    def orders(self, fn, name, shown, source, one_f_one_b, quick, world_sizes):
        """(passed, reason, text) of ``fn`` against 1F1B's order on every (p, s, m) graded."""
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
                    except _routes.BuiltinUsed:
                        raise
                    except Exception as exc:     # the learner's error is a verdict, not the grader's
                        return False, "crash", (f"FAIL {name}: it raised for stage s = {s} of p = {p}, "
                                                f"m = {m} micro-batch{'es' if m != 1 else ''}:\n"
                                                f"{_common.learner_traceback(exc, source).rstrip()}")
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
        return _common.Need(sent_bytes=m * a, sent_messages=m,
                              ideal=f"at most m = {m} messages of A = {a} bytes (one activation per "
                                    f"micro-batch, to the next stage)", algorithm="a pipeline stage's forwards",
                              chapter=self.chapter)


# --- fsdp_step's steps --------------------------------------------------------------------------

# One layer's parameter shapes per case: 25, 1 and 11 values, none a multiple of 2 or 3 (so on
# 2 and 3 ranks the flat vector ends in padding), the second fewer values than ranks.
FSDP_STEP_LAYERS = [[(5, 4), (5,)], [(1,)], [(2, 3), (3,), (2,)]]
FSDP_CHAPTER = "chapter 18 (tutorials/18_fully_sharded.md)"


def _layer_cases(quick):
    shapes = FSDP_STEP_LAYERS[:2] if quick else FSDP_STEP_LAYERS
    return [dict(shapes=s, salt=salt) for salt, s in enumerate(shapes)]


def _layer_label(case):
    numel = sum(math.prod(s) for s in case["shapes"])
    return (f"one float64 layer of shapes {', '.join(str(list(s)) for s in case['shapes'])} ({numel} "
            f"value{'s' if numel != 1 else ''}) cut into {{n}} pieces")


def _layout(case, n):
    """(numel, k, padding) of the case's layer cut into n pieces."""
    numel = sum(math.prod(s) for s in case["shapes"])
    k = math.ceil(numel / n)
    return numel, k, n * k - numel


def _owned(case, n):
    """The layer's padded flat vector: value 100 r + j + 1 at offset j of rank r's piece, 0 in the
    padding, so a wrong value says whose piece (and where in it) it came from."""
    numel, k, _ = _layout(case, n)
    j = torch.arange(n * k)
    values = (100 * (j // k) + j % k + 1).to(torch.float64)
    values[numel:] = 0
    return values


def _layer_need(case, n, what):
    if n == 1:
        return None
    _, k, _ = _layout(case, n)
    return _common.Need(sent_bytes=(n - 1) * k * 8, sent_messages=n - 1,
                          ideal=f"(N-1) x k x 8 = {(n - 1) * k * 8} bytes in N-1 = {n - 1} messages "
                                f"(k = {k} values a piece)",
                          algorithm=f"one ring {what}", chapter=FSDP_CHAPTER)


class FsdpStepGather:
    chapter = FSDP_CHAPTER

    def cases(self, n, quick):
        return _layer_cases(quick)

    def label(self, case):
        return _layer_label(case)

    def run(self, fn, case, rank, n):
        shapes = [tuple(s) for s in case["shapes"]]
        numel, k, pad = _layout(case, n)
        padded = _owned(case, n)
        shard = padded[rank * k:(rank + 1) * k].clone()
        handed = shard.clone()
        got = fn(handed, list(shapes))
        expected = [part.view(shape) for part, shape in zip(padded[:numel].split([math.prod(s) for s in shapes]),
                                                             shapes)]
        layout = (f"(the layer's {numel} values padded with {pad} zero{'s' if pad != 1 else ''} to N x k = "
                  f"{n * k}, k = ceil({numel} / {n}) = {k}; rank r's piece holds 100 r + 1, 100 r + 2, ...)")
        if isinstance(got, torch.Tensor) or not isinstance(got, (list, tuple)) or len(got) != len(expected):
            what = (f"one tensor of {got.numel()} values" if isinstance(got, torch.Tensor)
                    else f"{type(got).__name__}" + (f" of {len(got)}" if isinstance(got, (list, tuple)) else ""))
            lines = [f"returned {what}, not a list of {len(expected)} tensors of shapes "
                     f"{', '.join(str(list(s)) for s in shapes)} (one per shape, in order)"]
            if isinstance(got, torch.Tensor) and got.numel() == n * k:
                lines.append(f"that is the gathered flat vector itself {layout}: cut off the padding and "
                             f"view each tensor's part as its shape")
            return _common.untouched({"ok": False, "lines": lines}, [("shard", shard, handed)])
        report = _common.compare([(f"tensors[{i}]", e, g) for i, (e, g) in enumerate(zip(expected, got))])
        if not report["ok"]:
            report["lines"].append(layout)
            hint = self.mistake(expected, got, numel, k, n)
            if hint:
                report["lines"].append(hint)
        return _common.untouched(report, [("shard", shard, handed)])

    def mistake(self, expected, got, numel, k, n):
        """The likely mistake behind wrong tensors, in words, or None."""
        for i, (e, g) in enumerate(zip(expected, got)):
            if not isinstance(g, torch.Tensor) or _common.same(e, g):
                continue
            flat = g.detach().reshape(-1)
            if flat.numel() > e.numel() and torch.equal(flat[:e.numel()], e.reshape(-1)) \
                    and not bool(flat[e.numel():].ne(0).any()):
                return (f"(tensors[{i}] ends with the {flat.numel() - e.numel()} zeros of the padding: the "
                        f"padding is the tail of the flat vector, past the last tensor; cut the gathered "
                        f"vector to its first numel = {numel} values, full[:{numel}], before splitting it)")
            if flat.numel() == e.numel() and torch.equal(flat, e.reshape(-1)):
                return f"(tensors[{i}] holds the right values in the wrong shape: view it as {list(e.shape)})"
            if flat.numel() == e.numel() and flat.dtype == e.dtype:
                owners = sorted({int(v) // 100 for v in flat.tolist() if v > 0})
                want = sorted({int(v) // 100 for v in e.reshape(-1).tolist() if v > 0})
                if owners != want:
                    return (f"(tensors[{i}] holds values of rank{'s' if len(owners) != 1 else ''} "
                            f"{', '.join(map(str, owners))}'s piece{'s' if len(owners) != 1 else ''} where "
                            f"rank{'s' if len(want) != 1 else ''} {', '.join(map(str, want))}'s belong: piece r "
                            f"of the gathered vector is full[r*k:(r+1)*k], k = {k})")
        return None

    def need(self, case, n):
        return _layer_need(case, n, "all-gather")


class FsdpStepReduceScatter:
    chapter = FSDP_CHAPTER

    def cases(self, n, quick):
        return _layer_cases(quick)

    def label(self, case):
        return _layer_label(case)

    def grads(self, rank, case):
        """Rank ``rank``'s gradients: 10 (r + 1) + small values, so the sum over ranks shows in each."""
        numel = sum(math.prod(s) for s in case["shapes"])
        j = torch.arange(numel)
        flat = (10 * (rank + 1) + (j * 3 + case["salt"]) % 7).to(torch.float64)
        return [part.view(s) for part, s in zip(flat.split([math.prod(s) for s in case["shapes"]]),
                                                case["shapes"])]

    def run(self, fn, case, rank, n):
        numel, k, pad = _layout(case, n)
        grads = self.grads(rank, case)
        handed = [g.clone() for g in grads]
        got = fn(handed)
        # the single-process reference: each rank's flat gradient, padded, cut, averaged
        terms = []
        for r in range(n):
            flat = torch.cat([g.reshape(-1) for g in self.grads(r, case)] + [torch.zeros(pad, dtype=torch.float64)])
            terms.append(flat[rank * k:(rank + 1) * k] / n)
        expected = sum(terms)
        report = _common.compare([("piece", expected, got)])
        report = _common.pattern(report, expected, got, terms, rank, "the piece")
        if not report["ok"]:
            layout = (f"(k = ceil(numel / N) = ceil({numel} / {n}) = {k} values a piece: the flat gradient "
                      f"padded with {pad} zero{'s' if pad != 1 else ''} to N x k = {n * k}; rank r keeps "
                      f"values r x k to (r+1) x k - 1, averaged over the ranks)")
            report["lines"].append(layout)
            if isinstance(got, torch.Tensor) and got.dim() == 1 and got.numel() == numel // n and pad:
                lost = numel - n * (numel // n)
                report["lines"].append(
                    f"(a piece of numel // N = {numel // n} values: cut that way, the last {lost} "
                    f"value{'s' if lost != 1 else ''} of the gradient belong{'s' if lost == 1 else ''} to no rank; "
                    f"pad the flat gradient with N x k - numel = {pad} zeros and cut pieces of k = {k})")
        before = [(f"grads[{i}]", g, h) for i, (g, h) in enumerate(zip(grads, handed))]
        return _common.untouched(report, before)

    def need(self, case, n):
        return _layer_need(case, n, "reduce-scatter")


# --- moe_dispatch's steps -------------------------------------------------------------------------

def _moe():
    from tutorials.exercises._checks_parallel_b import MoeDispatch
    return MoeDispatch()


def _ints(value):
    """``value`` as an int64 tensor where it is a list or tensor of ints, else as it was (compare says what)."""
    try:
        return torch.as_tensor(value, dtype=torch.int64) if not isinstance(value, torch.Tensor) else value
    except (TypeError, ValueError, RuntimeError):
        return value


class MoeDispatchCounts:
    chapter = "chapter 19 (tutorials/19_expert_parallelism.md)"

    def cases(self, n, quick):
        return _moe().cases(n, quick)

    def label(self, case):
        return _moe().label(case).replace(f"tokens float64[T, {case['hidden']}], T", "expert_of int64[T], T")

    def run(self, fn, case, rank, n):
        moe = _moe()
        experts = [moe.inputs(j, n, case)[1] for j in range(n)]
        expert = experts[rank]
        send = torch.bincount(expert, minlength=n)
        recv = torch.tensor([int((e == rank).sum()) for e in experts])
        handed = expert.clone()
        result = fn(handed)
        if not (isinstance(result, tuple) and len(result) == 2):
            return {"ok": False, "lines": [f"expected (send, recv), found {type(result).__name__}"]}
        got_send, got_recv = (_ints(v) for v in result)
        report = _common.compare([("send", send, got_send), ("recv", recv, got_recv)])
        if not report["ok"]:
            report["lines"].append(f"(send[j]: how many of this rank's tokens go to expert j; recv[j]: how many "
                                   f"rank j's expert_of sends to expert {rank}, this rank; the tokens are T by "
                                   f"rank {case['tokens']}, expert_of ids in 0..{n - 1})")
            if isinstance(got_send, torch.Tensor) and got_send.dim() == 1 and got_send.numel() < n:
                report["lines"].append(f"(send has {got_send.numel()} entries, not N = {n}: "
                                       f"torch.bincount stops at the highest expert used; pass minlength=N)")
            if (isinstance(got_recv, torch.Tensor) and got_recv.shape == send.shape
                    and torch.equal(got_recv, send) and not torch.equal(send, recv)):
                report["lines"].append("(recv is this rank's own send: the counts were not exchanged; rank j's "
                                       "send[r] is rank r's recv[j], so send send[j] to rank j and receive "
                                       "recv[j] from it)")
        return _common.untouched(report, [("expert_of", expert, handed)])

    def need(self, case, n):
        if n == 1:
            return None
        return _common.Need(sent_bytes=8 * (n - 1), sent_messages=n - 1,
                              ideal=f"N-1 = {n - 1} messages of 8 bytes (one count to each other rank)",
                              algorithm="the exchange of the counts", chapter=self.chapter)


class MoeDispatchTokens:
    chapter = "chapter 19 (tutorials/19_expert_parallelism.md)"

    def cases(self, n, quick):
        return _moe().cases(n, quick)

    def label(self, case):
        return _moe().label(case)

    def run(self, fn, case, rank, n):
        moe = _moe()
        everyone = [moe.inputs(j, n, case) for j in range(n)]
        tokens, expert = everyone[rank]
        send = torch.bincount(expert, minlength=n)
        recv = torch.tensor([int((e == rank).sum()) for _, e in everyone])
        expected = torch.cat([t[e == rank] for t, e in everyone])
        handed = [tokens.clone(), expert.clone(), send.clone(), recv.clone()]
        received = fn(*handed)
        report = _common.compare([("received", expected, received)])
        if not report["ok"]:
            report["lines"].append(f"(a token's values are 100000 x its rank + 100 x its row + its column; "
                                   f"received holds the rows routed to expert {rank}, rank 0's first, each "
                                   f"rank's in its own order; recv = {recv.tolist()} rows from each rank)")
            hint = self.mistake(received, expected, everyone, rank)
            if hint:
                report["lines"].append(hint)
        before = [("tokens", tokens, handed[0]), ("expert_of", expert, handed[1]), ("send", send, handed[2]),
                  ("recv", recv, handed[3])]
        return _common.untouched(report, before)

    def mistake(self, received, expected, everyone, rank):
        """Name a received row that belongs to another expert (pieces cut before sorting), or None."""
        if not isinstance(received, torch.Tensor) or received.shape != expected.shape \
                or received.dtype != expected.dtype or not received.numel():
            return None
        for value in received[:, 0].tolist():
            j, row = int(value) // 100000, int(value) % 100000 // 100
            if 0 <= j < len(everyone) and row < len(everyone[j][1]) and int(everyone[j][1][row]) != rank:
                return (f"(received holds rank {j}'s row {row}, which rank {j} routes to expert "
                        f"{int(everyone[j][1][row])}, not {rank}: cut the pieces from the tokens sorted by "
                        f"expert, tokens[expert_of.argsort(stable=True)].split(send.tolist()))")
        return None

    def need(self, case, n):
        whole = _moe().need(case, n)
        if whole is None:
            return None
        bound = whole.sent_bytes - 8 * (n - 1)      # the dispatch less its counts: given here
        return _common.Need(sent_bytes=bound, sent_messages=n - 1,
                              ideal=f"at most {bound} bytes in N-1 = {n - 1} messages (each token once, to "
                                    f"its expert's rank only, no padding)",
                              algorithm="the dispatch of the tokens", chapter=self.chapter)


# --- ring_attention's steps -----------------------------------------------------------------------

CP_CHAPTER = "chapter 20 (tutorials/20_context_parallelism.md)"
MERGE = ("m' = max(m, s.amax(-1)), p = exp(s - m'), l = l * exp(m - m') + p.sum(-1), "
         "o = o * exp(m - m') + p @ v")


def _block(j, rows, width, half):
    """Rank j's block: 10000 j + i at flat index i, plus 0.5 in v: a value names its rank, and k or v."""
    return (10000 * j + torch.arange(rows * width, dtype=torch.float64) + half).view(rows, width)


def _owners(t):
    """(the ranks whose block values ``t`` holds, the set of their fractions: 0.0 for k, 0.5 for v)."""
    flat = t.detach().reshape(-1).tolist()
    return sorted({int(x // 10000) for x in flat}), {x % 1 for x in flat}


class RingAttentionRotate:
    chapter = CP_CHAPTER

    def cases(self, n, quick):
        cases = [dict(rows=2, dk=3, dv=3), dict(rows=0, dk=3, dv=3), dict(rows=3, dk=4, dv=2)]
        if not quick:
            cases.insert(1, dict(rows=1, dk=1, dv=1))
        cases.append(dict(rows=64, dk=32, dv=32))      # 16 KiB a block: the bytes are judged
        return cases

    def label(self, case):
        return (f"k float64[{case['rows']}, {case['dk']}], v float64[{case['rows']}, {case['dv']}] a rank, "
                f"rotated N times (a full turn)")

    def run(self, fn, case, rank, n):
        from tutorials.exercises import _watch
        rows, dk, dv = case["rows"], case["dk"], case["dv"]
        k, v = _block(rank, rows, dk, 0.0), _block(rank, rows, dv, 0.5)
        held = []
        for s in range(1, n + 1):
            handed = (k.clone(), v.clone())
            posted = len(_watch.COUNTERS.sends)
            got = fn(*handed)
            sends = _watch.COUNTERS.sends[posted:]
            j = (rank - s) % n
            if not (isinstance(got, (tuple, list)) and len(got) == 2):
                return {"ok": False, "lines": [f"rotation {s}: expected (k, v), found {type(got).__name__}"]}
            report = _common.compare([("k", _block(j, rows, dk, 0.0), got[0]),
                                        ("v", _block(j, rows, dv, 0.5), got[1])])
            report = _common.untouched(report, [("k", k, handed[0]), ("v", v, handed[1])])
            if not report["ok"]:
                report["lines"].insert(0, f"after rotation {s} of {n} this rank should hold rank {j}'s block "
                                          f"(rank r - {s}'s; k = 10000 x {j} + i at flat index i, v the same "
                                          f"+ 0.5):")
                report["lines"] += self.mistake(got, handed, rank, n, s, sends)
                return report
            moved = self.moved(sends, rank, n, s, handed)
            if moved:
                return {"ok": False, "lines": moved}
            k, v = got
            held.append(j)
        return {"ok": True, "lines": [f"after rotations 1 to {n} held the blocks of ranks "
                                      f"{', '.join(map(str, held))}  ok"]}

    def moved(self, sends, rank, n, s, handed):
        """Lines saying how rotation s's messages differ from the block sent once to rank r + 1, or []:
        blocks handed out from a store filled by one exchange with every rank arrive right, but every
        rank then holds all N blocks at once, the memory a ring exists to avoid."""
        size = sum(t.numel() * t.element_size() for t in handed)
        sent = sum(nbytes for _, nbytes in sends)
        peers = sorted({p for p, _ in sends})
        right = (rank + 1) % n
        if n == 1 or size == 0 or (peers == [right] and sent == size):
            return []
        where = f" to {_ranks(peers)}" if peers else ""
        return [f"after rotation {s} of {n} this rank holds the right block (rank {(rank - s) % n}'s), but "
                f"rotation {s} sent {sent} bytes in {len(sends)} message{'s' if len(sends) != 1 else ''}{where}",
                f"(a rotation sends the block it was handed, k and v, {size} bytes, once, to rank r + 1 = "
                f"{right}, and receives the next from rank r - 1: each rank holds one travelling block, "
                f"never all N)"]

    def mistake(self, got, handed, rank, n, s, sends):
        """Lines naming the likely mistake behind a wrong rotation."""
        lines = []
        got_k, got_v = got
        right = (rank + 1) % n
        peers = sorted({p for p, _ in sends})
        if n > 1 and peers and peers != [right]:
            lines.append(f"(rotation {s} sent {len(sends)} message{'s' if len(sends) != 1 else ''} to "
                         f"{_ranks(peers)}; the block goes to rank r + 1 = {right} only)")
        if isinstance(got_v, torch.Tensor) and isinstance(got_k, torch.Tensor) and got_v.shape != handed[1].shape \
                and got_v.shape == handed[0].shape:
            lines.append(f"(v came back shaped like k, {list(got_v.shape)}, not {list(handed[1].shape)}: v is a "
                         f"block of its own shape; receive it into torch.empty_like(v))")
            return lines
        if not (isinstance(got_k, torch.Tensor) and got_k.shape == handed[0].shape and got_k.numel()):
            return lines
        owners, fractions = _owners(got_k)
        if fractions == {0.5}:
            lines.append("(k holds values of a v block (x.5): k and v are swapped)")
        elif n > 2 and owners == [(rank + s) % n]:
            lines.append(f"(k holds rank {owners[0]}'s block, rank r + {s}'s: the blocks travel the wrong way "
                         f"round; send to rank r + 1 = {right}, receive from rank r - 1 = {(rank - 1) % n})")
        elif n > 1 and owners == [(rank - s + 1) % n] and torch.equal(got_k, handed[0]):
            lines.append("(k is the block this rank was handed: nothing was received into what it returns)")
        return lines

    def need(self, case, n):
        if n == 1:
            return None
        c = case["rows"] * (case["dk"] + case["dv"]) * 8
        return _common.Need(sent_bytes=n * c, sent_messages=2 * n,
                              ideal=f"N x {c} = {n * c} bytes in 2N = {2 * n} messages (at each of the N "
                                    f"rotations k and v once, {c} bytes, to rank r + 1)",
                              algorithm="N rotations of the ring", chapter=self.chapter)


def _ranks(ranks):
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"


def _largest(scores):
    """The largest score in size over these blocks (0 where they hold none)."""
    return max((float(s.abs().max()) for s in scores if s.numel()), default=0.0)


def _fold(o, m, l, s, v):
    """The grader's own merge of one block (the first of a run, which the learner's merge never sees)."""
    m_new = torch.maximum(m, s.amax(-1))
    p, fade = torch.exp(s - m_new.unsqueeze(-1)), torch.exp(m - m_new)
    return o * fade.unsqueeze(-1) + p @ v, m_new, l * fade + p.sum(-1)


def _close(want, have):
    return (isinstance(have, torch.Tensor) and have.shape == want.shape and have.dtype == want.dtype
            and bool(torch.allclose(have, want, rtol=1e-10, atol=1e-12)))


class RingAttentionMerge:
    local = True      # arithmetic on one rank's state: graded in the grader's own process, no world
    chapter = CP_CHAPTER
    # query rows R, keys in a block K, head width d, value width d_v; scale 60 puts the scores in the
    # thousands, where exp(s) overflows float64 (past 709) unless the running maximum comes off first
    SHAPES = [dict(rows=2, keys=2, d=3, dv=3), dict(rows=1, keys=1, d=1, dv=1),
              dict(rows=3, keys=3, d=4, dv=2, scale=60), dict(rows=0, keys=2, d=3, dv=3)]

    def blocks(self, case, n, seed):
        """The scores and values of n blocks; entries scaled by 3 (or 60) so the row maxima move."""
        g = torch.Generator().manual_seed(seed)
        scale = case.get("scale", 3)

        def draw(*shape):
            return scale * torch.randn(*shape, generator=g, dtype=torch.float64)
        q = draw(case["rows"], case["d"])
        scores = [q @ draw(case["keys"], case["d"]).T / math.sqrt(case["d"]) for _ in range(n)]
        return scores, [draw(case["keys"], case["dv"]) for _ in range(n)]

    def words(self, case, n, j, scores):
        first = " (block 1 folded in by the grader)" if n > 1 else ""
        return (f"after merging block {j + 1} of {n}{first} (R = {case['rows']} query rows, blocks of {case['keys']} "
                f"key{'s' if case['keys'] != 1 else ''}, v of width {case['dv']}; scores as large as "
                f"{_largest(scores[:j + 1]):.1f})")

    def grade(self, name, source, shown, quick=False, world_sizes=None):
        """(passed, reason, text)."""
        counts = world_sizes or ((1, 2, 3, 4) if quick else (1, 2, 3, 5))
        # the library's online softmax is the answer: off while the learner's function runs
        return _common.graded_here(
            name, source, shown, lambda fn: self.runs(fn, name, shown, counts, quick),
            "The library's online softmax is switched off while grading: write the merge yourself.",
            self.chapter)

    def runs(self, fn, name, shown, counts, quick):
        """(passed, reason, text) over runs of ``counts`` blocks: the first merge that cannot be compared
        (not written, raised, a changed input, a state of other shapes) stops grading; else the first
        wrong o / l over all runs is the verdict, then the first wrong m, then l."""
        first, merges = {}, 0    # what -> the first mismatch of o / l, of m, of l
        for salt, case in enumerate(self.SHAPES):
            if quick and case["rows"] == 1:
                continue
            for n in counts:
                scores, values = self.blocks(case, n, 100 * salt + n)
                o = torch.zeros(case["rows"], case["dv"], dtype=torch.float64)
                m = torch.full((case["rows"],), float("-inf"), dtype=torch.float64)
                l = torch.zeros(case["rows"], dtype=torch.float64)
                for j, (s, v) in enumerate(zip(scores, values)):
                    if j == 0 and n > 1:
                        # the grader folds the first block in itself: the merge must work from
                        # (o, m, l) alone, not from blocks it kept (it never sees this one)
                        o, m, l = _fold(o, m, l, s, v)
                        continue
                    where = self.words(case, n, j, scores)
                    got, failed = self.call(fn, name, shown, (o, m, l, s, v), where)
                    if failed:
                        return failed
                    merges += 1
                    seen_s, seen_v = torch.cat(scores[:j + 1], -1), torch.cat(values[:j + 1])
                    want_m = seen_s.amax(-1)
                    want = [("o / l", torch.softmax(seen_s, -1) @ seen_v), ("m", want_m),
                            ("l", torch.exp(seen_s - want_m.unsqueeze(-1)).sum(-1))]
                    before = (o, m, l, s, v)
                    o, m, l = got
                    for (what, expected), received in zip(want, (o / l.unsqueeze(-1), m, l)):
                        if what not in first and not _close(expected, received):
                            first[what] = (where, expected, received, self.mistake(what, received, before))
        for what in ("o / l", "m", "l"):    # the attention first: a state kept otherwise matters less
            if what in first:
                return False, "wrong", self.wrong_text(name, what, *first[what])
        return True, "pass", (f"PASS {name}: o / l equals torch's softmax attention over the blocks so far, "
                              f"m and l the running maximum and sum, after all {merges} merges (runs of "
                              f"{', '.join(map(str, counts))} blocks, scores up to the thousands).")

    def call(self, fn, name, shown, state, where):
        """(the new (o, m, l), None), or (None, the verdict) where the merge cannot be compared."""
        o, m, l, s, v = state
        handed = [t.clone() for t in state]
        try:
            got = fn(*handed)
        except NotImplementedError:
            return None, (False, "not_written", (f"NOT WRITTEN {name}: {shown} still raises NotImplementedError. "
                                                 f"Write its body, then grade it again."))
        except _routes.BuiltinUsed:
            raise
        except Exception:
            return None, (False, "crash", f"FAIL {name}: it raised {where}:\n{traceback.format_exc(limit=-2)}")
        if not (isinstance(got, (tuple, list)) and len(got) == 3 and all(isinstance(t, torch.Tensor) for t in got)):
            size = f" of {len(got)}" if isinstance(got, (tuple, list)) else ""
            return None, (False, "wrong", (f"FAIL {name}: returned {type(got).__name__}{size} {where}, not "
                                           f"(o, m, l): three tensors, the new state."))
        changed = [f"{what} held {_common.show(before)} before the call and {_common.show(now)} after"
                   for what, before, now in (("s", s, handed[3]), ("v", v, handed[4]))
                   if not (now.shape == before.shape and torch.equal(now, before))]
        if changed:
            return None, (False, "changed_input", (f"FAIL {name}: it changes its input {where}:\n  "
                                                   + "\n  ".join(changed) + "\ns and v are read, never written: in "
                                                   "step 3 the block travels on to the next rank after its merge, "
                                                   f"and the caller keeps what it computed. See {self.chapter}."))
        if [(t.shape, t.dtype) for t in got] != [(t.shape, t.dtype) for t in (o, m, l)]:
            found = ", ".join(f"{what} {_common.name_of(t.dtype)}{list(t.shape)}" for what, t in zip("oml", got))
            return None, (False, "wrong", (f"FAIL {name}: returned {found} {where}; the state is o "
                                           f"float64{list(o.shape)}, m and l float64{list(m.shape)} (one value "
                                           f"per query row: no keepdim), as handed in."))
        return got, None

    def wrong_text(self, name, what, where, expected, received, hint):
        lines = [f"FAIL {name}: {what} wrong {where}."]
        if expected.shape != received.shape or expected.dtype != received.dtype:
            lines.append(f"  expected {_common.name_of(expected.dtype)}{list(expected.shape)}, found "
                         f"{_common.name_of(received.dtype)}{list(received.shape)}")
        else:
            lines += [f"  expected {_common.show(expected)}", f"  received {_common.show(received)}"]
        meaning = {"o / l": "softmax attention over every block so far, torch.softmax(S, -1) @ V",
                   "m": "each row's largest score over every block so far",
                   "l": "the sum of exp(score - m) over every block so far"}[what]
        lines.append(f"({what} must be {meaning}.)")
        if hint:
            lines.append(hint)
        lines.append(f"The online softmax: {MERGE}. See {self.chapter}, \"The forward pass\".")
        return "\n".join(lines)

    def mistake(self, what, received, before):
        """The likely mistake behind a wrong o / l, m or l, in words, or None: ``received`` is
        compared with what the usual wrong merges make of the state and block ``before``."""
        if not isinstance(received, torch.Tensor) or not received.dtype.is_floating_point:
            return None
        o, m, l, s, v = before
        if what in ("o / l", "l") and not bool(torch.isfinite(received).all()):
            return (f"(inf or nan: exp of a score overflows float64 past 709.8, and this block's are as large as "
                    f"{_largest([s]):.1f}; exponentiate s - m', never s: with m' the running maximum every exp "
                    f"is at most 1)")
        m_new = torch.maximum(m, s.amax(-1))
        p, raw = torch.exp(s - m_new.unsqueeze(-1)), torch.exp(s)
        wrong = [((o + p @ v, l + p.sum(-1)),
                  "(this is the merge without its rescale: when a block raises a row's maximum from m to m', "
                  "what was summed under m is too large by exp(m' - m); multiply the old l and o by "
                  "exp(m - m') before adding the new block's terms)"),
                 ((o + raw @ v, l + raw.sum(-1)),
                  "(this adds exp(s), not exp(s - m'): the running sums are kept relative to the running "
                  "maximum, and exp(s) alone overflows float64 once a score passes 709)")]
        for (wrong_o, wrong_l), text in wrong:
            made = wrong_o / wrong_l.unsqueeze(-1) if what == "o / l" else wrong_l if what == "l" else None
            if made is not None and _close(made, received):
                return text
        if what == "m" and _close(s.amax(-1), received):
            return "(m is this block's maximum alone: the running maximum is torch.maximum(m, s.amax(-1)))"
        return None


CHECKS = {"pipeline_1f1b_order": Pipeline1F1BOrder(), "pipeline_1f1b_forward": Pipeline1F1BForward(),
          "fsdp_step_gather": FsdpStepGather(), "fsdp_step_reduce_scatter": FsdpStepReduceScatter(),
          "moe_dispatch_counts": MoeDispatchCounts(), "moe_dispatch_tokens": MoeDispatchTokens(),
          "ring_attention_rotate": RingAttentionRotate(), "ring_attention_merge": RingAttentionMerge()}
