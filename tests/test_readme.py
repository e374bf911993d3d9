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
