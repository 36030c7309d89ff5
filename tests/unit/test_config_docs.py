"""docs/configuration.md is the config schema's (zephon_titan/config_docs.py), kept current."""

import os
import subprocess
import sys

from zephon_titan.config import DataConfig, PhaseConfig, SourceConfig, settings
from zephon_titan.config_docs import COMMAND, render

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_committed_configuration_page_is_current():
    with open(os.path.join(ROOT, "docs", "configuration.md"), encoding="utf-8") as f:
        committed = f.read()
    assert committed == render(), f"docs/configuration.md is out of date with config/; regenerate it: {COMMAND}"


def test_every_key_is_documented_with_its_docstring():
    page = render()
    for cls in (DataConfig, SourceConfig, PhaseConfig):
        for name in settings(cls):
            if (cls, name) != (SourceConfig, "name"):  # the table's name
                assert f"### `{name}`" in page, name
    assert "### `ledger`" in page and "a keyed hash of each\ndocument's file name" in page


def test_the_generator_imports_no_torch():
    code = "import sys, zephon_titan.config_docs as d; d.render(); print(sorted(m for m in sys.modules if m.startswith('torch')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"
