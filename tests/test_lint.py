"""Lint, format and types are part of the test suite, so the README's one test command checks them too."""

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)


@pytest.mark.parametrize(
    "command",
    [["ruff", "check", "."], ["ruff", "format", "--check", "."], ["mypy"]],
    ids=["ruff-check", "ruff-format", "mypy"],
)
def test_clean(command):
    tool = os.path.join(BIN, command[0])
    if not os.path.exists(tool):
        pytest.fail(f"{command[0]} is not installed; install the test extras: pip install -e '.[test]'")
    result = subprocess.run([tool, *command[1:]], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
