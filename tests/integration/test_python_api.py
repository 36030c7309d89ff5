"""docs/python.md's examples run as written (in order, in one namespace), from a folder laid out as the
repository's root after the demo built its data: the loader in a user's own loop, a state saved on 1 rank
resumed on 2 with the same global batch (the page asserts it), and the plan as a function."""

import os
import re
import shutil

from conftest import REPO


def test_the_python_page_runs_as_written(workdir, tmp_path, monkeypatch, capsys):
    page = open(os.path.join(REPO, "docs", "python.md"), encoding="utf-8").read()
    blocks = re.findall(r"```python\n(.*?)```", page, re.S)
    assert len(blocks) == 3
    shutil.copytree(os.path.join(REPO, "configs"), tmp_path / "configs")
    os.symlink(os.path.join(workdir, "demo_out"), tmp_path / "demo_out")
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, "docs/python.md", "exec"), namespace)
    printed = capsys.readouterr().out.splitlines()
    # Steps 1-3 of the loop, then the plan's 4 steps; the resumed step 4 was asserted by the page itself.
    assert [line.split()[0] for line in printed] == ["1", "2", "3", "1", "2", "3", "4"], printed
    assert namespace["step"].number == 4 and namespace["resumed"]
    # The plan's step 4 is the resumed global batch's: its SHA-256 (the ledger's digest of the same rows).
    from zephon_titan.engine import batch_digest, lane_digest

    loader = namespace["uninterrupted"]
    rows, per_lane = namespace["step"].rows, len(namespace["step"].rows) // loader.spec.num_lanes
    lanes = [lane_digest(rows[i : i + per_lane]) for i in range(0, len(rows), per_lane)]
    assert batch_digest(lanes) == namespace["entry"].sha256
    for name in ("loader", "uninterrupted", *(f"ranks[{i}]" for i in range(2))):
        eval(name, namespace).close()
