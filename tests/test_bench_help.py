"""collectives-bench --help and collectives-tune --help: every default once, no reST markup (issue 33)."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("module", ["benchmarks.sweep", "benchmarks.tune"])
def test_help_states_each_default_once_without_backticks(module):
    text = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, check=True).stdout
    assert "`" not in text, text
    options = re.split(r"\n  (?=-)", " ".join(text.split("\n  -", 1)[1:]).join(["\n  -", ""]))
    for option in options:
        flat = " ".join(option.split())
        assert len(re.findall(r"\(default", flat)) <= 1, flat
        assert "(default: None)" not in flat and "(default: False)" not in flat, flat


def test_training_doc_documents_compression():
    doc = (ROOT / "docs" / "training.md").read_text()
    assert "--compression" in doc and "--powersgd-rank" in doc
