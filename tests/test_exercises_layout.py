"""The grader's modules read top to bottom: the checks have one registry (``_checks``) that no
check imports back, one file per family of exercises, and no import circle, those inside
functions counted (issue 33, "the house of the exercises")."""
import ast
from pathlib import Path

from tests.test_layers import circles

HERE = Path(__file__).resolve().parent.parent / "tutorials" / "exercises"
PREFIX = "tutorials.exercises."


def graph():
    """{module: the tutorials.exercises modules it imports}, from the source."""
    names = {p.stem for p in HERE.glob("*.py")}
    g = {}
    for path in HERE.glob("*.py"):
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                module = node.module if not node.level else PREFIX + node.module
                if module == PREFIX[:-1]:
                    found |= {a.name for a in node.names if a.name in names}
                elif module.startswith(PREFIX):
                    found.add(module[len(PREFIX):].split(".")[0])
            elif isinstance(node, ast.Import):
                found |= {a.name[len(PREFIX):].split(".")[0] for a in node.names if a.name.startswith(PREFIX)}
        g[path.stem] = {m for m in found if m in names and m != path.stem}
    return g


def test_no_import_circle_among_the_graders_modules():
    found = circles(graph())
    assert not found, "import circles: " + "; ".join(" -> ".join(c) for c in found)


def test_only_the_worker_and_the_grader_read_the_registry():
    readers = sorted(m for m, deps in graph().items() if "_checks" in deps)
    assert set(readers) <= {"_worker", "grade", "__init__"}, f"the registry is imported back by {readers}"


def test_the_circle_finder_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
