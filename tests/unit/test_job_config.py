"""TOML job configs mirror TorchTitan's config tree; command-line overrides apply on top."""

import os

import pytest
from torchtitan.config import ConfigManager

from zephon_titan.errors import ConfigError
from zephon_titan.titan.dataloader import ZephonDataLoader
from zephon_titan.titan.job import read_job_config as load_job_config
from zephon_titan.train import parse_args

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs")


def test_cpu_debug_config():
    config = load_job_config(os.path.join(CONFIGS, "debug_cpu.toml"))
    assert isinstance(config.dataloader, ZephonDataLoader.Config)
    assert config.training.global_batch_size == config.dataloader.global_batch_size == 16
    assert [s.name for s in config.dataloader.data.sources] == ["code", "prose"]
    assert config.checkpoint.enable and config.model_spec.flavor == "debugmodel"


def test_gpu_configs_differ_only_in_parallelism_and_local_batch():
    configs = {g: load_job_config(os.path.join(CONFIGS, "llama3_1b", f"{g}gpu.toml")) for g in (8, 16, 32, 64)}
    base = configs[16]
    assert base.model_spec.flavor == "1B" and base.model_spec.model.vocab_size == 128256
    assert base.loss.loss_fn.global_vocab_size == 128256
    assert base.dataloader.data.num_lanes == 64 and base.dataloader.global_batch_size == 512
    for gpus, config in configs.items():
        assert config.parallelism.data_parallel_shard_degree == gpus
        assert config.dataloader == base.dataloader and config.training.seq_len == base.training.seq_len
        assert config.training.global_batch_size == 512 and config.checkpoint == base.checkpoint
        rows_per_gpu = 512 // gpus  # valid at its own size
        assert 64 % gpus == 0 and rows_per_gpu % config.training.local_batch_size == 0


def test_extends_overrides_table_by_table(tmp_path):
    (tmp_path / "base.toml").write_text(_OK + "[training]\nsteps = 7\nseq_len = 64\n")
    (tmp_path / "child.toml").write_text('[job]\nextends = "base.toml"\n[training]\nsteps = 9\n')
    config = load_job_config(str(tmp_path / "child.toml"))
    assert config.training.steps == 9 and config.training.seq_len == 64
    (tmp_path / "base.toml").write_text('[job]\nextends = "child.toml"\n')
    with pytest.raises(ConfigError, match="extends forms a cycle"):
        load_job_config(str(tmp_path / "child.toml"))


def test_command_line_overrides_apply_on_top_of_the_file():
    config = parse_args(
        [
            "--job.config_file",
            os.path.join(CONFIGS, "debug_cpu.toml"),
            "--training.steps",
            "3",
            "--training.global_batch_size",
            "32",
            "--dataloader.seed",
            "9",
        ]
    ).config
    assert config.training.steps == 3 and config.dataloader.data.seed == 9
    assert config.dataloader.global_batch_size == 32  # follows training.global_batch_size


def test_reachable_from_torchtitans_registry():
    config = ConfigManager().parse_args(
        ["--module", "zephon_titan.recipes", "--config", "llama3_debugmodel", "--dataloader.num_lanes", "4"]
    )
    assert isinstance(config.dataloader, ZephonDataLoader.Config) and config.dataloader.data.num_lanes == 4


def _write(tmp_path, text):
    path = tmp_path / "job.toml"
    path.write_text(text)
    return str(path)


_OK = '[model]\nmodule = "llama3"\nconfig = "llama3_debugmodel"\n[dataloader.sources.a]\npaths = ["x.jsonl"]\n'


@pytest.mark.parametrize(
    "extra, message",
    [
        ("[training]\nstesp = 3\n", r"unknown key 'stesp' in \[training\]; did you mean 'steps'\?"),
        ('[training]\nsteps = "3"\n', r"\[training\] steps must be int \(like 10\), got '3'"),
        ("[checkpoint]\nenable = 1\n", r"\[checkpoint\] enable must be bool"),
        ("[dataloader]\nnum_lanes = 0\n", r"num_lanes must be >= 1, got 0"),
    ],
)
def test_mistakes_name_the_key(tmp_path, extra, message):
    with pytest.raises(ConfigError, match=message):
        load_job_config(_write(tmp_path, _OK + extra))


def test_model_table_is_checked(tmp_path):
    with pytest.raises(ConfigError, match=r"\[model\] config = 'llama3_tiny' is not in .*choices"):
        load_job_config(_write(tmp_path, _OK.replace("llama3_debugmodel", "llama3_tiny")))
    with pytest.raises(ConfigError, match="has no \\[model\\] table"):
        load_job_config(_write(tmp_path, "[dataloader.sources.a]\npaths = ['x']\n"))


_HELD = _OK.replace('paths = ["x.jsonl"]\n', 'paths = ["x.jsonl"]\neval_fraction = 0.01\n')


def test_validator_reads_the_held_out_part_of_the_training_sources(tmp_path):
    (tmp_path / "job.toml").write_text(
        _HELD + "[dataloader]\nseed = 5\nsplit_seed = 3\nnum_workers = 2\n[training]\nglobal_batch_size = 16\n"
        "[validator]\nenable = true\nfreq = 2\nsteps = 3\n[validator.dataloader]\nnum_lanes = 4\n"
    )
    config = load_job_config(str(tmp_path / "job.toml"))
    assert (config.validator.enable, config.validator.freq, config.validator.steps) == (True, 2, 3)
    data = config.validator.dataloader.data
    assert data.split == "eval" and data.split_seed == 3 and data.seed == 5  # training's split and seed
    assert data.num_lanes == 4 and data.num_workers == 0 and data.exhaustion == "redistribute"
    assert [(s.name, s.eval_fraction) for s in data.sources] == [("a", 0.01)]
    assert config.validator.dataloader.global_batch_size == 16  # training's, unless set
    assert config.dataloader.data.split == "train"


@pytest.mark.parametrize(
    "extra, message",
    [
        ("[validator]\nenable = true\n", r"no eval data: set eval_fraction on a \[dataloader.sources.<name>\]"),
        (
            '[validator]\nenable = true\n[validator.dataloader.sources.ev]\npaths = ["e.jsonl"]\neval_fraction = 2.0\n',
            r"\[validator.dataloader.sources.ev\] eval_fraction must be <= 0.99",
        ),
        ("[validator]\nsteps = 0\n", r"\[validator\] steps must be >= 1 \(eval steps\) or -1"),
        ("[validator.dataloader]\nnum_workers = 2\n", r"num_workers is not an eval set setting"),
        ("[validator]\nfreqq = 2\n", r"unknown key 'freqq' in \[validator\]; did you mean 'freq'\?"),
    ],
)
def test_validator_mistakes_name_the_key(tmp_path, extra, message):
    (tmp_path / "job.toml").write_text(_OK + extra)
    with pytest.raises(ConfigError, match=message):
        load_job_config(str(tmp_path / "job.toml"))


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            "[validator.dataloader]\nsplit_seed = 4\n",
            r"split_seed: the held-out part .* is read with \[dataloader\]'s split",
        ),
        ('[validator]\nenable = true\n[validator.dataloader]\nexhaustion = "repeat"\n', r"never ends under"),
    ],
)
def test_eval_set_mistakes_over_held_out_data(tmp_path, extra, message):
    (tmp_path / "job.toml").write_text(_HELD + extra)
    with pytest.raises(ConfigError, match=message):
        load_job_config(str(tmp_path / "job.toml"))
