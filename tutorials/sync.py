"""Keep the chapters honest: code shown is code on disk, output shown is output produced.

Two markers in the chapters, each followed by a fenced block::

    <!-- include: tutorials/demos/ch04_ring.py -->      block = the file, byte for byte
    <!-- output: python -m tutorials.demos.ch04_ring -->  block = what the command prints

Usage, from the repository root::

    python -m tutorials.sync            # rewrite every include block from its file
    python -m tutorials.sync --outputs  # also rerun every demo and rewrite its output block

``tests/test_tutorials.py`` uses the same functions to check that nothing drifted.
Demos with a ``demo(rank, world_size)`` function run together in one world
per world size (starting processes is the slow part); other commands run as
written, in a shell, with any ``--master-port`` replaced by a free port.
"""
import argparse
import importlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
INCLUDE = re.compile(r"<!-- include: (?P<path>\S+) -->\n```(?P<lang>\w*)\n(?P<body>.*?)```\n", re.S)
OUTPUT = re.compile(r"<!-- output: (?P<command>.+?) -->\n```text\n(?P<body>.*?)```\n", re.S)
DEMO_COMMAND = re.compile(r"python -m (tutorials\.demos\.\w+)")
PORT_FLAG = re.compile(r"(--master[-_]port[ =])\d+")


def chapters():
    return sorted(ROOT.glob("tutorials/[0-9][0-9]_*.md"))


def includes(text):
    """(path, shown code) for every include marker in a chapter's text."""
    return [(m["path"], m["body"]) for m in INCLUDE.finditer(text)]


def outputs(text):
    """(command, shown output) for every output marker in a chapter's text."""
    return [(m["command"], m["body"]) for m in OUTPUT.finditer(text)]


def shared_world_demo(command):
    """The demo function a command runs, if it can share a world with others; else None."""
    m = DEMO_COMMAND.fullmatch(command)
    if not m:
        return None
    module = importlib.import_module(m[1])
    return module if hasattr(module, "demo") else None


def start_shell(command):
    from collectives.tools.launch import free_port  # imports torch: only when a demo runs
    port = free_port()
    command = PORT_FLAG.sub(lambda m: m[1] + str(port), command)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    # The commands say `python` and `torchrun`: the ones beside this interpreter, so a suite
    # run as .venv/bin/python -m pytest, without activating, runs them in the same environment.
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    return subprocess.Popen(["bash", "-c", command], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)   # its own process group: a kill reaches every rank


def run_commands(commands, timeout=300, runner=None):
    """Run every command once; return {command: (rank 0's output, other ranks' output)}.

    Shell commands start first and run in the background while the shared
    worlds run here; several of them spend their time sleeping or waiting.
    ``runner(fn, world_size, *args, timeout=...)`` starts the shared worlds
    (default: the demos' own launcher; the tests pass their faster one).
    All of them share ``timeout`` seconds from the start; a command that runs past
    it is killed and named, with the end of what it printed, so a hang says where.
    """
    from tutorials.demos.common import capture, run
    runner = runner or run
    results, shell, worlds = {}, {}, {}
    started = time.monotonic()
    for command in dict.fromkeys(commands):
        module = shared_world_demo(command)
        if module is None:
            shell[command] = start_shell(command)
        else:
            worlds.setdefault(module.WORLD_SIZE, []).append((command, module.demo))
    try:
        for world_size, demos in sorted(worlds.items()):
            began = time.monotonic()
            left = max(30.0, started + timeout - began)
            per_rank = runner(capture, world_size, [fn for _, fn in demos], timeout=left)
            for i, (command, _) in enumerate(demos):
                results[command] = (per_rank[0][i], "".join(texts[i] for texts in per_rank[1:]))
            print(f"sync: {len(demos)} demos on {world_size} ranks: {time.monotonic() - began:.0f} s",
                  file=sys.stderr)
        for command, proc in shell.items():
            try:
                out, err = proc.communicate(timeout=max(1.0, started + timeout - time.monotonic()))
            except subprocess.TimeoutExpired:
                kill(proc)
                out, err = proc.communicate()
                raise RuntimeError(f"{command!r} still ran after {timeout} s (killed); it printed:\n"
                                   f"{out[-2000:]}\n--- stderr:\n{err[-3000:]}") from None
            if proc.returncode != 0:
                # the end of stderr: a launcher's timeout puts every unfinished rank's stacks there
                raise RuntimeError(f"{command!r} exited with {proc.returncode}:\n{err[-16000:]}")
            results[command] = (out, "")
        print(f"sync: {len(shell)} shell commands done at {time.monotonic() - started:.0f} s", file=sys.stderr)
    finally:
        for proc in shell.values():
            kill(proc)
    return results


def kill(proc):
    """Kill a shell command and whatever it started (its ranks run in the background)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def rewrite(path, with_outputs):
    text = path.read_text()
    text = INCLUDE.sub(lambda m: f"<!-- include: {m['path']} -->\n```{m['lang']}\n"
                                 f"{(ROOT / m['path']).read_text()}```\n", text)
    if with_outputs:
        produced = run_commands([c for c, _ in outputs(text)])
        text = OUTPUT.sub(lambda m: f"<!-- output: {m['command']} -->\n```text\n"
                                    f"{produced[m['command']][0]}```\n", text)
    if text != path.read_text():
        path.write_text(text)
        print(f"updated {path.relative_to(ROOT)}")


def main():
    parser = argparse.ArgumentParser(description="Rewrite the chapters' include and output blocks.")
    parser.add_argument("--outputs", action="store_true", help="rerun the demos and rewrite their outputs")
    parser.add_argument("chapters", nargs="*", help="chapter files (default: all)")
    args = parser.parse_args()
    for path in [Path(p).resolve() for p in args.chapters] or chapters():
        rewrite(path, args.outputs)


if __name__ == "__main__":
    sys.exit(main())
