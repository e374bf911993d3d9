"""README's code is the code on disk, its output is what the code prints, and CI runs its test command."""
import re
import subprocess
import sys

from tutorials import sync

README = (sync.ROOT / "README.md").read_text()


def test_readme_code_is_the_file_on_disk():
    shown = sync.includes(README)
    assert shown, "README includes no file"
    for path, body in shown:
        assert body == (sync.ROOT / path).read_text(), f"README's block for {path} differs from the file"


def test_readme_quickstart_prints_what_readme_shows():
    [(command, expected)] = sync.outputs(README)
    program, *args = command.split()
    assert program == "python"
    run = subprocess.run([sys.executable, *args], cwd=sync.ROOT, capture_output=True, text=True,
                         timeout=180)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout == expected


def test_ci_runs_the_readme_test_command():
    commands = re.findall(r"```bash\n(.*?)\n```", README, re.S)
    assert len(commands) == 2, "README gives exactly two commands: install+train, and test"
    ci = (sync.ROOT / ".ci" / "run").read_text().strip().splitlines()
    runs = [line for line in ci if "pytest" in line and not line.lstrip().startswith("#")]
    assert runs == [commands[1]], ".ci/run must run the tests through README's test command, exactly"
    calls = [line for line in ci if re.search(r"\bsuite\b(?!\(\))", line)]
    assert len(calls) == 2, ".ci/run runs the suite twice: newest torch and the floor"
    assert commands[0].startswith("pip install -e . && python -m collectives.train")


def test_ci_floor_is_pyprojects_lower_bound():
    """The floor .ci/run tests is the one pyproject.toml declares (and README names)."""
    ci = (sync.ROOT / ".ci" / "run").read_text()
    pyproject = (sync.ROOT / "pyproject.toml").read_text()
    pinned = dict(re.findall(r"(torch|torchvision)==([\d.]+)", re.search(r'FLOOR="([^"]+)"', ci)[1]))
    declared = dict(re.findall(r'"(torch|torchvision)>=([\d.]+)"', pyproject))
    assert set(pinned) == set(declared) == {"torch", "torchvision"}
    for name, version in pinned.items():
        assert version.startswith(declared[name]), f"{name}: .ci/run pins {version}, pyproject says >={declared[name]}"
        assert f"{name} {version}" in README, f"README does not name the floor {name} {version}"
