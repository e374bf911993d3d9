"""fsdp_step's ladder (issue 33, section 3): ``grade fsdp_step --step 1`` grades the gather of one
layer, ``--step 2`` the reduce-scatter of its gradients, ``--step 3`` fsdp_step itself. The layers
hold 25, 1 and 11 values, so on 2 and 3 ranks the padding matters."""
import pytest

from tests.test_exercises_ladder import told_why
from tutorials.exercises.grade import HERE, grade, main

SOLUTIONS, WRONG = HERE / "solutions", HERE / "wrong"

# (exercise, wrong file, world sizes that show the mistake, reason, words the verdict must contain)
WRONG_CASES = [
    ("fsdp_step_gather", "fsdp_step_gather_keeps_padding", (3,), "wrong",
     ["wrong result with 3 ranks, one float64 layer of shapes [5, 4], [5] (25 values) cut into 3 pieces",
      "tensors[1]: expected float64[5], found float64[7]",
      "the layer's 25 values padded with 2 zeros to N x k = 27, k = ceil(25 / 3) = 9",
      "tensors[1] ends with the 2 zeros of the padding", "full[:25]"]),
    ("fsdp_step_gather", "fsdp_step_gather_builtin", (2,), "builtin",
     ["it calls dist.all_gather (line 11 of fsdp_step_gather_builtin.py: dist.all_gather(pieces, shard))",
      "build fsdp_step_gather from point-to-point messages only"]),
    ("fsdp_step_reduce_scatter", "fsdp_step_reduce_scatter_sums", (3,), "wrong",
     ["rank 0: piece: expected [20, 23, 26, 22, 25, 21, 24, 20, ...] (9 values)",
      "received [60, 69, 78, 66, 75, 63, 72, 60, ...]",
      "exactly N = 3 times the expected value", "(divide by N)"]),
    ("fsdp_step_reduce_scatter", "fsdp_step_reduce_scatter_truncates", (2,), "wrong",
     ["piece: expected float64[13], found float64[12]",
      "a piece of numel // N = 12 values: cut that way, the last 1 value of the gradient belongs to no rank",
      "pad the flat gradient with N x k - numel = 1 zeros and cut pieces of k = 13"]),
]


@pytest.mark.parametrize("name,wrong,worlds,reason,words", WRONG_CASES, ids=[c[1] for c in WRONG_CASES])
def test_wrong_step_is_told_why(name, wrong, worlds, reason, words):
    told_why(name, wrong, worlds, reason, words)


@pytest.mark.parametrize("name,k", [("fsdp_step_gather", 1), ("fsdp_step_reduce_scatter", 2)])
def test_each_step_s_solution_passes_and_names_the_next_step(name, k):
    verdict = grade(name, str(SOLUTIONS / f"{name}.py"), quick=True, world_sizes=(1, 2, 3))
    assert verdict.passed, verdict.text
    assert "correct in all 6 cases on worlds of 1, 2, 3 ranks" in verdict.text      # 2 layers x 3 worlds
    assert verdict.text.endswith(f"Step {k} of 3 of fsdp_step done. Next: python -m tutorials.exercises.grade "
                                 f"fsdp_step --step {k + 1} ({['fsdp_step_reduce_scatter', 'fsdp_step'][k - 1]}).")


def test_the_padded_vector_itself_is_named(tmp_path):
    flat = tmp_path / "flat.py"
    flat.write_text("import torch\nimport torch.distributed as dist\n"
                    "from tutorials.exercises.solutions.all_gather import all_gather\n\n\n"
                    "def fsdp_step_gather(shard, shapes, group=None):\n"
                    "    full = torch.empty(shard.numel() * dist.get_world_size(), dtype=shard.dtype)\n"
                    "    all_gather(list(full.split(shard.numel())), shard)\n    return full\n")
    verdict = grade("fsdp_step_gather", str(flat), quick=True, world_sizes=(2,))
    assert verdict.reason == "wrong", verdict.text
    assert ("returned one tensor of 26 values, not a list of 2 tensors of shapes [5, 4], [5] (one per shape, "
            "in order)" in verdict.text)
    assert "that is the gathered flat vector itself (the layer's 25 values padded with 1 zero to N x k = 26" \
        in verdict.text


def test_steps_on_the_command_line(capsys):
    assert main(["fsdp_step", "--step", "2", "--worlds", "1"]) == 1     # the stub
    assert capsys.readouterr().out.startswith("NOT WRITTEN fsdp_step_reduce_scatter:")
    assert main(["--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("fsdp_step "))
    assert lines[at + 1].split()[:6] == ["--step", "1", "18", "*..", "15", "min"]
    assert "fsdp_step_gather: All-gather the pieces" in lines[at + 1]
    assert lines[at + 2].split()[:6] == ["--step", "2", "18", "**.", "20", "min"]
    assert "fsdp_step_reduce_scatter: Flatten and concatenate" in lines[at + 2]
