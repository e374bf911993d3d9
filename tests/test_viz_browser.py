"""collectives.viz pages in a real browser (Debian's headless Chromium): the counters the page
shows at each step equal the run's own counts, a deadlock page shows its cycle, a screenshot
is not blank. Skipped, in one line, where no Chromium is installed (.ci/run installs it)."""
import contextlib
import html as _html
import re
import shutil
import subprocess
import tempfile

import pytest

from collectives import observers
from collectives.viz import model, record, render, schedules

BROWSER = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
pytestmark = pytest.mark.skipif(BROWSER is None, reason="no Chromium (apt-get install chromium)")


def chromium(*args):
    with tempfile.TemporaryDirectory() as profile:
        out = subprocess.run([BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                              "--no-first-run", "--disable-background-networking", "--disable-component-update",
                              "--disable-sync", f"--user-data-dir={profile}", *args],
                             capture_output=True, text=True, timeout=120)
    return out.stdout


def table(dom, name):
    body = re.search(rf'<table id="{name}">.*?<tbody>(.*?)</tbody>', dom, re.S).group(1)
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", body, re.S)
    return [[_html.unescape(c) for c in re.findall(r"<td>(.*?)</td>", row, re.S)] for row in rows]


def test_the_counters_shown_at_each_step_are_the_runs(tmp_path):
    n = 5
    with contextlib.ExitStack() as stack:
        counters = [stack.enter_context(observers.count_traffic(rank=r)) for r in range(n)]
        d = model.build(record.record("all_reduce", "rabenseifner", n))
    path = render.write(d, tmp_path / "page.html")
    last = len(d["steps"])
    for frame in sorted({0, last // 2, last}):
        dom = chromium("--dump-dom", f"file://{path}#frame={frame}")
        assert f'data-frame="{frame}"' in dom
        shown = [[int(x) for x in row[1:]] for row in table(dom, "counters")]
        want = [[sum(m[3] for m in d["msgs"] if m[0] == r and m[2] <= frame),
                 sum(m[3] for m in d["msgs"] if m[1] == r and m[2] <= frame),
                 sum(1 for m in d["msgs"] if m[0] == r and m[2] <= frame),
                 sum(1 for m in d["msgs"] if m[1] == r and m[2] <= frame)] for r in range(n)]
        assert shown == want
        if frame == last:
            assert shown == [[c.sent_bytes, c.recv_bytes, c.sent_messages, c.recv_messages] for c in counters]
            links = table(dom, "links")
            assert [int(row[1]) for row in links] == [sum(m[3] for m in d["msgs"] if i in m[10])
                                                      for i in range(len(d["links"]))]


def test_a_deadlock_page_shows_the_cycle(tmp_path):
    from tests.test_viz import deadlocking
    d = model.build(record.record("all_reduce", deadlocking, 4))
    path = render.write(d, tmp_path / "dead.html")
    dom = chromium("--dump-dom", f"file://{path}")
    banner = re.search(r'<div class="banner dead" id="deadlock">(.*?)</div>', dom, re.S).group(1)
    assert "send-send cycle: 0 \u2192 1 \u2192 2 \u2192 3 \u2192 0" in _html.unescape(banner)
    assert "frozen" in dom


@pytest.mark.parametrize("build", [lambda: model.build(record.record("all_reduce", "ring", 8)),
                                   lambda: schedules.pipeline(4, 8, "1f1b")], ids=["ring", "1f1b"])
def test_a_screenshot_is_not_blank(tmp_path, build):
    import matplotlib.image
    path = render.write(build(), tmp_path / "page.html")
    chromium("--window-size=1200,900", f"--screenshot={tmp_path / 'shot.png'}", f"file://{path}#frame=2")
    img = matplotlib.image.imread(tmp_path / "shot.png")[..., :3]
    assert img.shape[0] == 900
    colours = {tuple((px * 255).astype(int)) for px in img[::7, ::7].reshape(-1, 3)}
    assert len(colours) > 50          # chunks in many colours, not one background
