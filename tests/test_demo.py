"""The README and docs/ as a new user meets them: the demo, then every CPU command block, as written (the
README's "Look inside", docs/validation.md's run, docs/changing-a-run.md's new global batch size); the
README's starter job and GPU jobs resolve as the trainer would."""

import os
import re
import shlex
import subprocess
import sys

import demo
import pytest

from zephon_titan.errors import ConfigError

pytestmark = pytest.mark.integration

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def readme_blocks(page: str = "README.md", language: str = "bash") -> list[str]:
    with open(os.path.join(REPO, page), encoding="utf-8") as f:
        return re.findall(rf"```{language}\n(.*?)```", f.read(), flags=re.S)


def block_run_as_written(page: str) -> str:
    """The blocks of `page` that say this file runs them as written, in page order, as one script."""
    blocks = [b for b in readme_blocks(page) if "tests/test_demo.py runs this block as written" in b]
    assert blocks, f"{page} has no block marked as run as written"
    return "\n".join(blocks)


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

    block = block_run_as_written("README.md")
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
    jobs = {path: load_job(os.path.join(REPO, path)) for path in gpu}
    assert all(job.data.num_lanes == 64 for job in jobs.values())
    # Each launch starts as many processes as its job's parallelism takes (nodes x processes per node).
    launches = [argv for block in readme_blocks() for argv in commands(block) if argv[:2] == ["zephon-titan", "run"]]
    gpu_launches = [argv for argv in launches if argv[-1] in jobs]
    assert len(gpu_launches) == 3
    for argv in gpu_launches:
        options = dict(zip(argv[2::2], argv[3::2]))
        parallelism = jobs[argv[-1]].config.parallelism
        degrees = parallelism.data_parallel_replicate_degree * parallelism.data_parallel_shard_degree
        assert int(options.get("--nnodes", 1)) * int(options["--nproc"]) == degrees, argv


def test_each_shipped_job_has_its_own_dump_folder():
    # Two jobs writing one folder resume each other's checkpoints; the GPU family shares one on purpose.
    from zephon_titan.titan.job import load_job

    cpu = sorted(name for name in os.listdir(os.path.join(REPO, "configs")) if name.endswith(".toml"))
    folders = [load_job(os.path.join(REPO, "configs", name)).config.dump_folder for name in cpu]
    assert len(cpu) >= 2 and len(set(folders)) == len(folders), dict(zip(cpu, folders))


@pytest.mark.slow  # after the demo (its corpus); two CPU trainer runs
@pytest.mark.parametrize("page", ["docs/validation.md", "docs/changing-a-run.md"])
def test_the_cpu_blocks_of_the_docs_run_as_written(repo_copy, page):
    assert os.path.exists(repo_copy / "demo_out" / "tokenizer"), "run the demo first"
    bin_dir = os.path.dirname(sys.executable)  # torchrun and zephon-titan of this environment, as after `activate`
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block_run_as_written(page)],
        cwd=repo_copy,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, f"{page}: {done.stdout[-3000:]}{done.stderr[-3000:]}"


def test_the_starter_job_resolves_and_fits_the_sizes_it_names(tmp_path):
    from zephon_titan.titan.job import load_job

    (toml,) = [b for b in readme_blocks(language="toml") if "[dataloader.sources." in b]
    path = tmp_path / "my_job.toml"
    path.write_text(toml)
    job = load_job(str(path))  # the trainer's resolver: every key known, every value typed
    assert job.model_vocab_size == 50304 and [s.name for s in job.data.sources] == ["code", "web"]
    (commands_block,) = [b for b in readme_blocks() if "my_job.toml --world-sizes" in b]
    sizes = re.search(r"--world-sizes ([\d,]+)", commands_block).group(1)
    for size in map(int, sizes.split(",")):
        job.check_layout(size)  # the sizes the README names fit the job's lanes and batches
    with pytest.raises(ConfigError):
        job.check_layout(3)  # and the check can fail
