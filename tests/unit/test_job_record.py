"""A job's remembered resolution (job_record.py): `validate` (and plan, inspect, where when the file leaves values
to the recipe) answer from a record instead of importing TorchTitan, with the very values and output of the full
resolution; a record is never used once the job, the recipe's source or a version changed."""

import os
import subprocess
import sys

import pytest
from helpers import write_job

from zephon_titan.cli import main
from zephon_titan.job_file import read_job_file
from zephon_titan.job_record import DERIVED, FIELDS, recall, remember
from zephon_titan.titan.job import load_job

# Jobs that differ in what the resolution answers: the recipe's model, an eval set, pipeline microbatches, a
# seq_len schedule (CUDA graphs off), context parallelism, a resized vocabulary, the recipe's own seq_len and steps.
_VARIANTS = {
    "plain": {},
    "eval": {
        "source": "eval_fraction = 0.2",
        "validator": "[validator]\nenable = true\nfreq = 3\nsteps = 2\n[validator.dataloader]\nglobal_batch_size = 8",
    },
    "pipeline": {
        "training": "disable_cuda_graphs = true",
        "validator": "[parallelism]\npipeline_parallel_degree = 2\npipeline_parallel_microbatch_size = 1",
    },
    "schedule": {
        "training": "steps = 6\ndisable_cuda_graphs = true",
        "validator": "[parallelism]\ncontext_parallel_degree = 2\n"
        + "".join(
            f"[[dataloader.phases]]\nstart_step = {start}\nweights = {{ code = 0.5, prose = 0.5 }}\n{extra}\n"
            for start, extra in ((1, ""), (3, "seq_len = 32"))
        ),
    },
    "vocab": {"validator": "[model]\nvocab_size = 4096"},
}


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ZEPHON_TITAN_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "jobs"


def _job(tmp_path, corpus_dir, tokenizer_dir, variant: str) -> str:
    extra = dict(_VARIANTS[variant])
    path = write_job(tmp_path / f"{variant}.toml", corpus_dir, tokenizer_dir, **extra)
    if variant == "schedule":  # the phases hold the weights
        text = open(path).read()
        open(path, "w").write(text.replace("weight = 0.4\n", "").replace("weight = 0.6\n", ""))
    if variant == "vocab":  # [model] is the job's own table: the extra one goes into it
        text = open(path).read().replace("[model]\nvocab_size = 4096", "")
        open(path, "w").write(
            text.replace('config = "llama3_debugmodel"', 'config = "llama3_debugmodel"\nvocab_size = 4096')
        )
    return path


def _validate(path: str, capsys) -> str:
    assert main(["validate", path, "--no-count"]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("variant", sorted(_VARIANTS))
def test_a_record_gives_back_the_full_resolution(tmp_path, corpus_dir, tokenizer_dir, capsys, monkeypatch, variant):
    path = _job(tmp_path, corpus_dir, tokenizer_dir, variant)
    monkeypatch.setenv("ZEPHON_TITAN_CACHE", "off")
    full_output = _validate(path, capsys)
    file, full = read_job_file(path), load_job(path)
    assert recall(file) is None  # records off: none written, none read
    monkeypatch.setenv("ZEPHON_TITAN_CACHE", str(tmp_path / "cache"))
    assert recall(file) is None
    remember(file, full)
    recorded = recall(file)
    assert recorded is not None
    for name in FIELDS + DERIVED:
        assert getattr(recorded, name) == getattr(full, name), name
    assert _validate(path, capsys) == full_output  # from the record: the same report, line for line


def test_a_record_is_keyed_by_the_job(tmp_path, corpus_dir, tokenizer_dir, cache):
    path = _job(tmp_path, corpus_dir, tokenizer_dir, "plain")
    file = read_job_file(path)
    remember(file, load_job(path))
    assert recall(file) is not None and len(os.listdir(cache)) == 1
    # Any table of the job, TorchTitan's included, is another job; the control above recalls the unchanged one.
    text = open(path).read()
    open(path, "w").write(text.replace("[training]\n", "[training]\nsteps = 3\n"))
    assert recall(read_job_file(path)) is None
    # A record of another layout or a torn one is not read.
    (record,) = cache.iterdir()
    open(path, "w").write(text)
    record.write_text(record.read_text()[:-10])
    assert recall(read_job_file(path)) is None


def test_a_job_that_does_not_resolve_is_not_recorded(tmp_path, corpus_dir, tokenizer_dir, capsys, cache):
    path = write_job(tmp_path / "job.toml", corpus_dir, tokenizer_dir, training="warmup_step = 2")
    for _ in range(2):  # the second time too: TorchTitan's reader names the key
        assert main(["validate", path, "--no-count"]) != 0
        assert "unknown key 'warmup_step' in [training]" in capsys.readouterr().err
    assert not cache.exists() or not list(cache.iterdir())


_RECIPE = """from torchtitan.models.llama3.config_registry import llama3_debugmodel


def short():
    config = llama3_debugmodel()
    config.training.seq_len = {seq_len}
    config.training.local_batch_size = 2
    config.training.global_batch_size = 16
    return config
"""
_PROBE = (
    "import sys\nfrom zephon_titan.cli import main\nstatus = main(sys.argv[1:])\n"
    "print('TORCHTITAN', 'torchtitan.trainer' in sys.modules)\nsys.exit(status)"
)


@pytest.mark.slow  # three validate processes (~17 s): the gate keeps the in-process checks above
def test_a_changed_recipe_is_resolved_again(tmp_path, corpus_dir, tokenizer_dir):
    """A user's recipe module (the job states no seq_len or batch sizes: plan reads them from the recipe too).
    The first validate resolves and records, the second reads the record without importing TorchTitan's trainer; after the
    recipe changes, the record is not used and the new value is reported (a stale record would say 48)."""
    (tmp_path / "my_recipes.py").write_text(_RECIPE.format(seq_len=48))
    path = write_job(tmp_path / "job.toml", corpus_dir, tokenizer_dir)
    text = open(path).read()
    for line in ("seq_len = 64\n", "global_batch_size = 16\n", "local_batch_size = 2\n"):
        text = text.replace(line, "", 1)
    text = text.replace('module = "llama3"\nconfig = "llama3_debugmodel"', 'module = "my_recipes"\nconfig = "short"')
    open(path, "w").write(text)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}

    def validate() -> tuple[str, bool]:
        run = subprocess.run(
            [sys.executable, "-c", _PROBE, "validate", path, "--no-count"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        report, probe = run.stdout.rsplit("TORCHTITAN ", 1)
        return report, probe.strip() == "True"

    first, imported = validate()
    assert imported and "global batch 16 rows of 48 tokens" in first.splitlines()[0]
    again, imported = validate()
    assert again == first and not imported  # from the record
    (tmp_path / "my_recipes.py").write_text(_RECIPE.format(seq_len=40) + "# shorter rows\n")
    changed, imported = validate()
    assert imported and "global batch 16 rows of 40 tokens" in changed.splitlines()[0]
