"""``python -m collectives.viz.shots [FOLDER]``: the course's pages and a PNG of each
(``tutorials/figures/viz_*.png``, for readers who do not open the pages), taken with the
system's headless Chromium."""
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from . import model, record, render, schedules

PAGES = {   # file stem -> how to build it (chapter)
    "viz_ring_allreduce_8": lambda: model.build(record.record("all_reduce", "ring", 8)),            # 4
    "viz_recursive_doubling_8": lambda: model.build(record.record("all_reduce", "recursive_doubling", 8)),  # 5
    "viz_ring_64_h100": lambda: model.build(record.record("all_reduce", "ring", 64, "h100-cluster")),  # 14
    "viz_pipeline_1f1b": lambda: schedules.pipeline(4, 8, "1f1b"),                                  # 16
    "viz_pipeline_gpipe": lambda: schedules.pipeline(4, 8, "gpipe"),                                # 16
    "viz_grade_all_reduce_deadlock": lambda: _deadlocked_exercise(),                                # 4
    "viz_ring_64_torus": lambda: model.build(record.record("all_reduce", "ring", 64, "torus")),      # 14
}
FRAMES = {"viz_grade_all_reduce_deadlock": "end", "viz_ring_64_torus": "end"}   # the frame shown (default 3)
HEIGHTS = {"viz_ring_64_torus": 1250}     # tall enough to show the topology view (default 900)


def _deadlocked_exercise():
    """Chapter 4's exercise with a blocking send first on every rank (tutorials/exercises/wrong/),
    drawn as the grader's --html draws it: 4 real processes, torch's calls through our door."""
    from pathlib import Path

    from tutorials.exercises._common import load
    wrong = Path(__file__).resolve().parents[2] / "tutorials" / "exercises" / "wrong" / "all_reduce_deadlock.py"
    return model.build(record.record_real("all_reduce", load("all_reduce", str(wrong)), 4, hang=3, calls="torch"))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    out = Path(argv[0] if argv else "tutorials/figures")
    browser = shutil.which("chromium") or shutil.which("google-chrome")
    if browser is None:
        print("collectives.viz.shots: no chromium on PATH (apt-get install chromium)", file=sys.stderr)
        return 2
    for stem, build in PAGES.items():
        with tempfile.TemporaryDirectory() as tmp:
            page = render.write(build(), Path(tmp) / f"{stem}.html")
            subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                            "--disable-background-networking", "--disable-component-update", "--disable-sync",
                            f"--user-data-dir={tmp}/profile", f"--window-size=1280,{HEIGHTS.get(stem, 900)}", "--hide-scrollbars",
                            f"--screenshot={out / (stem + '.png')}", f"file://{page}#frame={FRAMES.get(stem, 3)}"],
                           capture_output=True, timeout=120, check=True)
        png = out / (stem + ".png")
        if png.stat().st_size > 180_000:     # the course keeps figures under 200 KB: fewer colours
            from PIL import Image
            Image.open(png).convert("RGB").quantize(colors=64).save(png, optimize=True)
        print(f"wrote {png} ({png.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
