"""The package reads top to bottom: no import circle, and no module imports a layer above its own.

The import graph is built from the source (``ast``), every import counted, those inside
functions too. LAYERS lists the package from the ground up; a module may import its own
layer or those below. A new module must be given a layer here, or the test fails.
"""
import ast
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "collectives"

# From the ground up. A name ending in "/" is a sub-package (every module in it).
LAYERS = [
    ("algorithms", ["algorithms/"]),
    ("ground", ["errors", "reduce_ops", "settings"]),
    ("interfaces", ["door", "observers", "group", "flight_recorder", "shm"]),
    ("the real door", ["p2p_communications"]),
    ("around the door", ["desync", "engine", "tuning/"]),
    ("the call path", ["call", "api", "tensor_api", "p2p_api"]),
    ("built on the collectives", ["backend/", "parallel/", "tools/", "sim/"]),
    ("pictures of runs", ["viz/"]),
    ("applications", ["train/", "plan/", "__init__", "sim.cli", "sim.__main__", "viz.cli", "viz.__main__",
                      "viz.shots"]),
]


def module_name(path):
    rel = path.relative_to(PACKAGE).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def modules():
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def layer_of(name):
    for index, (_, members) in enumerate(LAYERS):   # a module named on its own outranks its folder
        if name in members:
            return index
    for index, (_, members) in enumerate(LAYERS):
        for m in members:
            if m.endswith("/"):
                if name == m[:-1] or name.startswith(m[:-1] + "."):
                    return index
            elif name == m:
                return index
    return None


def imports(name, path):
    """Package-internal modules ``name`` imports (resolved to module names)."""
    tree = ast.parse(path.read_text())
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    if name == "__init__":
        package = []
    found = set()
    known = modules()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("collectives."):
                    found.add(alias.name[len("collectives."):])
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - (node.level - 1)] if node.level > 1 else list(package)
                target = base + (node.module.split(".") if node.module else [])
            elif node.module and (node.module == "collectives" or node.module.startswith("collectives.")):
                target = node.module.split(".")[1:]
            else:
                continue
            stem = ".".join(target)
            for alias in node.names:
                child = f"{stem}.{alias.name}" if stem else alias.name
                found.add(child if child in known else stem or "__init__")
    return {m for m in found if m in known and m != name}


def graph():
    return {name: imports(name, path) for name, path in modules().items()}


def test_every_module_has_a_layer():
    missing = sorted(n for n in modules() if layer_of(n) is None)
    assert not missing, f"give these modules a layer in tests/test_layers.py: {missing}"


def test_no_module_imports_a_layer_above_its_own():
    upward = []
    for name, deps in graph().items():
        mine = layer_of(name)
        for dep in deps:
            theirs = layer_of(dep)
            if mine is not None and theirs is not None and theirs > mine:
                upward.append(f"{name} ({LAYERS[mine][0]}) imports {dep} ({LAYERS[theirs][0]})")
    assert not upward, "\n".join(upward)


def circles(g):
    """The import circles of the graph ``g`` ({module: modules it imports}), each as a path."""
    state, stack, found = {}, [], []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for dep in sorted(g.get(node, ())):
            if state.get(dep) == "open":
                found.append(stack[stack.index(dep):] + [dep])
            elif dep not in state:
                visit(dep)
        stack.pop()
        state[node] = "done"
    for node in sorted(g):
        if node not in state:
            visit(node)
    return found


def test_no_import_circle():
    found = circles(graph())
    assert not found, "import circles: " + "; ".join(" -> ".join(c) for c in found)


def test_the_checker_sees_an_upward_import(tmp_path, monkeypatch):
    """The test above can fail: a ground-floor module that imports the backend is caught."""
    fake = {"errors": {"backend.process_group"}, "backend.process_group": set()}
    monkeypatch.setattr(sys.modules[__name__], "graph", lambda: fake)
    with pytest.raises(AssertionError, match="errors .ground. imports backend.process_group"):
        test_no_module_imports_a_layer_above_its_own()


def test_only_settings_reads_collectives_variables():
    readers = []
    for name, path in modules().items():
        if name == "settings":
            continue
        text = path.read_text()
        if re.search(r"environ(\.get)?[\[(]\s*[\"']COLLECTIVES_", text) or \
                re.search(r"getenv\(\s*[\"']COLLECTIVES_", text):
            readers.append(name)
    assert not readers, f"read COLLECTIVES_* through collectives.settings instead: {readers}"


def test_readme_variable_table_matches_settings():
    from collectives import settings
    readme = (ROOT / "README.md").read_text()
    table = set(re.findall(r"^\| `(COLLECTIVES_[A-Z_]+|LOCAL_WORLD_SIZE)(?:=[^`]*)?` \|", readme, flags=re.M))
    assert table == set(settings.VARIABLES), (
        f"README's table of variables and collectives/settings.py differ: only in README "
        f"{sorted(table - set(settings.VARIABLES))}, only in settings {sorted(set(settings.VARIABLES) - table)}")


def test_only_the_door_calls_send_and_recv():
    """p2p_communications is the only module that calls a transport's send/recv (the backend
    passes the user's own point-to-point calls through to its private transport)."""
    callers = []
    for name, path in modules().items():
        if name in ("p2p_communications", "backend.process_group") or name.startswith("sim"):
            continue
        if re.search(r"\.(send|recv|isend|irecv)\(\s*\[", path.read_text()) or \
                re.search(r"dist\.(send|recv|isend|irecv|batch_isend_irecv)\(", path.read_text()):
            callers.append(name)
    assert not callers, f"only the door may call send/recv: {callers}"


def test_the_real_door_implements_the_interface():
    from collectives.door import Door, Pending
    from collectives.p2p_communications import Comm
    from collectives.p2p_communications import Pending as RealPending
    assert Door in Comm.__mro__          # declared, not only duck-typed
    for name in ("post", "exchange", "send", "recv", "sendrecv"):
        assert callable(getattr(Comm, name)), name
    assert callable(RealPending.wait) and hasattr(Pending, "wait")
