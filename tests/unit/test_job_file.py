"""The job file's first pass (job_file.py) and the loader's values read from the file (job_view.py).

Every command that reads a job refuses a missing file, a TOML error or a [dataloader] mistake with TorchTitan's
reader's one line, before torch is imported; plan, inspect and where take the loader's values from a file that
states them all, and those values (and plan's ledger) are the ones TorchTitan's resolved config gives."""

import os
import subprocess
import sys

import pytest
from helpers import write_job

from zephon_titan.errors import EXIT_USER_ERROR
from zephon_titan.job_file import read_job_file
from zephon_titan.job_view import FileJob
from zephon_titan.plan import open_job, plan_eval_set, plan_ledger
from zephon_titan.titan.job import Job, load_job

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = os.path.join(REPO, "configs")

_GOOD = """
hf_assets_path = "tok"
[model]
module = "llama3"
config = "llama3_debugmodel"
[training]
seq_len = 32
global_batch_size = 16
local_batch_size = 2
[dataloader]
num_lanes = 8
[dataloader.sources.a]
paths = ["a.jsonl"]
"""

# (how the file is broken, its text (None: no file), the one line TorchTitan's reader gives for it).
_MISTAKES = {
    "missing": (None, "config file {path} does not exist"),
    "toml": (_GOOD + "[training\n", "config file {path} is not valid TOML: "),
    "typo": (
        _GOOD.replace("num_lanes", "num_lanse"),
        "job.toml: unknown key 'num_lanse' in [dataloader]; did you mean 'num_lanes'?",
    ),
}
_COMMANDS = {
    "validate": ["validate", "job.toml"],
    "plan": ["plan", "job.toml", "--steps", "2"],
    "inspect": ["inspect", "job.toml", "--step", "1"],
    "where": ["where", "job.toml", "--source", "a", "--match", "x"],
    "index": ["index", "job.toml"],
    "run": ["run", "job.toml"],
}
_PROBE = (
    "import sys\nfrom zephon_titan.cli import main\n"
    "status = main(sys.argv[1:])\n"
    "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'torchtitan'))\n"
    "print('HEAVY', ' '.join(heavy))\nsys.exit(status)"
)


@pytest.mark.parametrize("command", sorted(_COMMANDS))
@pytest.mark.parametrize("mistake", sorted(_MISTAKES))
def test_a_broken_job_file_is_one_line_before_torch_is_imported(tmp_path, command, mistake):
    text, message = _MISTAKES[mistake]
    if text is not None:
        (tmp_path / "job.toml").write_text(text)
    result = subprocess.run(
        [sys.executable, "-c", _PROBE, *_COMMANDS[command]], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == EXIT_USER_ERROR, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("zephon-titan: error: " + message.format(path=tmp_path / "job.toml"))
    assert result.stdout.split("HEAVY", 1)[1].split() == []  # neither torch nor TorchTitan was imported


def test_the_first_pass_gives_torchtitans_readers_message(tmp_path):
    """TorchTitan's reader starts from the first pass: the same line, whichever reads the file."""
    for text, _ in _MISTAKES.values():
        path = tmp_path / "job.toml"
        if text is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(text)
        with pytest.raises(Exception) as fast:
            read_job_file(str(path))
        with pytest.raises(Exception) as slow:
            load_job(str(path))
        assert str(fast.value) == str(slow.value) and type(fast.value) is type(slow.value)


def _job(tmp_path, corpus_dir, tokenizer_dir, name, training="steps = 5", **extra):
    return write_job(
        tmp_path / f"{name}.toml", corpus_dir, tokenizer_dir, seq_len=32, batch=8, training=training, **extra
    )


def _fixture_jobs(tmp_path, corpus_dir, tokenizer_dir) -> dict[str, str]:
    jobs = {
        "plain": _job(tmp_path, corpus_dir, tokenizer_dir, "plain"),
        "tokenizer_path": _job(
            tmp_path, corpus_dir, tokenizer_dir, "tokenizer_path", dataloader=f'tokenizer_path = "{tokenizer_dir}"'
        ),
        "best_fit_eval": _job(
            tmp_path,
            corpus_dir,
            tokenizer_dir,
            "best_fit_eval",
            dataloader='packing = "best_fit"\nadd_bos = false',
            source="eval_fraction = 0.2",
            validator="[validator]\nenable = true\nsteps = 2\n[validator.dataloader]\nnum_lanes = 2\nglobal_batch_size = 4\n",
        ),
        "pipeline": _job(
            tmp_path,
            corpus_dir,
            tokenizer_dir,
            "pipeline",
            training="steps = 5\ndisable_cuda_graphs = true",
            validator="[parallelism]\npipeline_parallel_degree = 2\npipeline_parallel_microbatch_size = 1\n",
        ),
    }
    # [job] extends: a variant that states only what differs (another global batch, lanes and seed).
    (tmp_path / "child.toml").write_text(
        '[job]\nextends = "plain.toml"\n[training]\nglobal_batch_size = 12\n[dataloader]\nseed = 9\nnum_lanes = 6\n'
    )
    jobs["extends"] = str(tmp_path / "child.toml")
    jobs["vocab"] = _job(tmp_path, corpus_dir, tokenizer_dir, "vocab")
    text = (tmp_path / "vocab.toml").read_text()
    model = 'config = "llama3_debugmodel"'
    (tmp_path / "vocab.toml").write_text(text.replace(model, model + "\nvocab_size = 4096"))
    return jobs


_VALUES = ("path", "data", "seq_len", "global_batch_size", "local_batch_size", "tokenizer_setting", "training_steps")
_VALUES += ("eval_data", "eval_global_batch_size", "eval_steps")


def test_the_file_gives_torchtitans_values_and_ledger(tmp_path, corpus_dir, tokenizer_dir):
    for name, path in _fixture_jobs(tmp_path, corpus_dir, tokenizer_dir).items():
        fast, slow = FileJob.of(read_job_file(path)), load_job(path)
        assert fast is not None, name
        assert [getattr(fast, k) for k in _VALUES] == [getattr(slow, k) for k in _VALUES], name
        # The model is the recipe's: the file states its vocabulary or leaves it to validate and run.
        assert fast.model_vocab_size in (None, slow.model_vocab_size), name
        assert fast.check_layout(1) == slow.check_layout(1), name
        assert list(plan_ledger(fast, 4)) == list(plan_ledger(slow, 4)), name
        if fast.eval_data.sources:
            assert plan_eval_set(fast) == plan_eval_set(slow), name
    assert (
        FileJob.of(read_job_file(_fixture_jobs(tmp_path, corpus_dir, tokenizer_dir)["vocab"])).model_vocab_size == 4096
    )


def test_configs_give_torchtitans_values():
    """The repository's jobs state every loader value: their file values are TorchTitan's (no data needed)."""
    paths = [os.path.join(CONFIGS, "debug_cpu.toml")]
    paths += [os.path.join(CONFIGS, "llama3_1b", f"{g}gpu.toml") for g in (8, 16, 32, 64)]
    for path in paths:
        fast, slow = FileJob.of(read_job_file(path), needs_steps=True), load_job(path)
        assert fast is not None, path
        assert [getattr(fast, k) for k in _VALUES] == [getattr(slow, k) for k in _VALUES], path


@pytest.mark.parametrize(
    "change",
    [
        lambda t: t.replace("seq_len = 32\n", ""),  # the recipe's seq_len
        lambda t: t.replace("local_batch_size = 2\n", ""),
        lambda t: t.replace('hf_assets_path = "tok"\n', ""),  # the recipe's tokenizer folder
        lambda t: t + "[tokenizer]\n",  # the trainer's tokenizer config
        lambda t: t + "[parallelism]\npipeline_parallel_degree = 2\n",  # the recipe's microbatch size
        lambda t: t.replace("seq_len = 32", 'seq_len = "32"'),  # a mistake TorchTitan's reader names
    ],
)
def test_a_value_left_to_the_recipe_goes_through_torchtitan(tmp_path, change):
    path = tmp_path / "job.toml"
    path.write_text(change(_GOOD))
    assert FileJob.of(read_job_file(str(path))) is None
    (tmp_path / "good.toml").write_text(_GOOD)
    assert FileJob.of(read_job_file(str(tmp_path / "good.toml"))) is not None
    assert FileJob.of(read_job_file(str(tmp_path / "good.toml")), needs_steps=True) is None  # no [training] steps


def test_open_job_takes_torchtitan_only_for_the_recipes_values(tmp_path, corpus_dir, tokenizer_dir):
    jobs = _fixture_jobs(tmp_path, corpus_dir, tokenizer_dir)
    assert isinstance(open_job(jobs["plain"]), FileJob)
    text = (tmp_path / "plain.toml").read_text().replace("local_batch_size = 2\n", "")
    (tmp_path / "recipe.toml").write_text(text)
    assert isinstance(open_job(str(tmp_path / "recipe.toml")), Job)
    # plan from the file imports no trainer and no model code (the tokenizer is TorchTitan's own class).
    probe = (
        "import sys\nfrom zephon_titan.plan import plan_ledger\n"
        f"print(len(list(plan_ledger({jobs['plain']!r}, 2))))\n"
        "print(sorted(m for m in sys.modules if m == 'torchtitan.trainer' or m.startswith('torchtitan.models')))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=300)
    assert out.stdout.split() == ["2", "[]"]
