"""One self-contained HTML file: the page's script and style inline, the run as JSON inside it."""
import json
import math
from pathlib import Path

TEMPLATE = Path(__file__).with_name("page.html")
MAX_PAGE_BYTES = 2 << 20      # the bound for N <= 64


def _clean(x):
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def html(data):
    """The page for ``data`` (from :func:`collectives.viz.model.build` or a schedule), as text."""
    text = json.dumps(_clean(data), separators=(",", ":"))
    # inside <script>, "</" could end the element early: JSON allows "<\/" for it
    text = text.replace("</", "<\\/")
    page = TEMPLATE.read_text()
    title = str(data.get("title", "collectives")).replace("&", "&amp;").replace("<", "&lt;")
    return page.replace("__TITLE__", title).replace("__DATA__", text)


def write(data, path):
    text = html(data)
    Path(path).write_text(text, encoding="utf-8")
    return Path(path)
