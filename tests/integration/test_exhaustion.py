"""Under a non-repeating policy lanes run out at different steps; every rank must stop at the same one."""

import os
import re

import pytest
from conftest import CPU_CONFIG, check, ledger, torchrun

from zephon_titan.plan import plan_ledger

pytestmark = pytest.mark.integration


@pytest.mark.slow  # 16 s of torchrun; the gate keeps finite lanes in process (test_stream.py, test_packing.py)
def test_every_rank_stops_at_the_same_step_and_the_plan_agrees(workdir, monkeypatch):
    config = os.path.join(workdir, "finite.toml")
    with open(CPU_CONFIG) as f:
        text = f.read().replace("seed = 2026", 'seed = 2026\nexhaustion = "redistribute"')
    with open(config, "w") as f:
        f.write(text)
    args = ["--job.config_file", config, "--steps", "100000", "--ledger", "data/finite.jsonl"]
    result = check(torchrun(workdir, "zephon_titan.titan.data_run", 2, args))
    stops = re.findall(r"rank (\d) stopped after step (\d+): data exhausted", result.stdout)
    assert sorted(r for r, _ in stops) == ["0", "1"] and len({s for _, s in stops}) == 1, result.stdout
    last = int(stops[0][1])
    got = ledger(os.path.join(workdir, "data/finite.jsonl"))
    assert sorted(got) == list(range(1, last + 1)) and last > 10
    monkeypatch.chdir(workdir)
    planned = {e.step: e.sha256 for e in plan_ledger(config, 100000)}
    assert planned == got  # the offline plan stops at the same step
