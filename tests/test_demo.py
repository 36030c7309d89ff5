"""The README as a new user meets it: the demo, then every command of the "Look inside" block, as written."""

import os
import re
import shlex

import demo
import pytest

pytestmark = pytest.mark.integration

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def readme_blocks() -> list[str]:
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        return re.findall(r"```bash\n(.*?)```", f.read(), flags=re.S)


def commands(block: str) -> list[str]:
    """The block's commands: comments dropped, continuation lines joined."""
    joined = block.replace("\\\n", " ")
    return [shlex.split(line, comments=True) for line in joined.splitlines() if shlex.split(line, comments=True)]


@pytest.fixture(scope="module")
def repo_copy(tmp_path_factory):
    """A working directory laid out like the repository (configs/), where the demo has run with its defaults."""
    root = tmp_path_factory.mktemp("readme")
    os.symlink(os.path.join(REPO, "configs"), root / "configs")
    return root


@pytest.mark.slow  # the README's demo, end to end (~1 min); .ci/run runs it
def test_demo_trains_resumes_and_checks_itself(repo_copy, monkeypatch, capsys):
    monkeypatch.chdir(repo_copy)  # the demo writes ./demo_out
    assert demo.main([]) == 0  # 6 steps, resumed at step 2, as `bash scripts/demo.sh` runs it
    out = capsys.readouterr().out
    assert "every global batch of every run is SHA-256-identical to the offline plan" in out
    assert out.count("same loss") == 6 + 4 + 4  # steps 1-6 on 2 ranks, 3-6 resumed on 4 and on 1


@pytest.mark.slow  # after the demo (it reads the demo's runs)
def test_every_command_of_the_look_inside_block_runs_as_written(repo_copy, monkeypatch):
    from zephon_titan.cli import main

    (block,) = [b for b in readme_blocks() if "zephon-titan validate" in b]
    assert os.path.exists(repo_copy / "demo_out" / "runs" / "w2" / "checkpoint" / "ledger.jsonl"), "run the demo first"
    monkeypatch.chdir(repo_copy)
    ran = 0
    for argv in commands(block):
        # `zephon-titan` is cli.main: called in this process (a subprocess would only add torch's import time).
        assert argv[0] == "zephon-titan", f"not a zephon-titan command: {argv}"
        assert main(argv[1:]) == 0, " ".join(argv)
        ran += 1
    assert ran >= 8


def test_the_gpu_blocks_name_real_configs():
    # The GPU commands cannot run here; every job file they name exists and resolves as the trainer would.
    from zephon_titan.titan.job import load_job

    gpu = sorted({path for block in readme_blocks() for path in re.findall(r"configs/llama3_1b/\w+\.toml", block)})
    assert gpu, "the README shows GPU jobs"
    for path in gpu:
        assert load_job(os.path.join(REPO, path)).data.num_lanes == 64
